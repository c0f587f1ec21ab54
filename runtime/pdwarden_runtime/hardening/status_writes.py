"""``sticky_status``: what a status write through the hardened manager does, as a table.

SGLang writes a room's status through ``update_status``. Before the status table decides
whether a move is allowed (``STICKY_TRANSITIONS``, or ``max()`` under the emulated port),
the manager decides what the write *means*: a room opening, decode's metadata arriving
for a room that already ended, a late Bootstrapping, a failure decode must be told of.
``STATUS_WRITES`` is that whole policy, one row per (role, origin, target); ``write_for``
looks a write up and raises ``IllegalStatusWrite`` for one the table does not name (as
h11's state machine raises for an event its tables do not allow).

``StatusWriter`` runs the write the table names; a write that fails is counted and
written to the table directly, and a write that changed the room wakes its waiters.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from pdwarden_contract import OUTCOME_ABORTED, OUTCOME_DEADLINE, OUTCOME_FAILED, ROLE_DECODE, ROLE_PREFILL
from pdwarden_runtime.hardening.runtime import WHERE_PEERS, WHERE_STATUS_WRITE, RoomRuntime
from pdwarden_runtime.hardening.skip_guard import REASON_EARLY_ABORT, SkipGuard
from pdwarden_runtime.kvpoll import KVPoll, coerce
from pdwarden_runtime.status import ClosedRoom, Origin

if TYPE_CHECKING:
    from pdwarden_runtime.hardening.nixl import HardenedNixlKVManager

log = logging.getLogger(__name__)


class Write(enum.Enum):
    """What a status write means to the manager; the value is a readable name."""

    OPEN = "open"  # SGLang's opening write: the room starts its lifecycle
    # Prefill: a sender opens its room; an ABORT from decode that came first fails it at once.
    OPEN_UNLESS_ABORTED = "open_unless_aborted"
    # Prefill: decode's metadata opens the room before any sender (the leg may never come).
    OPEN_BY_METADATA = "open_by_metadata"
    # Prefill: decode's metadata for a live room: its endpoints are kept for notices.
    METADATA = "metadata"
    # Prefill: decode's metadata for a room this prefill already ended: refused, decode told.
    METADATA_AFTER_END = "metadata_after_end"
    # A non-opening write to a room with no lifecycle: max() creates it (an orphan); the
    # sticky table refuses and counts it.
    ORPHAN = "orphan"
    # A sender's Bootstrapping after decode's metadata moved the room on: normal ordering,
    # ignored (max() applies it).
    LATE_BOOTSTRAP = "late_bootstrap"
    FAIL = "fail"  # the room fails, with its outcome; a deferred bootstrap is answered
    # Prefill: as FAIL, and decode is told once no chunk can write; an ownerless room ends.
    FAIL_AND_TELL = "fail_and_tell"
    MOVE = "move"  # anything else: the status table decides (sticky or max())


class IllegalStatusWrite(LookupError):
    """A status write ``STATUS_WRITES`` names no rule for."""

    def __init__(self, role: str, origin: Origin, target: KVPoll) -> None:
        self.role, self.origin, self.target = role, origin, target
        super().__init__(
            f"no status write rule for role={role}, a room in {origin.name}, target {target.name}"
        )


# The columns of every row below, in order.
_TARGETS: Final = (
    KVPoll.Failed,
    KVPoll.Bootstrapping,
    KVPoll.WaitingForInput,
    KVPoll.Transferring,
    KVPoll.Success,
)
_CLEARED, _UNKNOWN = ClosedRoom.CLEARED, ClosedRoom.UNKNOWN
_F, _B, _W, _T, _S = _TARGETS
_OPEN, _OPEN_SENDER, _OPEN_META = Write.OPEN, Write.OPEN_UNLESS_ABORTED, Write.OPEN_BY_METADATA
_META, _META_LATE, _ORPHAN = Write.METADATA, Write.METADATA_AFTER_END, Write.ORPHAN
_LATE_B, _FAIL, _TELL, _MOVE = Write.LATE_BOOTSTRAP, Write.FAIL, Write.FAIL_AND_TELL, Write.MOVE

# Per role, origin -> the write for each target (Failed, Bootstrapping, WaitingForInput,
# Transferring, Success). A room with no lifecycle is CLEARED (its tombstone is remembered)
# or UNKNOWN. Only Bootstrapping and WaitingForInput open a room (``kvpoll.OPENING``).
_ROWS: Final[dict[str, dict[Origin, tuple[Write, Write, Write, Write, Write]]]] = {
    ROLE_PREFILL: {
        #          Failed   Bootstr.      WaitingForInput  Transf.  Success
        _CLEARED: (_ORPHAN, _OPEN_SENDER, _META_LATE, _ORPHAN, _ORPHAN),
        _UNKNOWN: (_ORPHAN, _OPEN_SENDER, _OPEN_META, _ORPHAN, _ORPHAN),
        _B: (_TELL, _MOVE, _META, _MOVE, _MOVE),
        _W: (_TELL, _LATE_B, _META, _MOVE, _MOVE),
        _T: (_TELL, _LATE_B, _META, _MOVE, _MOVE),
        _F: (_TELL, _LATE_B, _META, _MOVE, _MOVE),  # the table refuses the non-terminal ones
        _S: (_TELL, _LATE_B, _META, _MOVE, _MOVE),
    },
    ROLE_DECODE: {
        #          Failed   Bootstr. WaitingForInput  Transf.  Success
        _CLEARED: (_ORPHAN, _OPEN, _OPEN, _ORPHAN, _ORPHAN),
        _UNKNOWN: (_ORPHAN, _OPEN, _OPEN, _ORPHAN, _ORPHAN),
        _B: (_FAIL, _MOVE, _MOVE, _MOVE, _MOVE),
        _W: (_FAIL, _LATE_B, _MOVE, _MOVE, _MOVE),
        _T: (_FAIL, _LATE_B, _MOVE, _MOVE, _MOVE),
        _F: (_FAIL, _LATE_B, _MOVE, _MOVE, _MOVE),
        _S: (_FAIL, _LATE_B, _MOVE, _MOVE, _MOVE),
    },
}

STATUS_WRITES: Final[dict[tuple[str, Origin, KVPoll], Write]] = {
    (role, origin, target): write
    for role, rows in _ROWS.items()
    for origin, row in rows.items()
    for target, write in zip(_TARGETS, row, strict=True)
}


def write_for(role: str, origin: Origin, target: KVPoll) -> Write:
    """The write ``STATUS_WRITES`` names; IllegalStatusWrite if it names none."""
    write = STATUS_WRITES.get((role, origin, target))
    if write is None:
        raise IllegalStatusWrite(role, origin, target)
    return write


def outcome_for(reason: str | None) -> str:
    """The contract outcome of a failed room, from SGLang's/pdwarden's failure reason."""
    text = (reason or "").lower()
    if "deadline" in text or "timed out" in text:  # SGLang's bootstrap and waiting timeouts
        return OUTCOME_DEADLINE
    if "abort" in text:
        return OUTCOME_ABORTED
    return OUTCOME_FAILED


class StatusWriter:
    """The hardened manager's ``update_status``: each write as ``STATUS_WRITES`` names it."""

    def __init__(self, mgr: HardenedNixlKVManager, stock: Any, rt: RoomRuntime, skip: SkipGuard) -> None:
        self._mgr = mgr
        self._stock = stock  # SGLang's methods of mgr (what super() reaches)
        self._rt = rt
        self._skip = skip
        self._writes: dict[Write, Callable[[int, KVPoll], None]] = {
            Write.OPEN: self._open,
            Write.OPEN_UNLESS_ABORTED: self._open_unless_aborted,
            Write.OPEN_BY_METADATA: self._open_by_metadata,
            Write.METADATA: self._metadata,
            Write.METADATA_AFTER_END: self._metadata_after_end,
            Write.ORPHAN: self._move,
            Write.LATE_BOOTSTRAP: self._late_bootstrap,
            Write.FAIL: self._fail,
            Write.FAIL_AND_TELL: self._fail_and_tell,
            Write.MOVE: self._move,
        }

    def update_status(self, room: int, status: Any) -> None:
        target = coerce(status)  # a bad status is SGLang's error: it propagates as before
        table = self._rt.table
        before = table.get(room)
        try:
            self.write(room, target)  # dict lookups: per-chunk path
        except Exception:
            self._rt.count_error(WHERE_STATUS_WRITE)
            log.exception(
                "pdwarden: status write %s -> %s failed; writing the table directly", room, target.name
            )
            with self._rt.guard(WHERE_STATUS_WRITE):
                table.update(room, target)
        finally:
            # Listeners wake the request waiting on the room: only a write that changed
            # its status can satisfy it. The transfer worker repeats Transferring once per
            # chunk; waking the engine's event loop for each cost the worker a thread
            # switch per chunk.
            if table.get(room) is not before:
                self._rt.notify(room)

    def write(self, room: int, target: KVPoll) -> None:
        table = self._rt.table
        origin: Origin | None = table.get(room)
        if origin is None:
            origin = _CLEARED if table.is_cleared(room) else _UNKNOWN
        self._writes[write_for(self._rt.role, origin, target)](room, target)

    # --- the writes ------------------------------------------------------------------------
    def _open(self, room: int, target: KVPoll) -> None:
        self._rt.ledger.settle(room)
        self._stock.update_status(room, target)  # SGLang's opening side effects

    def _open_unless_aborted(self, room: int, target: KVPoll) -> None:
        self._open(room, target)
        if self._skip.aborted_early(room):
            self._mgr.record_failure(room, REASON_EARLY_ABORT)
            self.write(room, KVPoll.Failed)

    def _open_by_metadata(self, room: int, target: KVPoll) -> None:
        self._metadata_seen(room)
        self._skip.owners.opened_by_metadata(room)
        self._open_unless_aborted(room, target)

    def _metadata(self, room: int, target: KVPoll) -> None:
        self._metadata_seen(room)
        self._move(room, target)

    def _metadata_after_end(self, room: int, target: KVPoll) -> None:
        self._metadata_seen(room)
        self._skip.metadata_after_end(room)

    def _metadata_seen(self, room: int) -> None:
        """The bootstrap thread: decode's metadata for the room is complete."""
        mgr = self._mgr
        self._rt.ledger.remember_targets(room, mgr._room_notify_targets(room))
        with self._rt.guard(WHERE_PEERS):
            infos = (mgr.transfer_infos.get(room) or {}).values()
            self._rt.metrics.peers.bind(room, [i.endpoint for i in infos if not i.is_dummy])

    def _late_bootstrap(self, room: int, target: KVPoll) -> None:
        if self._rt.table.mode == "legacy":
            self._rt.table.update(room, target)

    def _fail(self, room: int, target: KVPoll) -> None:
        self._failed(room, target)

    def _fail_and_tell(self, room: int, target: KVPoll) -> None:
        reason = self._failed(room, target)
        self._skip.room_failed(room, reason or "KV transfer failed")
        self._skip.release_orphan(room)

    def _failed(self, room: int, target: KVPoll) -> str | None:
        """Write Failed with the outcome its recorded reason names; return that reason."""
        mgr = self._mgr
        reason: str | None = mgr.failure_records.get(room)
        applied = self._rt.table.update(room, target, outcome=outcome_for(reason))
        if applied and mgr.deferred_bootstrap is not None:
            mgr._notify_bootstrap(room, mgr.deferred_bootstrap.fail(room))
        return reason

    def _move(self, room: int, target: KVPoll) -> None:
        self._rt.table.update(room, target)

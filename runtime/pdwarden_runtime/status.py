"""The KV room status table: terminal-sticky transitions, refusals counted.

Why: SGLang keeps each room's status as an int and (in older releases) let a write win
with ``max(current, new)``. Failed sorts lowest, so a transfer worker's late Transferring
write after an ABORT resurrected a Failed room; the worker then skipped the room's last
chunk (its transfer info was gone) and the room stayed Transferring forever, silently.

``RoomStatusTable(mode="sticky")`` makes that impossible: every move is looked up in
``STICKY_TRANSITIONS`` below (the whole policy, one row per (from, to) pair), Failed and
Success are terminal, and every refused write is counted by (from, to) so the race shows
up in metrics instead of disappearing. ``mode="legacy"`` reproduces the old ``max()``
rule exactly; it exists only so tests and benchmarks can show the bug side by side.

A room's lifecycle: ``open()`` starts it (Bootstrapping or WaitingForInput only),
``update()`` moves it, ``clear()`` ends it. In sticky mode nothing but ``open()`` creates
a room, so a late write after ``clear()`` is refused, never a resurrection.
"""

from __future__ import annotations

import enum
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Final, Literal, Protocol

from pdwarden_contract import OUTCOME_FAILED, OUTCOME_SUCCESS, OUTCOMES
from pdwarden_runtime.kvpoll import BY_VALUE, OPENING, KVPoll, coerce

Mode = Literal["sticky", "legacy"]
MODES: Final = ("sticky", "legacy")

# How many cleared rooms are remembered (LRU) to tell "a late write after clear()" from
# "a write to a room never opened here". Each entry is one int key in an OrderedDict,
# roughly 100 bytes, so the default bounds the memory at about 1.6 MB per table. A room
# whose tombstone was evicted is still refused (sticky mode never creates a room from a
# non-opening write); its refusal is only classified "unknown" instead of "cleared".
DEFAULT_TOMBSTONES: Final = 16384


class Rule(enum.Enum):
    """What the sticky table does with a write; the value is a readable name."""

    ADVANCE = "advance"  # forward along the lifecycle
    REPEAT = "repeat"  # the same status again: applied, nothing changes
    FAIL = "fail"  # a live room fails (error, ABORT, deadline): always allowed
    FAILURE_OVERRIDES_SUCCESS = "failure_overrides_success"  # the one named exception
    REFUSE_REGRESSION = "refuse_regression"  # back to an earlier non-terminal status
    REFUSE_TERMINAL = "refuse_terminal"  # leaving Failed or Success

    @property
    def applies(self) -> bool:
        return self in _APPLYING_RULES


_APPLYING_RULES: Final = frozenset({Rule.ADVANCE, Rule.REPEAT, Rule.FAIL, Rule.FAILURE_OVERRIDES_SUCCESS})

F, B, W, T, S = (
    KVPoll.Failed,
    KVPoll.Bootstrapping,
    KVPoll.WaitingForInput,
    KVPoll.Transferring,
    KVPoll.Success,
)

# The whole sticky policy, every (from, to) pair. Principle: never refuse a write INTO a
# terminal status from a live room (refusing one is how a room would wedge), never let a
# write OUT of a terminal status through (that is the resurrection), and absorb
# regressions as the old max() did, but count them.
STICKY_TRANSITIONS: Final[dict[tuple[KVPoll, KVPoll], Rule]] = {
    # --- from Bootstrapping -----------------------------------------------------------
    (B, B): Rule.REPEAT,
    (B, W): Rule.ADVANCE,
    # Skipping WaitingForInput: max() allowed it and SGLang callers rely on forward
    # jumps; refusing a forward move could leave the room short of a terminal status.
    (B, T): Rule.ADVANCE,
    (B, S): Rule.ADVANCE,
    (B, F): Rule.FAIL,  # bootstrap timeout, dead peer, ABORT before metadata
    # --- from WaitingForInput ---------------------------------------------------------
    # A stale bootstrap write after decode's metadata arrived; max() ignored it silently.
    (W, B): Rule.REFUSE_REGRESSION,
    (W, W): Rule.REPEAT,
    (W, T): Rule.ADVANCE,
    (W, S): Rule.ADVANCE,  # decode receivers and dummy ranks conclude without Transferring
    (W, F): Rule.FAIL,
    # --- from Transferring ------------------------------------------------------------
    (T, B): Rule.REFUSE_REGRESSION,
    # A late bootstrap/metadata message after the first chunk went out.
    (T, W): Rule.REFUSE_REGRESSION,
    (T, T): Rule.REPEAT,  # every chunk writes Transferring
    (T, S): Rule.ADVANCE,
    (T, F): Rule.FAIL,  # transfer error, ABORT mid-transfer, deadline
    # --- from Failed: terminal, nothing leaves it until clear() -------------------------
    (F, B): Rule.REFUSE_TERMINAL,
    (F, W): Rule.REFUSE_TERMINAL,
    # The emulated port's race: a worker finishing a chunk after ABORT wrote Failed. Under max()
    # this resurrected the room and it then stayed Transferring forever.
    (F, T): Rule.REFUSE_TERMINAL,
    # A worker's completion arriving after the room failed: the failure stands.
    (F, S): Rule.REFUSE_TERMINAL,
    (F, F): Rule.REPEAT,  # ABORT and a transfer error both report the failure
    # --- from Success: terminal, with one named exception ------------------------------
    (S, B): Rule.REFUSE_TERMINAL,
    (S, W): Rule.REFUSE_TERMINAL,
    (S, T): Rule.REFUSE_TERMINAL,  # a straggler chunk write after the last chunk concluded
    (S, S): Rule.REPEAT,
    # FAILURE_OVERRIDES_SUCCESS (named exception to stickiness). A failure recorded after
    # Success (decode reports the aux/state transfer failed, a checksum mismatch, a rank
    # that failed after another rank's Success) means the KV the consumer would use may
    # be incomplete. Failing closed costs one retried request; keeping Success could serve
    # wrong output. Both statuses are terminal, so this move cannot wedge a room, and it is
    # what SGLang 0.5.23's update_status does (callers that must protect Success, like its
    # ABORT handler, check first). The room is not concluded twice: outcome counters keep
    # the first conclusion; the table counts these moves in ``overrides()``.
    (S, F): Rule.FAILURE_OVERRIDES_SUCCESS,
}

# The same policy compiled for the hot path: _STICKY_APPLIES[from][to] -> bool.
_STICKY_APPLIES: Final[tuple[tuple[bool, ...], ...]] = tuple(
    tuple(STICKY_TRANSITIONS[(src, dst)].applies for dst in KVPoll) for src in KVPoll
)


class ClosedRoom(enum.Enum):
    """Where a refused write came from when the room had no open lifecycle."""

    CLEARED = "cleared"  # clear() ended it (its tombstone is still remembered)
    UNKNOWN = "unknown"  # never opened here, or its tombstone was evicted

    @property
    def label(self) -> str:
        return self.value


Origin = KVPoll | ClosedRoom


class IllegalTransition(ValueError):
    """A write the sticky table does not allow (raised by ``strict``/``check``/``open``)."""

    def __init__(self, room: int | None, origin: Origin, target: KVPoll, reason: str) -> None:
        self.room = room
        self.origin = origin
        self.target = target
        where = f"room {room}: " if room is not None else ""
        super().__init__(f"{where}{origin.name} -> {target.name} is not allowed: {reason}")


class LifecycleObserver(Protocol):
    """Told about lifecycle edges (not every write). Called with the table's lock held:
    implementations must be quick and must not call back into the table."""

    def opened(self, room: int) -> None:
        """The room became live and non-terminal (opened, or resurrected in legacy mode)."""

    def concluded(self, room: int, status: KVPoll, outcome: str) -> None:
        """A live non-terminal room reached Failed or Success."""

    def abandoned(self, room: int) -> None:
        """A live non-terminal room was cleared without concluding."""

    def entered(self, room: int, status: KVPoll) -> None:
        """A live room entered a non-terminal state past Bootstrapping (waiting for or
        moving KV): the moment a transfer deadline starts to mean stuck, not queued."""


RefusedCallback = Callable[[int, Origin, KVPoll], None]

_NON_TERMINAL: Final = (B, W, T)
NON_TERMINAL: Final = _NON_TERMINAL


def check(origin: KVPoll | int, target: KVPoll | int) -> Rule:
    """The sticky rule for a move; raise IllegalTransition where the table refuses it."""
    src, dst = coerce(origin), coerce(target)
    rule = STICKY_TRANSITIONS[(src, dst)]
    if not rule.applies:
        raise IllegalTransition(None, src, dst, rule.value)
    return rule


class RoomStatusTable:
    """Thread-safe status per room; ``mode`` picks the sticky policy or the legacy max()."""

    def __init__(
        self,
        mode: Mode = "sticky",
        *,
        tombstones: int = DEFAULT_TOMBSTONES,
        on_refused: RefusedCallback | None = None,
        observer: LifecycleObserver | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown status table mode {mode!r}; expected one of {MODES}")
        if tombstones < 0:
            raise ValueError(f"tombstones must be >= 0, got {tombstones}")
        self.mode: Mode = mode
        self._legacy = mode == "legacy"
        self._lock = threading.Lock()
        self._rooms: dict[int, KVPoll] = {}
        # monotonic time each live room entered its current status (oldest-in-state ages)
        self._since: dict[int, float] = {}
        self._tombstones: OrderedDict[int, None] = OrderedDict()
        self._max_tombstones = tombstones
        # refusal counts indexed [from][to]; rooms without a lifecycle counted apart
        self._refused = [[0] * len(KVPoll) for _ in KVPoll]
        self._refused_closed = {origin: [0] * len(KVPoll) for origin in ClosedRoom}
        self._overrides = 0
        self.on_refused = on_refused
        self._observer = observer

    # --- wiring -------------------------------------------------------------------------
    @property
    def lock(self) -> threading.Lock:
        """The table's one lock; observers take it to read their own state consistently."""
        return self._lock

    def attach(self, observer: LifecycleObserver) -> None:
        with self._lock:
            if self._observer is not None and self._observer is not observer:
                raise ValueError("this status table already has a lifecycle observer")
            self._observer = observer

    # --- writes -------------------------------------------------------------------------
    def open(self, room: int, status: KVPoll | int) -> bool:
        """Start the room's lifecycle with Bootstrapping or WaitingForInput.

        A room that is already live is written as by ``update`` (the table decides). A
        cleared room starts a fresh lifecycle: ``open`` is the caller saying "a new
        request owns this room". Raises IllegalTransition for any other status."""
        target = coerce(status)
        if target not in OPENING:
            raise IllegalTransition(
                room,
                ClosedRoom.UNKNOWN,
                target,
                "only Bootstrapping or WaitingForInput may start a lifecycle",
            )
        if self._legacy:
            return self._update_legacy(room, target, None)
        with self._lock:
            current = self._rooms.get(room)
            if current is None:
                self._rooms[room] = target
                self._since[room] = time.monotonic()
                if self._tombstones:
                    self._tombstones.pop(room, None)
                if self._observer is not None:
                    self._observer.opened(room)
                    if target is not B:
                        self._observer.entered(room, target)
                return True
            if current is target:
                return True
            if _STICKY_APPLIES[current][target]:
                self._apply_locked(room, current, target, None)
                return True
            self._refused[current][target] += 1
        callback = self.on_refused
        if callback is not None:
            callback(room, current, target)
        return False

    def update(self, room: int, status: KVPoll | int, outcome: str | None = None) -> bool:
        """Write a status; True if applied (a same-status write counts as applied).

        ``outcome`` names why a write of Failed concludes the room (``aborted``,
        ``deadline``; default ``failed``); it is ignored otherwise. A refused write is
        counted and reported to ``on_refused``; it never raises."""
        try:
            target = BY_VALUE.get(status)
        except TypeError:  # unhashable garbage
            target = None
        if target is None:
            target = coerce(status)  # raises ValueError naming the bad value
        if self._legacy:
            return self._update_legacy(room, target, outcome)
        with self._lock:
            current = self._rooms.get(room)
            if current is not None:
                if current is target:
                    return True
                if _STICKY_APPLIES[current][target]:
                    self._apply_locked(room, current, target, outcome)
                    return True
                self._refused[current][target] += 1
                origin: Origin = current
            else:
                origin = ClosedRoom.CLEARED if room in self._tombstones else ClosedRoom.UNKNOWN
                self._refused_closed[origin][target] += 1
        callback = self.on_refused
        if callback is not None:
            callback(room, origin, target)
        return False

    def strict(self, room: int, status: KVPoll | int, outcome: str | None = None) -> None:
        """``update`` for callers that want a refusal to raise IllegalTransition (still counted)."""
        target = coerce(status)
        if not self.update(room, target, outcome):
            live = self.get(room)
            origin: Origin
            if live is not None:
                origin = live
            else:
                origin = ClosedRoom.CLEARED if self.is_cleared(room) else ClosedRoom.UNKNOWN
            reason = (
                STICKY_TRANSITIONS[(origin, target)].value
                if isinstance(origin, KVPoll)
                else "the room has no open lifecycle"
            )
            raise IllegalTransition(room, origin, target, reason)

    def clear(self, room: int) -> None:
        """End the room's lifecycle; later writes to it are refused until it is opened again."""
        with self._lock:
            current = self._rooms.pop(room, None)
            self._since.pop(room, None)
            if current is None:
                return
            if current in _NON_TERMINAL and self._observer is not None:
                self._observer.abandoned(room)
            if not self._legacy and self._max_tombstones:
                self._tombstones[room] = None
                self._tombstones.move_to_end(room)
                if len(self._tombstones) > self._max_tombstones:
                    self._tombstones.popitem(last=False)

    def fail_rooms(self, choose: Callable[[], Iterable[int]], outcome: str) -> list[int]:
        """Fail, atomically, the live non-terminal rooms ``choose()`` names (called under
        the lock, so the choice and the writes see one state); return the rooms failed.
        Terminal, cleared or unknown rooms are skipped, never touched."""
        failed: list[int] = []
        with self._lock:
            for room in list(choose()):
                current = self._rooms.get(room)
                if current is not None and current in _NON_TERMINAL:
                    self._apply_locked(room, current, KVPoll.Failed, outcome)
                    failed.append(room)
        return failed

    # --- reads --------------------------------------------------------------------------
    def get(self, room: int) -> KVPoll | None:
        return self._rooms.get(room)

    def is_cleared(self, room: int) -> bool:
        """True if clear() ended this room recently (its tombstone is remembered)."""
        with self._lock:
            return room in self._tombstones

    def oldest_in_state(self) -> dict[KVPoll, float]:
        """Per non-terminal status with a room in it: seconds since the oldest room in it
        entered it."""
        now = time.monotonic()
        oldest: dict[KVPoll, float] = {}
        with self._lock:
            for room, status in self._rooms.items():
                if status in _NON_TERMINAL:
                    since = self._since.get(room, now)
                    if since < oldest.get(status, now):
                        oldest[status] = since
        return {status: max(0.0, now - since) for status, since in oldest.items()}

    def snapshot(self) -> dict[int, KVPoll]:
        with self._lock:
            return dict(self._rooms)

    def counts(self) -> dict[KVPoll, int]:
        """Rooms per status, every status present (0 when none)."""
        result = dict.fromkeys(KVPoll, 0)
        for status in self.snapshot().values():
            result[status] += 1
        return result

    def refused(self) -> dict[tuple[Origin, KVPoll], int]:
        """Refused writes by (from, to), nonzero only. ``from`` is a KVPoll for a live room,
        a ClosedRoom for a room with no open lifecycle."""
        with self._lock:
            result: dict[tuple[Origin, KVPoll], int] = {}
            for src in KVPoll:
                for dst in KVPoll:
                    if self._refused[src][dst]:
                        result[(src, dst)] = self._refused[src][dst]
            for origin, row in self._refused_closed.items():
                for dst in KVPoll:
                    if row[dst]:
                        result[(origin, dst)] = row[dst]
            return result

    def overrides(self) -> int:
        """How many times FAILURE_OVERRIDES_SUCCESS turned a Success into Failed."""
        return self._overrides

    def __len__(self) -> int:
        return len(self._rooms)

    def __contains__(self, room: object) -> bool:
        return room in self._rooms

    def __getitem__(self, room: int) -> KVPoll:
        """Dict-style read, for code written against SGLang's ``request_status`` dict."""
        return self._rooms[room]

    def __iter__(self) -> Iterator[int]:
        return iter(self.snapshot())

    # --- internals ------------------------------------------------------------------------
    def _apply_locked(self, room: int, current: KVPoll, target: KVPoll, outcome: str | None) -> None:
        self._rooms[room] = target
        self._since[room] = time.monotonic()
        if (target is W or target is T) and self._observer is not None:
            self._observer.entered(room, target)
        if current is KVPoll.Success:  # only FAILURE_OVERRIDES_SUCCESS leaves Success
            self._overrides += 1
        elif (target is KVPoll.Failed or target is KVPoll.Success) and self._observer is not None:
            self._observer.concluded(room, target, _outcome_of(target, outcome))

    def _update_legacy(self, room: int, target: KVPoll, outcome: str | None) -> bool:
        """SGLang's old update_status, exactly: any write creates a missing room, Failed
        always overwrites, anything else keeps max(current, new). Nothing is refused or
        counted: the old rule absorbed every write silently, which is the point."""
        observer = self._observer
        with self._lock:
            current = self._rooms.get(room)
            if current is None:
                self._rooms[room] = target
                self._since[room] = time.monotonic()
                if observer is not None and target in _NON_TERMINAL:
                    observer.opened(room)
                    if target is not B:
                        observer.entered(room, target)
                return True
            new = KVPoll.Failed if target is KVPoll.Failed else max(current, target)
            self._rooms[room] = new
            if new is not current:
                self._since[room] = time.monotonic()
                if observer is not None and (new is W or new is T):
                    observer.entered(room, new)
            if observer is not None:
                was_live, is_live = current in _NON_TERMINAL, new in _NON_TERMINAL
                if was_live and not is_live:
                    observer.concluded(room, new, _outcome_of(new, outcome))
                elif is_live and not was_live:
                    observer.opened(room)  # the resurrection
            return new is target


def _outcome_of(status: KVPoll, outcome: str | None) -> str:
    if status is KVPoll.Success:
        return OUTCOME_SUCCESS
    if outcome is None:
        return OUTCOME_FAILED
    if outcome not in OUTCOMES or outcome == OUTCOME_SUCCESS:
        # Bad input must not crash a transfer thread: record it as a plain failure.
        return OUTCOME_FAILED
    return outcome


__all__ = [
    "DEFAULT_TOMBSTONES",
    "MODES",
    "STICKY_TRANSITIONS",
    "ClosedRoom",
    "IllegalTransition",
    "KVPoll",
    "LifecycleObserver",
    "Mode",
    "Origin",
    "RoomStatusTable",
    "Rule",
    "check",
]

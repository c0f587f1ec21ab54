"""``no_silent_skip`` on a prefill: a room SGLang would drop without a word is failed aloud.

SGLang's transfer worker skips a chunk whose room was cleared, failed or lost its transfer
info, ``add_transfer_request`` drops a chunk of a room without transfer info, and an ABORT
or decode's metadata for a room this prefill has not (or no longer) opened is forgotten: in
each case decode waits for its timeout. Here such a room is concluded Failed and decode is
told ``KV_STATUS Failed`` exactly once, and only when no chunk of the room can still write
into its pages (``RoomLedger``). A failed room nothing owns (``RoomOwners``) is ended, and
an ABORT that came first (``EarlyAborts``) fails the room when it opens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from sglang.srt.disaggregation.common.conn import AbortNotification

from pdwarden_runtime.hardening.config import Fix
from pdwarden_runtime.hardening.early_aborts import EarlyAborts
from pdwarden_runtime.hardening.faults.fault_set import FaultSet
from pdwarden_runtime.hardening.faults.hooks import AbortPaths, is_abort
from pdwarden_runtime.hardening.room_owners import RoomOwners
from pdwarden_runtime.hardening.runtime import WHERE_ABORT, WHERE_ENQUEUE, WHERE_STATUS_NOTICE, RoomRuntime
from pdwarden_runtime.kvpoll import KVPoll

if TYPE_CHECKING:
    from pdwarden_runtime.hardening.nixl import HardenedNixlKVManager

REASON_SKIPPED: Final = "room {} before its chunk was sent (pdwarden: skipped chunk concluded Failed)"
REASON_EARLY_ABORT: Final = "Aborted by decode before this prefill opened the room"
REASON_METADATA_AFTER_END: Final = "prefill room ended before decode's metadata arrived"


class SkipGuard:
    """The prefill's room conclusions: failure notices, ownerless rooms, early ABORTs."""

    def __init__(self, mgr: HardenedNixlKVManager, stock: Any, rt: RoomRuntime, faults: FaultSet) -> None:
        self._mgr = mgr
        self._stock = stock  # SGLang's methods of mgr (what super() reaches)
        self._rt = rt
        self._faults = faults
        self.owners = RoomOwners()
        self.early_aborts = EarlyAborts()

    @property
    def _on(self) -> bool:
        return self._rt.config.has(Fix.NO_SILENT_SKIP)

    # --- failure notices -----------------------------------------------------------------
    def room_failed(self, room: int, reason: str) -> None:
        if not self._on:
            return
        self._rt.ledger.failed(room, reason)
        self.send_failure_notice(room)

    def send_failure_notice(self, room: int) -> None:
        if not self._on:
            return
        claim = self._rt.ledger.claim_failure_notice(room)
        if claim is None:
            return
        targets, reason = claim
        self._rt.failure_notices += 1
        self._stock.send_kv_status_message(
            targets=targets, bootstrap_room=room, status=KVPoll.Failed, failure_reason=reason
        )

    def status_message(
        self, targets: list[tuple[str, int]], room: int, status: Any, failure_reason: str | None
    ) -> None:
        """SGLang tells decode a room's status: a terminal one is the room's notice."""
        with self._rt.guard(WHERE_STATUS_NOTICE):
            if targets and int(status) in (KVPoll.Failed, KVPoll.Success):
                self._rt.ledger.told(room)
        self._stock.send_kv_status_message(
            targets=targets, bootstrap_room=room, status=status, failure_reason=failure_reason
        )

    def room_idle(self, room: int) -> None:
        """No chunk or quarantined handle of the room is left: nothing can write into its
        decode pages any more, so what waited for that goes out now."""
        self.send_failure_notice(room)
        if self._mgr.enable_deferred_decode_kv_release:
            # SGLang tried the drain ACK while a chunk or handle was still out; no one would
            # try again. Once per idle room, never while a handle may write.
            self._mgr._maybe_ack_drained_abort(room)
        self._rt.ledger.settle(room)
        self.drop_leftovers(room)

    def deadline_failed(self, room: int, reason: str) -> None:
        """The inflight deadline failed the room: decode is told as for any failure."""
        self._rt.ledger.remember_targets(room, self._mgr._room_notify_targets(room))
        self.room_failed(room, reason)
        self.release_orphan(room)

    # --- rooms this prefill does not (or no longer) hold ---------------------------------
    def metadata_after_end(self, room: int) -> None:
        """Decode's metadata arrived for a room this prefill already ended: SGLang would
        open an orphan room and keep its transfer info forever; decode would wait for its
        timeout. Refuse the write, drop the info, and tell decode."""
        mgr = self._mgr
        self._rt.table.update(room, KVPoll.WaitingForInput)  # refused, counted
        mgr.transfer_infos.pop(room, None)
        mgr.req_to_decode_prefix_len.pop(room, None)
        if self._on:
            self._rt.ledger.failed(room, REASON_METADATA_AFTER_END)
            self.send_failure_notice(room)
        self._rt.ledger.cleared(room)

    def release_orphan(self, room: int) -> None:
        """A failed prefill room that no request owns (decode's metadata opened it; the
        prefill leg never came, its client having left first) would be held forever:
        nothing will read its failure or clear it. Prefill gave it no pages, so no write
        can land from it: end it now (decode was told), and keep it as an early abort so
        a prefill leg that comes after all fails at once."""
        if not self.owners.ownerless(room):
            return
        if self._rt.table.get(room) is not KVPoll.Failed:
            return
        mgr = self._mgr
        self._rt.table.clear(room)
        mgr.transfer_infos.pop(room, None)
        mgr.req_to_decode_prefix_len.pop(room, None)
        with mgr.failure_lock:
            mgr.failure_records.pop(room, None)
        self.early_aborts.remember(room)
        self.room_cleared(room)

    def room_cleared(self, room: int) -> None:
        self.owners.cleared(room)
        self._rt.ledger.cleared(room)
        self.drop_leftovers(room)

    def drop_leftovers(self, room: int) -> None:
        """A cleared room no worker holds: drop SGLang's per-room entries that its
        cleanup can miss when the scheduler clears the room before the worker's last
        check (a zero ``_staging_outstanding`` entry per room otherwise accumulates)."""
        if room in self._rt.table or not self._rt.ledger.idle(room):
            return
        outstanding = self._mgr._staging_outstanding
        if outstanding.get(room, 1) <= 0:
            outstanding.pop(room, None)

    # --- chunks SGLang would skip or drop ------------------------------------------------
    def chunk_taken(self, room: int) -> None:
        """A worker took a chunk of the room; if SGLang's guards make it skip the chunk
        next, make the skip conclude the room."""
        if not self._on:
            return
        mgr = self._mgr
        status = self._rt.table.get(room)
        if status is None:
            what = "was cleared"
        elif status is KVPoll.Failed:
            what = "failed"
        elif mgr.transfer_infos.get(room) is None:
            what = "lost its transfer info"
        else:
            return
        self._rt.silent_skips_concluded += 1
        reason = mgr.failure_records.get(room) or REASON_SKIPPED.format(what)
        if status is not None and status is not KVPoll.Failed:
            mgr.record_failure(room, reason)
            mgr.update_status(room, KVPoll.Failed)
        else:
            self._rt.ledger.failed(room, reason)

    def add_transfer_request(self, room: int, *args: Any, **kwargs: Any) -> Any:
        with self._rt.guard(WHERE_ENQUEUE):
            self._refuse_silent_drop(room)
        return self._stock.add_transfer_request(room, *args, **kwargs)

    def _refuse_silent_drop(self, room: int) -> None:
        """SGLang drops a chunk of a room without transfer info without a word. For a
        live room whose decode metadata was seen (so not a dummy rank), that chunk would
        never be sent and the room would wait forever: fail the room instead."""
        mgr = self._mgr
        if not self._on or room in mgr.transfer_infos:
            return
        status = self._rt.table.get(room)
        if status is None or status in (KVPoll.Failed, KVPoll.Success):
            return
        if not self._rt.ledger.has_targets(room):
            return
        self._rt.silent_skips_concluded += 1
        mgr.record_failure(room, REASON_SKIPPED.format("lost its transfer info"))
        mgr.update_status(room, KVPoll.Failed)

    # --- ABORTs from decode ----------------------------------------------------------------
    def abort_message(self, msg: list[bytes]) -> bool:
        """SGLang's ABORT handler, with early ABORTs kept (and the active fault's hooks)."""
        paths = AbortPaths(
            remember_early=lambda: self._remember_early_abort_guarded(msg),
            handle=lambda: bool(self._stock._handle_abort_notification(msg)),
            drop_transfer_info=lambda room: self._mgr.transfer_infos.pop(room, None),
        )
        return self._faults.active().abort_message(msg, paths)

    def _remember_early_abort_guarded(self, msg: list[bytes]) -> None:
        with self._rt.guard(WHERE_ABORT):
            self._remember_early_abort(msg)

    def _remember_early_abort(self, msg: list[bytes]) -> None:
        """An ABORT for a room this prefill has not opened is kept (``EarlyAborts``)."""
        if not self._on or not is_abort(msg):
            return
        notification = AbortNotification.from_zmq(msg)
        if notification is None:
            return
        room = notification.room
        if room in self._rt.table or self._rt.table.is_cleared(room):
            return
        self.early_aborts.remember(room)

    def aborted_early(self, room: int) -> bool:
        """Whether decode's ABORT came before the room opened (taken once)."""
        return self.early_aborts.take(room)

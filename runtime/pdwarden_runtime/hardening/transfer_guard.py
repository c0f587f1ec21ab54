"""``transfer_deadline`` on a prefill: stalled handles are quarantined, never reported settled.

SGLang's ``_await_handles`` waits forever while every handle stays in PROC (a stalled
peer). Here it stops waiting past the transfer deadline, but a released WRITE could still
land, so the handles go to ``HandleQuarantine`` and the batch is reported unsettled: SGLang's
own failure path fails the room (the worker moves on) and keeps the chunk counted. Decode's
KV_STATUS and drain ACK go out only once the quarantine saw every handle end (DONE, ERR, or
its peer disconnected); until then later chunks for the same decode peer fail before
anything is posted (``StalledPeers``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

from sglang.srt.disaggregation.nixl.conn import NIXL_ERR_SETTLE_POLL_S, NIXL_ERR_SETTLE_TIMEOUT_S

from pdwarden_runtime.hardening.config import Fix
from pdwarden_runtime.hardening.faults.fault_set import FaultSet
from pdwarden_runtime.hardening.handle_wait import WaitLimits, await_handles
from pdwarden_runtime.hardening.quarantine import HandleQuarantine
from pdwarden_runtime.hardening.runtime import WHERE_QUARANTINE, WHERE_QUARANTINE_SETTLED, RoomRuntime
from pdwarden_runtime.hardening.skip_guard import SkipGuard
from pdwarden_runtime.hardening.stalled_peers import StalledPeers
from pdwarden_runtime.hardening.worker_queues import ChunkSlot
from pdwarden_runtime.kvpoll import KVPoll

if TYPE_CHECKING:
    from pdwarden_runtime.hardening.nixl import HardenedNixlKVManager

log = logging.getLogger(__name__)

REASON_PEER_STALLED: Final = (
    "transfer deadline: decode peer {} has a stalled transfer (quarantined); failed before sending"
)
# The quarantine's room for handles whose chunk pdwarden could not identify: kept and polled
# like any other (they may still write), never reported for a room.
UNKNOWN_ROOM: Final = -1


class TransferGuard:
    """The prefill's handle deadline, quarantine and the drain-ACK rules that follow from it."""

    def __init__(
        self,
        mgr: HardenedNixlKVManager,
        stock: Any,
        rt: RoomRuntime,
        slot: ChunkSlot,
        faults: FaultSet,
        skip: SkipGuard,
    ) -> None:
        self._mgr = mgr
        self._stock = stock  # SGLang's methods of mgr (what super() reaches)
        self._rt = rt
        self._slot = slot
        self._faults = faults
        self._skip = skip
        self.stalled_peers = StalledPeers()
        self.quarantine: HandleQuarantine | None = None

    def build_quarantine(self) -> None:
        """Before SGLang's workers start: they may hand it a batch at once."""
        self.quarantine = HandleQuarantine(
            read_state=self._quarantined_state,
            release=lambda handle: self._mgr.agent.release_xfer_handle(handle),
            on_settled=self._quarantine_settled,
            on_error=self._rt.count_error,
        )
        self._rt.quarantine = self.quarantine

    def start(self) -> None:
        if self.quarantine is not None:
            self.quarantine.start()
            self._rt.threads.watch(self.quarantine.thread)

    def stop(self) -> None:
        if self.quarantine is not None:
            self.quarantine.stop()

    # --- the wait ----------------------------------------------------------------------
    def await_handles(self, handles: list[Any], failure_seen: bool) -> tuple[bool, bool]:
        config = self._rt.config
        fault = self._faults.active()
        deadline_on = config.has(Fix.TRANSFER_DEADLINE)
        if not deadline_on and not fault.takes_handle_wait:
            stock: tuple[bool, bool] = self._stock._await_handles(handles, failure_seen=failure_seen)
            return stock
        chunk = self._slot.chunk
        limits = WaitLimits(
            transfer_deadline=config.transfer_deadline if deadline_on else None,
            settle_timeout=NIXL_ERR_SETTLE_TIMEOUT_S,
            settle_poll=NIXL_ERR_SETTLE_POLL_S,
        )
        waited = await_handles(
            handles, self._read_state, limits, failure_seen=failure_seen, never_settle=fault.never_settle
        )
        if waited.quarantine is not None:
            self._quarantine_batch(handles, chunk, waited.quarantine)
            if waited.past_deadline:
                self._rt.handle_deadlines += 1
        elif handles and not waited.failed:
            self._chunk_landed(chunk)
        return waited.settled, waited.failed

    def _read_state(self, handle: Any) -> str:
        return str(self._mgr.agent.check_xfer_state(handle))

    def _chunk_landed(self, chunk: Any) -> None:
        if chunk is None:
            return
        moved = len(chunk.prefill_kv_indices) * self._mgr.kv_item_lens_sum
        if chunk.is_last_chunk:
            moved += sum(self._mgr.kv_args.aux_item_lens)
        if moved:
            self._rt.metrics.add_bytes(moved)
        self._faults.active().chunk_landed(chunk, self._mgr.update_status)

    # --- the quarantine ------------------------------------------------------------------
    def _quarantine_batch(self, handles: list[Any], chunk: Any, reason: str) -> None:
        """A batch that may still write is never reported settled. Its handles go
        to the quarantine (kept, polled); the worker's failure path then fails the room
        for prefill and leaves the chunk counted, so neither decode's KV_STATUS nor its
        drain ACK can go out until the quarantine sees every handle end."""
        room = chunk.room if chunk is not None else None
        quarantine = self.quarantine
        if quarantine is None:
            return
        if room is None:
            # No chunk to name the room (pdwarden's bookkeeping failed for it): the handles
            # are still kept and polled, but no room can be told; counted and logged.
            self._rt.count_error(WHERE_QUARANTINE)
            log.error("%s; %d handle(s) of an unidentified chunk quarantined", reason, len(handles))
            quarantine.add(UNKNOWN_ROOM, handles)
            return
        log.warning("room %s: %s; %d handle(s) quarantined until they settle", room, reason, len(handles))
        self._mgr.record_failure(room, reason)
        # SGLang's failure path records its own reason next ("left a handle running ...
        # after a peer handle failed"); the room's true cause is this one.
        self._slot.keep_reason = room
        self._rt.ledger.failed(room, reason)
        self._rt.ledger.quarantined(room)
        self.stalled_peers.quarantined(room, self._mgr.transfer_infos.get(room) or ())
        quarantine.add(room, handles)

    def _quarantined_state(self, handle: Any) -> str:
        # A fault may keep a handle looking unsettled here too (stall-transfers), so a test
        # can hold a room in quarantine and see that decode is not told while it is.
        return self._faults.active().handle_state(handle, self._read_state)

    def _quarantine_settled(self, room: int) -> None:
        """Every quarantined handle of the room ended: nothing can write into its decode
        pages any more, so do what SGLang's failure path would have done when settled."""
        if room == UNKNOWN_ROOM:
            return
        with self._rt.guard(WHERE_QUARANTINE_SETTLED):
            self.stalled_peers.settled(room)
            outstanding = self._mgr._staging_outstanding
            if outstanding.get(room, 0) > 0:
                outstanding[room] -= 1
            if self._rt.ledger.unquarantined(room):
                self._skip.room_idle(room)

    def fail_if_peer_stalled(self, room: int) -> None:
        """A chunk for a decode peer with quarantined handles fails its room before
        anything is posted (``StalledPeers``)."""
        if self.quarantine is None:
            return
        infos = self._mgr.transfer_infos.get(room)
        if not infos:
            return
        stalled = self.stalled_peers.stalled_among(infos)
        if not stalled or self._rt.table.get(room) in (None, KVPoll.Failed, KVPoll.Success):
            return
        self._rt.peer_fast_fails += 1
        self._mgr.record_failure(room, REASON_PEER_STALLED.format(stalled[0]))
        self._mgr.update_status(room, KVPoll.Failed)

    # --- SGLang's failure reasons and drain ACKs -----------------------------------------
    def record_failure(self, room: int, reason: str) -> None:
        if self._slot.keep_reason == room:  # the quarantine's reason stands (above)
            self._slot.keep_reason = None
            return
        self._stock.record_failure(room, reason)

    def poison_deferred_ack_room(self, room: int) -> None:
        # A quarantined room's drain ACK is held by ack_drained_abort below until the
        # quarantine has proved the writes over; poisoning would instead keep decode
        # waiting for its release timeout after that.
        if self._holds(room):
            return
        self._stock.poison_deferred_ack_room(room)

    def ack_drained_abort(self, room: int) -> None:
        # SGLang acks a drain when a room's outstanding count reaches 0; a later chunk of a
        # failed room resets that count when it is skipped, while an earlier chunk's
        # handle may still be writing. Never ack a room with quarantined handles.
        if self._holds(room):
            return
        self._stock._maybe_ack_drained_abort(room)

    def _holds(self, room: int) -> bool:
        return self.quarantine is not None and self.quarantine.holds(room)

    def check_status(self, room: int) -> Any:
        with self._faults.active().status_read():
            return self._stock.check_status(room)

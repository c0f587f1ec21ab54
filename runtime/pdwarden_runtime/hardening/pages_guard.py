"""Decode's pages guard: pages published to a prefill are held until their writer is done.

A decode request that ends while a prefill may still write into its pages has them held
(``HeldPages``) from SGLang's drain-ACK wait until the writer's drain ACK or proof that the
writer is gone (``WriterWatch``: a new process at its bootstrap address, or the operator's
list of deleted pods), never on a clock. A writer that is never proven gone is bounded
instead (``writer_bound``): a new request to a prefill holding more than its share of the
pool fails before anything is registered or published. The receiver's hooks live here too,
as does the inflight deadline's decode side: the room is aborted so its pages are held.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pdwarden_contract import WRITER_REFUSED_HELD_PAGES, WRITER_REFUSED_UNPROVEN_ROUTE
from pdwarden_runtime.hardening.runtime import (
    WHERE_ABORT,
    WHERE_DEADLINE,
    WHERE_PEERS,
    WHERE_SIDE_CHANNEL,
    RoomRuntime,
)
from pdwarden_runtime.hardening.writer_bound import (
    REASON_UNPROVEN_ROUTE,
    WriterRefusals,
    over_bound,
    over_bound_reason,
)
from pdwarden_runtime.hardening.writer_watch import WriterWatch
from pdwarden_runtime.kvpoll import KVPoll
from pdwarden_runtime.peers import peer_of_address

if TYPE_CHECKING:
    from pdwarden_runtime.hardening.nixl import HardenedNixlKVManager


class PagesGuard:
    """Held pages, the writer bound and the writer watch of one decode manager."""

    def __init__(self, mgr: HardenedNixlKVManager, stock: Any, rt: RoomRuntime) -> None:
        self._mgr = mgr
        self._stock = stock  # SGLang's methods of mgr (what super() reaches)
        self._rt = rt
        self.held = rt.held_pages
        self.refusals = WriterRefusals(rt.metrics.count_writer_refused)
        self.writers: WriterWatch | None = None

    def watch_writers(self) -> None:
        """Start asking the prefills this decode holds pages for who they are."""
        # SGLang's decode keeps the prefills it reads from in prefill_info_table.
        self.writers = WriterWatch(
            self.held,
            lambda: list(self._mgr.prefill_info_table.copy()),
            restarted=self._prefill_restarted,
        )
        self.writers.start()
        self._rt.threads.watch(self.writers.thread)

    def stop(self) -> None:
        if self.writers is not None:
            self.writers.stop()

    def _prefill_restarted(self, bootstrap_addr: str) -> None:
        """A new process serves a prefill's bootstrap address (a restart in place: same pod, or
        a new pod at the old address). SGLang forgets a prefill's ranks only after missed
        heartbeats, which a prompt restart never gives it: the new process answers them, and
        every request would go on to the old ranks' ZMQ addresses. Forget it now, as SGLang
        does for a lost prefill (rooms in flight to the old process fail; their pages are
        held until the proofs free them)."""
        with self._rt.guard(WHERE_PEERS):
            self._mgr._handle_node_failure(bootstrap_addr)

    # --- SGLang's drain-ACK wait: the hold ------------------------------------------------
    def hold(self, room: int) -> int:
        # SGLang arms the drain-ACK wait for a room whose metadata went out and whose request
        # ended: its pages are held from here until they are freed.
        with self._rt.guard(WHERE_ABORT):
            self.held.hold(room)
        return int(self._stock.register_deferred_abort_room(room))

    def release_safe(self, room: int, required_acks: int) -> bool:
        # SGLang: every prefill rank that could write acked the drain. pdwarden: or the
        # writer is proven gone (writer_watch); never a clock (held_pages).
        if self._stock.is_abort_release_safe(room, required_acks):
            return True
        return self.held.proof(room) is not None

    def release(self, room: int) -> None:
        self._stock.clear_deferred_abort_state(room)
        self.held.release(room)

    # --- writers refused before anything is published (writer_bound) ----------------------
    def over_bound(self, bootstrap_addr: str) -> str | None:
        """Why a new request to the prefill at ``bootstrap_addr`` is refused (the pages held
        for it are over the bound), or None."""
        pool = self._rt.pool_pages
        share = self._rt.config.held_pages_per_writer
        peer = peer_of_address(bootstrap_addr)
        held = self.held.pages_for(peer)
        if pool is None or not over_bound(held, pool, share):
            return None
        reason = over_bound_reason(peer, held, pool, share)
        self.refusals.refused(peer, WRITER_REFUSED_HELD_PAGES, reason)
        return reason

    def unproven_route(self, bootstrap_addr: str) -> None:
        """The prefill's route answer carried no valid proof: SGLang fails the room."""
        with self._rt.guard(WHERE_SIDE_CHANNEL):
            reason = REASON_UNPROVEN_ROUTE.format(addr=bootstrap_addr)
            self._rt.count_error(WHERE_SIDE_CHANNEL)
            self.refusals.refused(peer_of_address(bootstrap_addr), WRITER_REFUSED_UNPROVEN_ROUTE, reason)

    # --- the receiver's hooks --------------------------------------------------------------
    def receiver_opened(self, room: int, bootstrap_addr: str) -> None:
        """Bind the room to the prefill it reads from (the per-peer figures)."""
        with self._rt.guard(WHERE_PEERS):
            self._rt.metrics.peers.bind(room, [peer_of_address(bootstrap_addr)])

    def refuse_over_bound(self, receiver: Any) -> bool:
        """Fail the room before it registers or publishes anything when its writer holds
        more than its bound (as SGLang fails a room whose bootstrap info it cannot fetch:
        no bootstrap info, so no ABORT and no drain wait arms for pages never published)."""
        reason = None
        with self._rt.guard(WHERE_PEERS):
            reason = self.over_bound(receiver.bootstrap_addr)
        if reason is None:
            return False
        room = receiver.bootstrap_room
        self._mgr.record_failure(room, reason)
        receiver.conclude_state = KVPoll.Failed
        self._mgr.update_status(room, KVPoll.Failed)
        receiver.bootstrap_infos = None
        return True

    def published(self, room: int, bootstrap_addr: str, kv_indices: Any) -> None:
        """The room's metadata went out: the prefill may write these pages now."""
        with self._rt.guard(WHERE_PEERS):
            to = self.writers.identity(bootstrap_addr) if self.writers is not None else None
            self.held.published(room, peer_of_address(bootstrap_addr), bootstrap_addr, len(kv_indices), to)

    def poll(self, receiver: Any, stock_poll: Callable[[], Any]) -> Any:
        # inflight_deadline: it also holds when the reaper thread is starved of the GIL (the
        # engine polls every room anyway; O(1) while nothing is due).
        with self._rt.guard(WHERE_DEADLINE):
            self._rt.tracker.maybe_expire()
        state = stock_poll()
        if int(state) == KVPoll.Failed:
            deadline_rooms = self._rt.decode_deadline_rooms
            if receiver.bootstrap_room in deadline_rooms:
                # inflight_deadline on decode: the prefill may be alive and still writing.
                # Abort it (both engines poll here) so its pages are held until it drains.
                deadline_rooms.discard(receiver.bootstrap_room)
                with self._rt.guard(WHERE_DEADLINE):
                    receiver.ensure_abort_notified()
        return state

    def receiver_cleared(self, room: int) -> None:
        self.held.concluded(room)  # held pages stay until freed
        self._rt.decode_deadline_rooms.discard(room)

    def deadline_failed(self, room: int, reason: str) -> None:
        """The inflight deadline failed the room: the prefill may be alive but stalled, still
        writing; the engine aborts it and holds the pages until the drain is ACKed."""
        self._rt.decode_deadline_rooms.add(room)

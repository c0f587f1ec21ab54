"""SGLang's NIXL KV classes, hardened by subclassing (no SGLang code is copied).

What each override adds (by ``Fix``):

- ``sticky_status``: ``request_status`` is a ``RoomStatusMap`` over pdwarden's
  ``RoomStatusTable`` and ``update_status`` writes through it: Failed and Success are
  terminal, refused writes are counted. Without it the table runs the emulated port's
  ``max()`` rule (legacy).
- ``no_silent_skip``: every chunk a transfer worker takes off its queue passes
  ``_pdw_chunk_taken``: if the worker is about to skip it silently (room cleared, Failed, or
  its transfer info gone), the room is concluded Failed and decode gets ``KV_STATUS Failed``
  once no chunk of the room can still write into decode's pages (``RoomLedger``). The same
  notice covers a prefill-side abort and metadata that arrives for a room that already
  ended. ``add_transfer_request`` for a live room that lost its transfer info fails the room
  instead of dropping the chunk silently.
- ``transfer_deadline``: ``_await_handles`` stops waiting for handles that stay in PROC past
  the transfer deadline (a stalled peer) but never reports them settled: a released WRITE
  can still land. The handles go to ``HandleQuarantine`` and the batch is reported
  unsettled, so SGLang's own failure path fails the room for prefill (the worker moves on)
  and keeps the chunk counted; decode's KV_STATUS and drain ACK go out only once the
  quarantine saw every handle end (DONE, ERR, or its peer disconnected). Until then later
  chunks for the same decode peer fail before anything is posted.
- ``inflight_deadline``: the inflight tracker's deadline fails any room that has waited for
  or moved KV too long (from leaving Bootstrapping: queueing is not a wedge). On prefill
  decode is told as with ``no_silent_skip``; on decode the engine aborts the room and holds
  its pages until prefill acknowledges the drain. A prefill room still waiting for decode's
  metadata is bounded by the same deadline: SGLang's bootstrap timeout (300 s) is lowered to
  it, so a room whose decode leg is gone without a word never holds a client longer than the
  deadline.
- the side channel (every mode of these classes; a proof only when the model has a worker
  key, ``HardeningConfig.side_keys``): ``server_socket`` is a ``CheckingSocket``, so SGLang's
  bootstrap thread (prefill) and decode listener see only messages with a valid proof, and
  the prefill's only those its parsers take (``side_frames``); the rest are dropped and
  counted (``pdwarden_runtime_errors_total{where="side_channel"}``), never fatal. What the
  manager and the receiver send carries the proof (``_send_multipart_locked``, the
  receiver's ``_connect``); a rank registers with a signed PUT and decodes read ranks with
  the proof on SGLang's session; the bootstrap server refuses the rest
  (``bootstrap_guard``). A decode registration NIXL refuses is dropped, not raised. The
  server signs its answer naming a rank and the decode's route fetch checks it: an
  unproven answer fails the room before anything is registered or published.
- decode's writer bound (``writer_bound``): a new request whose prefill holds more than
  ``held_pages_per_writer`` of the pool in held pages fails in the receiver's ``init`` (and
  again before ``send_metadata``) with nothing published; nothing held is freed.
- ``metrics``: the table, tracker, RuntimeMetrics and thread watch live in ``RoomRuntime``
  (``mgr.pdwarden``). Every hook pdwarden adds inside SGLang's threads runs under
  ``RoomRuntime.guard``: an exception in it is logged and counted
  (``pdwarden_runtime_errors_total{where}``) and the thread goes on.

Each fix's state is a collaborator of its own: ``RoomOwners`` and ``EarlyAborts``
(``no_silent_skip``), ``handle_wait``, ``HandleQuarantine`` and ``StalledPeers``
(``transfer_deadline``), ``RoomRuntime``'s tracker (``inflight_deadline``), ``HeldPages`` and
``WriterWatch`` (decode's held pages). This module is the seam: SGLang's methods overridden,
each calling into them.

Faults (``HardeningConfig.fault``, switchable at run time; the ``faults`` package) run
through the same SGLang code: ``emulated-maxstatus-port-race`` (``PortRace``) holds a
finished non-last chunk's Transferring write until the room's ABORT has been handled (the
ABORT handler drops the room's transfer info, as that port did); ``stall-transfers`` keeps
every handle looking unsettled (in the quarantine too); ``drop-abort`` drops ABORT messages
from decode; ``stall-kv-receive`` (decode, ``StallKvReceive``) names a NIXL agent that never
progresses in the messages of rooms it opens.
"""

from __future__ import annotations

import logging
import threading
from contextlib import AbstractContextManager
from typing import Any, Final

from sglang.srt.disaggregation.common.conn import ABORT_TAG, AbortNotification, _get_bootstrap_session
from sglang.srt.disaggregation.nixl.conn import (
    NIXL_ERR_SETTLE_POLL_S,
    NIXL_ERR_SETTLE_TIMEOUT_S,
    NixlKVBootstrapServer,
    NixlKVManager,
    NixlKVReceiver,
    NixlKVSender,
)
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.environ import envs

from pdwarden_contract import (
    OUTCOME_ABORTED,
    OUTCOME_DEADLINE,
    OUTCOME_FAILED,
    ROLE_DECODE,
    ROLE_PREFILL,
    WRITER_REFUSED_HELD_PAGES,
    WRITER_REFUSED_UNPROVEN_ROUTE,
)
from pdwarden_runtime.hardening.bootstrap_guard import (
    ANSWER_PROOF_HEADER,
    PROOF_HEADER,
    RouteGate,
    answer_check,
    is_rank_query,
    register_signed,
    route_answer_proof,
    route_read_proof,
)
from pdwarden_runtime.hardening.config import (
    FAULT_DROP_ABORT,
    FAULT_EMULATED_PORT_RACE,
    FAULT_NONE,
    FAULT_STALL,
    FAULT_STALL_KV_RECEIVE,
    ConfigError,
    Fix,
    HardeningConfig,
    installed_config,
)
from pdwarden_runtime.hardening.early_aborts import EarlyAborts
from pdwarden_runtime.hardening.faults.port_race import PortRace
from pdwarden_runtime.hardening.faults.stalled_agent import StalledAgent, StallKvReceive
from pdwarden_runtime.hardening.handle_wait import WaitLimits, await_handles
from pdwarden_runtime.hardening.quarantine import HandleQuarantine
from pdwarden_runtime.hardening.room_owners import RoomOwners
from pdwarden_runtime.hardening.runtime import (
    WHERE_ABORT,
    WHERE_CHUNK_FINISHED,
    WHERE_CHUNK_TAKEN,
    WHERE_DEADLINE,
    WHERE_ENQUEUE,
    WHERE_PEERS,
    WHERE_QUARANTINE,
    WHERE_QUARANTINE_SETTLED,
    WHERE_SIDE_CHANNEL,
    WHERE_STATUS_NOTICE,
    WHERE_STATUS_WRITE,
    RoomRuntime,
)
from pdwarden_runtime.hardening.side_frames import prefill_message_problem
from pdwarden_runtime.hardening.side_socket import CheckingSocket, DropLog, SigningSocket
from pdwarden_runtime.hardening.stalled_peers import StalledPeers
from pdwarden_runtime.hardening.writer_bound import (
    REASON_UNPROVEN_ROUTE,
    WriterRefusals,
    over_bound,
    over_bound_reason,
)
from pdwarden_runtime.hardening.writer_watch import INCARNATION_PATH, WriterWatch, incarnation_body
from pdwarden_runtime.kvpoll import KVPoll, coerce
from pdwarden_runtime.peers import peer_of_address

log = logging.getLogger(__name__)

REASON_PEER_STALLED: Final = (
    "transfer deadline: decode peer {} has a stalled transfer (quarantined); failed before sending"
)
REASON_INFLIGHT_DEADLINE: Final = "inflight deadline: room not concluded within {:.1f}s"
REASON_SKIPPED: Final = "room {} before its chunk was sent (pdwarden: skipped chunk concluded Failed)"
REASON_EARLY_ABORT: Final = "Aborted by decode before this prefill opened the room"
# The quarantine's room for handles whose chunk pdwarden could not identify: kept and polled
# like any other (they may still write), never reported for a room.
UNKNOWN_ROOM: Final = -1


def outcome_for(reason: str | None) -> str:
    """The contract outcome of a failed room, from SGLang's/pdwarden's failure reason."""
    text = (reason or "").lower()
    if "deadline" in text or "timed out" in text:  # SGLang's bootstrap and waiting timeouts
        return OUTCOME_DEADLINE
    if "abort" in text:
        return OUTCOME_ABORTED
    return OUTCOME_FAILED


class _WatchedQueue:
    """A transfer worker's queue, seen through the manager's chunk accounting."""

    def __init__(self, inner: Any, mgr: HardenedNixlKVManager) -> None:
        self._inner = inner
        self._mgr = mgr

    def put(self, chunk: Any) -> None:
        with self._mgr._pdw_guard(WHERE_ENQUEUE):
            self._mgr.pdwarden.ledger.enqueued(chunk.room)
        self._inner.put(chunk)

    def get(self) -> Any:
        with self._mgr._pdw_guard(WHERE_CHUNK_FINISHED):
            self._mgr._pdw_chunk_finished()
        self._mgr._pdw_tls.chunk = None
        chunk = self._inner.get()
        with self._mgr._pdw_guard(WHERE_CHUNK_TAKEN):
            self._mgr._pdw_chunk_taken(chunk)
        return chunk


class HardenedNixlKVManager(NixlKVManager):
    """NixlKVManager with pdwarden's fixes (``Fix``; see the module docstring)."""

    pdwarden: RoomRuntime

    def __init__(
        self, args: Any, disaggregation_mode: Any, server_args: Any, is_mla_backend: bool | None = False
    ) -> None:
        config = installed_config()
        role = ROLE_PREFILL if disaggregation_mode == DisaggregationMode.PREFILL else ROLE_DECODE
        self.pdwarden = RoomRuntime(config, role)
        self._pdw_tls = threading.local()
        self._pdw_queues: dict[int, _WatchedQueue] = {}
        self._pdw_queue_lock = threading.Lock()
        self._pdw_owners = RoomOwners()
        self._pdw_early_aborts = EarlyAborts()
        self._pdw_quarantine: HandleQuarantine | None = None
        self._pdw_stalled_peers = StalledPeers()
        self._pdw_port_race = PortRace()
        self._pdw_stall_kv_receive = StallKvReceive(args)
        self._pdw_side_drops = DropLog(f"pdwarden {role} KV manager")
        self._pdw_refusals = WriterRefusals(self.pdwarden.metrics.count_writer_refused)
        if config.side_keys.keyed and envs.SGLANG_DISAGG_STAGING_BUFFER.get():
            # SGLang's staging requests go out on sockets of their own, unsigned: every one
            # would be dropped and its transfer would wait for its deadline.
            raise ConfigError(
                "SGLANG_DISAGG_STAGING_BUFFER is not supported with the model's worker key: "
                "SGLang's staging requests cannot carry the PD side channel's proof"
            )
        if role == ROLE_PREFILL and config.has(Fix.TRANSFER_DEADLINE):
            # Built before SGLang's workers start: they may hand it a batch at once.
            self._pdw_quarantine = HandleQuarantine(
                read_state=self._pdw_quarantined_state,
                release=lambda handle: self.agent.release_xfer_handle(handle),
                on_settled=self._pdw_quarantine_settled,
                on_error=self.pdwarden.count_error,
            )
            self.pdwarden.quarantine = self._pdw_quarantine
        with self.pdwarden.threads.record_started():
            super().__init__(args, disaggregation_mode, server_args, is_mla_backend)
        if role == ROLE_PREFILL:
            queues: list[Any] = list(self.transfer_queues)  # type: ignore[has-type]
            self.transfer_queues = [self._pdw_queue(q) for q in queues]
        self.pdwarden.tracker.on_deadline = self._pdw_on_deadline
        deadline = self.pdwarden.tracker.deadline
        if role == ROLE_PREFILL and deadline is not None:
            # inflight_deadline: SGLang's sender fails a room still Bootstrapping after this many seconds.
            self.bootstrap_timeout: float = min(float(self.bootstrap_timeout), deadline)
        if self._pdw_quarantine is not None:
            self._pdw_quarantine.start()
            self.pdwarden.threads.watch(self._pdw_quarantine.thread)
        self._pdw_writers: WriterWatch | None = None
        if role == ROLE_DECODE:
            # SGLang's decode keeps the prefills it reads from in prefill_info_table.
            self._pdw_writers = WriterWatch(
                self.pdwarden.held_pages,
                lambda: list(self.prefill_info_table.copy()),
                restarted=self._pdw_prefill_restarted,
            )
            self._pdw_writers.start()
            self.pdwarden.threads.watch(self._pdw_writers.thread)
        self.pdwarden.pool_pages = _pool_pages(args)
        self.pdwarden.start()

    def _pdw_prefill_restarted(self, bootstrap_addr: str) -> None:
        """A new process serves a prefill's bootstrap address (a restart in place: same pod, or
        a new pod at the old address). SGLang forgets a prefill's ranks only after missed
        heartbeats, which a prompt restart never gives it: the new process answers them, and
        every request would go on to the old ranks' ZMQ addresses. Forget it now, as SGLang
        does for a lost prefill (rooms in flight to the old process fail; their pages are
        held until the proofs free them)."""
        with self._pdw_guard(WHERE_PEERS):
            self._handle_node_failure(bootstrap_addr)

    def _pdw_guard(self, where: str) -> AbstractContextManager[None]:
        """pdwarden's own bookkeeping inside SGLang's threads: an error in it is logged
        and counted, never allowed to end the thread or skip SGLang's own work."""
        return self.pdwarden.guard(where)

    @property
    def _pdw_config(self) -> HardeningConfig:
        return self.pdwarden.config

    # --- the side channel: checked on receipt, signed on the way out ---------------
    @property
    def server_socket(self) -> Any:
        return self._pdw_server_socket

    @server_socket.setter
    def server_socket(self, sock: Any) -> None:
        # CommonKVManager.__init__ binds it before SGLang's reading thread starts: that
        # thread only ever sees the checking socket.
        shape = prefill_message_problem if self.pdwarden.role == ROLE_PREFILL else None
        self._pdw_server_socket = CheckingSocket(sock, self._pdw_config.side_keys, self._pdw_side_drop, shape)

    def _pdw_side_drop(self, reason: str) -> None:
        self.pdwarden.count_error(WHERE_SIDE_CHANNEL)
        self._pdw_side_drops.dropped(reason)

    def _send_multipart_locked(self, endpoint: str, parts: list[bytes], is_ipv6: bool = False) -> None:
        keys = self._pdw_config.side_keys
        super()._send_multipart_locked(endpoint, keys.sign(parts), is_ipv6=is_ipv6)

    def _register_topology_row(self, url: str, payload: dict[str, Any]) -> None:
        keys = self._pdw_config.side_keys
        if keys.signer is None:
            super()._register_topology_row(url, payload)
            return
        register_signed(url, payload, keys)

    def _add_remote_peer(self, decode_kv_args: Any) -> None:
        # NIXL refuses metadata that is not an agent's: SGLang's bootstrap thread would die
        # of it. The registration is dropped instead (the decode's rooms then fail).
        name = decode_kv_args.agent_name
        known = name in self.decode_kv_args_table
        try:
            super()._add_remote_peer(decode_kv_args)
        except Exception as err:
            if not known:
                self.decode_kv_args_table.pop(name, None)
            log.debug("a decode registration was refused", exc_info=True)
            self._pdw_side_drop(f"a decode registration NIXL refused ({type(err).__name__})")

    # --- sticky_status: the status table behind request_status ---------------------
    @property  # type: ignore[override]
    def request_status(self) -> Any:
        return self.pdwarden.rooms

    @request_status.setter
    def request_status(self, value: Any) -> None:
        # CommonKVManager.__init__ assigns an empty dict; pdwarden's table is the storage.
        if isinstance(value, dict) and not value:
            return
        raise NotImplementedError(
            "pdwarden's NIXL hardening supports pipeline-parallel size 1 only "
            f"(SGLang tried to install {type(value).__name__} as the room status store)"
        )

    def update_status(self, bootstrap_room: int, status: Any) -> None:
        target = coerce(status)  # a bad status is SGLang's error: it propagates as before
        table = self.pdwarden.table
        before = table.get(bootstrap_room)
        try:
            self._pdw_update_status(bootstrap_room, target)  # dict lookup: per-chunk path
        except Exception:
            self.pdwarden.count_error(WHERE_STATUS_WRITE)
            log.exception(
                "pdwarden: status write %s -> %s failed; writing the table directly",
                bootstrap_room,
                target.name,
            )
            with self._pdw_guard(WHERE_STATUS_WRITE):
                table.update(bootstrap_room, target)
        finally:
            # Listeners wake the request waiting on the room: only a write that changed
            # its status can satisfy it. The transfer worker repeats Transferring once per
            # chunk; waking the engine's event loop for each cost the worker a thread
            # switch per chunk.
            if table.get(bootstrap_room) is not before:
                self.pdwarden.notify(bootstrap_room)

    def _pdw_update_status(self, room: int, target: KVPoll) -> None:
        table = self.pdwarden.table
        current = table.get(room)
        is_prefill = self.pdwarden.role == ROLE_PREFILL
        if target is KVPoll.WaitingForInput and is_prefill:
            # The bootstrap thread: decode's metadata for the room is complete.
            self.pdwarden.ledger.remember_targets(room, self._room_notify_targets(room))
            with self._pdw_guard(WHERE_PEERS):
                infos = (self.transfer_infos.get(room) or {}).values()
                self.pdwarden.metrics.peers.bind(room, [i.endpoint for i in infos if not i.is_dummy])
        if current is None:
            if target is KVPoll.WaitingForInput and is_prefill and table.is_cleared(room):
                self._pdw_metadata_after_end(room)
                return
            if target is KVPoll.Bootstrapping or target is KVPoll.WaitingForInput:
                if is_prefill and target is KVPoll.WaitingForInput:
                    self._pdw_owners.opened_by_metadata(room)
                self.pdwarden.ledger.settle(room)
                super().update_status(room, target)  # SGLang's opening side effects
                if is_prefill and self._pdw_early_aborts.take(room):
                    self.record_failure(room, REASON_EARLY_ABORT)
                    self._pdw_update_status(room, KVPoll.Failed)
                return
            # A write to a room with no lifecycle: legacy max() creates it (an orphan);
            # the sticky table refuses and counts it.
            table.update(room, target)
            return
        if target is KVPoll.Bootstrapping and current is not KVPoll.Bootstrapping:
            # A sender opening a room whose decode metadata came first: normal ordering.
            if table.mode == "legacy":
                table.update(room, target)
            return
        if target is KVPoll.Failed:
            reason = self.failure_records.get(room)
            applied = table.update(room, target, outcome=outcome_for(reason))
            if applied and self.deferred_bootstrap is not None:
                self._notify_bootstrap(room, self.deferred_bootstrap.fail(room))
            self._pdw_room_failed(room, reason or "KV transfer failed")
            self._pdw_release_orphan(room)
            return
        table.update(room, target)

    # --- no_silent_skip: failed rooms are concluded and decode is told --------------
    def _pdw_room_failed(self, room: int, reason: str) -> None:
        if self.pdwarden.role != ROLE_PREFILL or not self._pdw_config.has(Fix.NO_SILENT_SKIP):
            return
        self.pdwarden.ledger.failed(room, reason)
        self._pdw_send_failure_notice(room)

    def _pdw_send_failure_notice(self, room: int) -> None:
        if not self._pdw_config.has(Fix.NO_SILENT_SKIP):
            return
        claim = self.pdwarden.ledger.claim_failure_notice(room)
        if claim is None:
            return
        targets, reason = claim
        self.pdwarden.failure_notices += 1
        super().send_kv_status_message(
            targets=targets, bootstrap_room=room, status=KVPoll.Failed, failure_reason=reason
        )

    def send_kv_status_message(
        self,
        *,
        targets: list[tuple[str, int]],
        bootstrap_room: int,
        status: Any,
        failure_reason: str | None = None,
    ) -> None:
        with self._pdw_guard(WHERE_STATUS_NOTICE):
            if targets and int(status) in (KVPoll.Failed, KVPoll.Success):
                self.pdwarden.ledger.told(bootstrap_room)
        super().send_kv_status_message(
            targets=targets, bootstrap_room=bootstrap_room, status=status, failure_reason=failure_reason
        )

    def _pdw_metadata_after_end(self, room: int) -> None:
        """Decode's metadata arrived for a room this prefill already ended: SGLang would
        open an orphan room and keep its transfer info forever; decode would wait for its
        timeout. Refuse the write, drop the info, and tell decode."""
        self.pdwarden.table.update(room, KVPoll.WaitingForInput)  # refused, counted
        self.transfer_infos.pop(room, None)
        self.req_to_decode_prefix_len.pop(room, None)
        if self._pdw_config.has(Fix.NO_SILENT_SKIP):
            self.pdwarden.ledger.failed(room, "prefill room ended before decode's metadata arrived")
            self._pdw_send_failure_notice(room)
        self.pdwarden.ledger.cleared(room)

    def _pdw_release_orphan(self, room: int) -> None:
        """A failed prefill room that no request owns (decode's metadata opened it; the
        prefill leg never came, its client having left first) would be held forever:
        nothing will read its failure or clear it. Prefill gave it no pages, so no write
        can land from it: end it now (decode was told), and keep it as an early abort so
        a prefill leg that comes after all fails at once."""
        if not self._pdw_owners.ownerless(room):
            return
        if self.pdwarden.table.get(room) is not KVPoll.Failed:
            return
        self.pdwarden.table.clear(room)
        self.transfer_infos.pop(room, None)
        self.req_to_decode_prefix_len.pop(room, None)
        with self.failure_lock:
            self.failure_records.pop(room, None)
        self._pdw_early_aborts.remember(room)
        self._pdw_room_cleared(room)

    def _pdw_room_cleared(self, room: int) -> None:
        self._pdw_owners.cleared(room)
        self.pdwarden.ledger.cleared(room)
        self._pdw_drop_leftovers(room)

    def _pdw_drop_leftovers(self, room: int) -> None:
        """A cleared room no worker holds: drop SGLang's per-room entries that its
        cleanup can miss when the scheduler clears the room before the worker's last
        check (a zero ``_staging_outstanding`` entry per room otherwise accumulates)."""
        if room in self.pdwarden.table or not self.pdwarden.ledger.idle(room):
            return
        if self._staging_outstanding.get(room, 1) <= 0:
            self._staging_outstanding.pop(room, None)

    def _pdw_queue(self, inner: Any) -> _WatchedQueue:
        if isinstance(inner, _WatchedQueue):
            return inner
        with self._pdw_queue_lock:
            watched = self._pdw_queues.get(id(inner))
            if watched is None:
                watched = self._pdw_queues[id(inner)] = _WatchedQueue(inner, self)
            return watched

    def transfer_worker(self, queue: Any, staging_buffer: Any = None, worker_index: int = 0) -> None:
        super().transfer_worker(self._pdw_queue(queue), staging_buffer, worker_index)

    def _pdw_chunk_taken(self, chunk: Any) -> None:
        # Per-thread state first: if the ledger below fails, this chunk (not the last
        # one) is what the rest of the batch's hooks see.
        self._pdw_tls.chunk = chunk
        self._pdw_tls.keep_reason = None
        room = chunk.room
        self.pdwarden.ledger.dequeued(room)
        self._pdw_fail_if_peer_stalled(room)
        if not self._pdw_config.has(Fix.NO_SILENT_SKIP):
            return
        status = self.pdwarden.table.get(room)
        if status is None:
            what = "was cleared"
        elif status is KVPoll.Failed:
            what = "failed"
        elif self.transfer_infos.get(room) is None:
            what = "lost its transfer info"
        else:
            return
        # The worker skips this chunk next (SGLang's guards); make the skip conclude.
        self.pdwarden.silent_skips_concluded += 1
        reason = self.failure_records.get(room) or REASON_SKIPPED.format(what)
        if status is not None and status is not KVPoll.Failed:
            self.record_failure(room, reason)
            self.update_status(room, KVPoll.Failed)
        else:
            self.pdwarden.ledger.failed(room, reason)

    def _pdw_chunk_finished(self) -> None:
        chunk = getattr(self._pdw_tls, "chunk", None)
        if chunk is None:
            return
        self._pdw_tls.chunk = None
        if self.pdwarden.ledger.chunk_done(chunk.room):
            self._pdw_send_failure_notice(chunk.room)
            if self.enable_deferred_decode_kv_release:
                # SGLang tried the drain ACK while it skipped this chunk; had the room's
                # quarantine settled meanwhile (it saw this chunk still on the worker), no one
                # would try again. Once per idle room, never while a handle may write.
                self._maybe_ack_drained_abort(chunk.room)
            self.pdwarden.ledger.settle(chunk.room)
            self._pdw_drop_leftovers(chunk.room)

    # --- transfer_deadline: a deadline on handles; the faults that act on them -------
    def _await_handles(self, handles: list[Any], *, failure_seen: bool) -> tuple[bool, bool]:
        config = self._pdw_config
        fault = config.fault.active
        deadline_on = config.has(Fix.TRANSFER_DEADLINE)
        if not deadline_on and fault == FAULT_NONE:
            return super()._await_handles(handles, failure_seen=failure_seen)
        chunk = getattr(self._pdw_tls, "chunk", None)
        limits = WaitLimits(
            transfer_deadline=config.transfer_deadline if deadline_on else None,
            settle_timeout=NIXL_ERR_SETTLE_TIMEOUT_S,
            settle_poll=NIXL_ERR_SETTLE_POLL_S,
        )
        waited = await_handles(
            handles,
            lambda handle: str(self.agent.check_xfer_state(handle)),
            limits,
            failure_seen=failure_seen,
            never_settle=fault == FAULT_STALL,
        )
        if waited.quarantine is not None:
            self._pdw_quarantine_batch(handles, chunk, waited.quarantine)
            if waited.past_deadline:
                self.pdwarden.handle_deadlines += 1
        elif handles and not waited.failed:
            self._pdw_chunk_landed(chunk)
        return waited.settled, waited.failed

    def _pdw_quarantine_batch(self, handles: list[Any], chunk: Any, reason: str) -> None:
        """A batch that may still write is never reported settled. Its handles go
        to the quarantine (kept, polled); the worker's failure path then fails the room
        for prefill and leaves the chunk counted, so neither decode's KV_STATUS nor its
        drain ACK can go out until the quarantine sees every handle end."""
        room = chunk.room if chunk is not None else None
        if self._pdw_quarantine is None:
            return
        if room is None:
            # No chunk to name the room (pdwarden's bookkeeping failed for it): the handles
            # are still kept and polled, but no room can be told; counted and logged.
            self.pdwarden.count_error(WHERE_QUARANTINE)
            log.error("%s; %d handle(s) of an unidentified chunk quarantined", reason, len(handles))
            self._pdw_quarantine.add(UNKNOWN_ROOM, handles)
            return
        log.warning("room %s: %s; %d handle(s) quarantined until they settle", room, reason, len(handles))
        self.record_failure(room, reason)
        # SGLang's failure path records its own reason next ("left a handle running ...
        # after a peer handle failed"); the room's true cause is this one.
        self._pdw_tls.keep_reason = room
        self.pdwarden.ledger.failed(room, reason)
        self.pdwarden.ledger.quarantined(room)
        self._pdw_stalled_peers.quarantined(room, self.transfer_infos.get(room) or ())
        self._pdw_quarantine.add(room, handles)

    def _pdw_fail_if_peer_stalled(self, room: int) -> None:
        """A chunk for a decode peer with quarantined handles fails its room before
        anything is posted (``StalledPeers``)."""
        if self._pdw_quarantine is None:
            return
        infos = self.transfer_infos.get(room)
        if not infos:
            return
        stalled = self._pdw_stalled_peers.stalled_among(infos)
        if not stalled or self.pdwarden.table.get(room) in (None, KVPoll.Failed, KVPoll.Success):
            return
        self.pdwarden.peer_fast_fails += 1
        self.record_failure(room, REASON_PEER_STALLED.format(stalled[0]))
        self.update_status(room, KVPoll.Failed)

    def _pdw_quarantined_state(self, handle: Any) -> str:
        # The stall fault keeps a handle looking unsettled here too, so a test can hold a
        # room in quarantine and see that decode is not told while it is.
        if self._pdw_config.fault.active == FAULT_STALL:
            return "PROC"
        return str(self.agent.check_xfer_state(handle))

    def _pdw_quarantine_settled(self, room: int) -> None:
        """Every quarantined handle of the room ended: nothing can write into its decode
        pages any more, so do what SGLang's failure path would have done when settled."""
        if room == UNKNOWN_ROOM:
            return
        with self._pdw_guard(WHERE_QUARANTINE_SETTLED):
            self._pdw_stalled_peers.settled(room)
            if self._staging_outstanding.get(room, 0) > 0:
                self._staging_outstanding[room] -= 1
            idle = self.pdwarden.ledger.unquarantined(room)
            if idle:
                self._pdw_send_failure_notice(room)
                if self.enable_deferred_decode_kv_release:
                    self._maybe_ack_drained_abort(room)
                self.pdwarden.ledger.settle(room)
                self._pdw_drop_leftovers(room)

    def record_failure(self, bootstrap_room: int, failure_reason: str) -> None:
        if getattr(self._pdw_tls, "keep_reason", None) == bootstrap_room:
            self._pdw_tls.keep_reason = None
            return
        super().record_failure(bootstrap_room, failure_reason)

    def poison_deferred_ack_room(self, room: int) -> None:
        # A quarantined room's drain ACK is held by _maybe_ack_drained_abort below until
        # the quarantine has proved the writes over; poisoning would instead keep decode
        # waiting for its release timeout after that.
        if self._pdw_quarantine is not None and self._pdw_quarantine.holds(room):
            return
        super().poison_deferred_ack_room(room)

    def _maybe_ack_drained_abort(self, room: int) -> None:
        # SGLang acks a drain when a room's outstanding count reaches 0; a later chunk of a
        # failed room resets that count when it is skipped, while an earlier chunk's
        # handle may still be writing. Never ack a room with quarantined handles.
        if self._pdw_quarantine is not None and self._pdw_quarantine.holds(room):
            return
        super()._maybe_ack_drained_abort(room)

    def _pdw_chunk_landed(self, chunk: Any) -> None:
        if chunk is None:
            return
        moved = len(chunk.prefill_kv_indices) * self.kv_item_lens_sum
        if chunk.is_last_chunk:
            moved += sum(self.kv_args.aux_item_lens)
        if moved:
            self.pdwarden.metrics.add_bytes(moved)
        if self._pdw_config.fault.active == FAULT_EMULATED_PORT_RACE and not chunk.is_last_chunk:
            # The chunk is done, its status write comes late; an ABORT that lands in between
            # is then overwritten by Transferring under max().
            room = chunk.room
            self._pdw_port_race.hold_status_write(
                room, self._pdw_config.race_window, lambda: self.update_status(room, KVPoll.Transferring)
            )

    def check_status(self, bootstrap_room: int) -> Any:
        if self._pdw_config.fault.active == FAULT_EMULATED_PORT_RACE:
            with self._pdw_port_race.lock:  # never see an ABORT half-handled (deterministic race)
                return super().check_status(bootstrap_room)
        return super().check_status(bootstrap_room)

    def _pdw_remember_early_abort(self, msg: list[bytes]) -> None:
        """An ABORT for a room this prefill has not opened is kept (``EarlyAborts``)."""
        if not self._pdw_config.has(Fix.NO_SILENT_SKIP) or not msg or msg[0] != ABORT_TAG:
            return
        notification = AbortNotification.from_zmq(msg)
        if notification is None:
            return
        room = notification.room
        if room in self.pdwarden.table or self.pdwarden.table.is_cleared(room):
            return
        self._pdw_early_aborts.remember(room)

    def _handle_abort_notification(self, msg: list[bytes]) -> bool:
        fault = self._pdw_config.fault.active
        if fault != FAULT_DROP_ABORT:
            with self._pdw_guard(WHERE_ABORT):
                self._pdw_remember_early_abort(msg)
        if not msg or msg[0] != ABORT_TAG or fault not in (FAULT_EMULATED_PORT_RACE, FAULT_DROP_ABORT):
            return bool(super()._handle_abort_notification(msg))
        if fault == FAULT_DROP_ABORT:
            log.warning("fault drop-abort: dropping an ABORT from decode")
            return True
        notification = AbortNotification.from_zmq(msg)
        if notification is None:
            return True
        room = notification.room
        with self._pdw_port_race.lock:
            handled = super()._handle_abort_notification(msg)
            # The emulated port's control thread also dropped the room's transfer info here.
            self.transfer_infos.pop(room, None)
            self._pdw_port_race.abort_handled(room)
        return bool(handled)

    def add_transfer_request(self, bootstrap_room: int, *args: Any, **kwargs: Any) -> Any:
        with self._pdw_guard(WHERE_ENQUEUE):
            self._pdw_refuse_silent_drop(bootstrap_room)
        return super().add_transfer_request(bootstrap_room, *args, **kwargs)

    def _pdw_refuse_silent_drop(self, room: int) -> None:
        """SGLang drops a chunk of a room without transfer info without a word. For a
        live room whose decode metadata was seen (so not a dummy rank), that chunk would
        never be sent and the room would wait forever: fail the room instead."""
        if not self._pdw_config.has(Fix.NO_SILENT_SKIP) or room in self.transfer_infos:
            return
        status = self.pdwarden.table.get(room)
        if status is None or status in (KVPoll.Failed, KVPoll.Success):
            return
        if not self.pdwarden.ledger.has_targets(room):
            return
        self.pdwarden.silent_skips_concluded += 1
        self.record_failure(room, REASON_SKIPPED.format("lost its transfer info"))
        self.update_status(room, KVPoll.Failed)

    # --- inflight_deadline ------------------------------------------------------------
    def _pdw_on_deadline(self, rooms: list[int]) -> None:
        reason = REASON_INFLIGHT_DEADLINE.format(self.pdwarden.tracker.deadline or 0.0)
        for room in rooms:
            with self._pdw_guard(WHERE_DEADLINE):
                log.warning("room %s: %s", room, reason)
                self.record_failure(room, reason)
                if self.pdwarden.role == ROLE_PREFILL:
                    self.pdwarden.ledger.remember_targets(room, self._room_notify_targets(room))
                    self._pdw_room_failed(room, reason)
                    self._pdw_release_orphan(room)
                else:
                    # Decode: the room's pages may still be written by a prefill that is
                    # alive but stalled; the engine aborts it and holds the pages until
                    # prefill acknowledges the drain (SGLang's deferred release).
                    self.pdwarden.decode_deadline_rooms.add(room)
            self.pdwarden.notify(room)

    # --- the decode-side stall fault --------------------------------------------------
    def _pdw_stall_agent(self) -> StalledAgent | None:
        """The never-progressing agent while stall-kv-receive is on (decode only)."""
        if self.pdwarden.role != ROLE_DECODE or self._pdw_config.fault.active != FAULT_STALL_KV_RECEIVE:
            return None
        return self._pdw_stall_kv_receive.agent()

    def _pdw_stall_flip(self) -> None:
        """When the fault is switched on or off, forget the prefills' registrations."""
        if self._pdw_stall_kv_receive.switched(self._pdw_config.fault.active == FAULT_STALL_KV_RECEIVE):
            with self.connection_lock:
                self.connection_pool.clear()

    def build_receiver_registration_message(self) -> list[bytes]:
        message: list[bytes] = list(super().build_receiver_registration_message())
        stalled = self._pdw_stall_agent()
        if stalled is not None:  # [4] agent name, [5] agent metadata (SGLang's layout)
            message[4], message[5] = stalled.name.encode("ascii"), stalled.metadata
        return message

    def build_receiver_metadata_message(
        self,
        *,
        bootstrap_room: int,
        required_dst_info_num: int,
        kv_indices: Any,
        aux_index: int | None,
        state_indices: Any,
        decode_prefix_len: int | None,
        is_dummy: bool,
        device_kv_indices: Any = None,
    ) -> list[bytes]:
        message: list[bytes] = list(
            super().build_receiver_metadata_message(
                bootstrap_room=bootstrap_room,
                required_dst_info_num=required_dst_info_num,
                kv_indices=kv_indices,
                aux_index=aux_index,
                state_indices=state_indices,
                decode_prefix_len=decode_prefix_len,
                is_dummy=is_dummy,
                device_kv_indices=device_kv_indices,
            )
        )
        stalled = self._pdw_stall_agent()
        if stalled is not None:  # [4] agent name
            message[4] = stalled.name.encode("ascii")
        return message

    # --- decode: pages held for their writer (held_pages) -----------------------------
    def register_deferred_abort_room(self, bootstrap_room: int) -> int:
        # SGLang arms the drain-ACK wait for a room whose metadata went out and whose request
        # ended: its pages are held from here until they are freed.
        with self._pdw_guard(WHERE_ABORT):
            self.pdwarden.held_pages.hold(bootstrap_room)
        return int(super().register_deferred_abort_room(bootstrap_room))

    def is_abort_release_safe(self, bootstrap_room: int, required_acks: int) -> bool:
        # SGLang: every prefill rank that could write acked the drain. pdwarden: or the
        # writer is proven gone (writer_watch); never a clock (held_pages).
        if super().is_abort_release_safe(bootstrap_room, required_acks):
            return True
        return self.pdwarden.held_pages.proof(bootstrap_room) is not None

    def clear_deferred_abort_state(self, bootstrap_room: int) -> None:
        super().clear_deferred_abort_state(bootstrap_room)
        self.pdwarden.held_pages.release(bootstrap_room)

    # --- decode: writers refused before anything is published (writer_bound) -----------
    def _pdw_over_bound(self, bootstrap_addr: str) -> str | None:
        """Why a new request to the prefill at ``bootstrap_addr`` is refused (the pages held
        for it are over the bound), or None."""
        pool = self.pdwarden.pool_pages
        share = self._pdw_config.held_pages_per_writer
        peer = peer_of_address(bootstrap_addr)
        held = self.pdwarden.held_pages.pages_for(peer)
        if pool is None or not over_bound(held, pool, share):
            return None
        reason = over_bound_reason(peer, held, pool, share)
        self._pdw_refusals.refused(peer, WRITER_REFUSED_HELD_PAGES, reason)
        return reason

    def _pdw_unproven_route(self, bootstrap_addr: str) -> None:
        reason = REASON_UNPROVEN_ROUTE.format(addr=bootstrap_addr)
        self.pdwarden.count_error(WHERE_SIDE_CHANNEL)
        self._pdw_refusals.refused(peer_of_address(bootstrap_addr), WRITER_REFUSED_UNPROVEN_ROUTE, reason)

    def writer_refusals(self) -> dict[str, int]:
        """Decode requests refused before publishing, by reason (for /debug/state)."""
        return self._pdw_refusals.counts()

    def shutdown_pdwarden(self) -> None:
        if self._pdw_quarantine is not None:
            self._pdw_quarantine.stop()
        if self._pdw_writers is not None:
            self._pdw_writers.stop()
        self.pdwarden.stop()


class HardenedNixlKVSender(NixlKVSender):
    """NixlKVSender that tells the manager which room it owns, and when its lifecycle ends."""

    def __init__(self, mgr: Any, bootstrap_addr: str, bootstrap_room: int, *args: Any, **kwargs: Any) -> None:
        if isinstance(mgr, HardenedNixlKVManager):
            mgr._pdw_owners.sender_created(bootstrap_room)
        super().__init__(mgr, bootstrap_addr, bootstrap_room, *args, **kwargs)

    def clear(self) -> None:
        super().clear()
        mgr = self.kv_mgr
        if isinstance(mgr, HardenedNixlKVManager):
            mgr._pdw_room_cleared(self.bootstrap_room)


class HardenedNixlKVReceiver(NixlKVReceiver):
    """NixlKVReceiver (decode); its manager's table is already the sticky one. Binds its
    room to the prefill it reads from (the per-peer figures)."""

    def __init__(self, mgr: Any, bootstrap_addr: str, bootstrap_room: int | None = None) -> None:
        super().__init__(mgr, bootstrap_addr, bootstrap_room)
        if (
            isinstance(mgr, HardenedNixlKVManager)
            and bootstrap_room is not None
            and self.conclude_state is None
        ):
            with mgr._pdw_guard(WHERE_PEERS):
                mgr.pdwarden.metrics.peers.bind(bootstrap_room, [peer_of_address(bootstrap_addr)])

    def init(self, prefill_dp_rank: int) -> None:
        mgr = self.kv_mgr
        if isinstance(mgr, HardenedNixlKVManager):
            mgr._pdw_stall_flip()
            if self.conclude_state is None and self._pdw_refuse_over_bound(mgr):
                return
        super().init(prefill_dp_rank)

    def _pdw_refuse_over_bound(self, mgr: HardenedNixlKVManager) -> bool:
        """Fail the room before it registers or publishes anything when its writer holds
        more than its bound (as SGLang fails a room whose bootstrap info it cannot fetch:
        no bootstrap info, so no ABORT and no drain wait arms for pages never published)."""
        reason = None
        with mgr._pdw_guard(WHERE_PEERS):
            reason = mgr._pdw_over_bound(self.bootstrap_addr)
        if reason is None:
            return False
        room = self.bootstrap_room
        mgr.record_failure(room, reason)
        self.conclude_state = KVPoll.Failed
        mgr.update_status(room, KVPoll.Failed)
        self.bootstrap_infos = None
        return True

    @classmethod
    def _connect(cls, endpoint: str, is_ipv6: bool = False) -> tuple[Any, Any]:
        # Every message a decode sends a prefill (registration, metadata, ABORT, staging
        # replies) goes through a socket from here: it carries the side channel's proof.
        sock, lock = super()._connect(endpoint, is_ipv6=is_ipv6)
        keys = installed_config().side_keys
        return (sock if keys.signer is None else SigningSocket(sock, keys)), lock

    def _get_bootstrap_info_from_server(
        self, prefill_dp_rank: Any, prefill_cp_rank: Any, target_tp_rank: Any, target_pp_rank: Any
    ) -> Any:
        # The one place SGLang's decode learns a rank's address (the summary it reads first
        # names none; a cached answer was checked when fetched): checked here, before SGLang
        # registers with or publishes pages to it.
        keys = installed_config().side_keys
        check = None
        if keys.keyed:  # SGLang asks on this session (one per thread and prefill)
            session = _get_bootstrap_session(self.bootstrap_addr)
            if keys.signer is not None:
                session.headers[PROOF_HEADER] = route_read_proof(keys.signer)
            check = answer_check(session, keys)
            check.take_refusal()  # a refusal left by a fetch that did not reach this one
        info = super()._get_bootstrap_info_from_server(
            prefill_dp_rank, prefill_cp_rank, target_tp_rank, target_pp_rank
        )
        mgr = self.kv_mgr
        if check is not None and check.take_refusal() and isinstance(mgr, HardenedNixlKVManager):
            # SGLang got None: it fails the room ("Could not fetch bootstrap info").
            with mgr._pdw_guard(WHERE_SIDE_CHANNEL):
                mgr._pdw_unproven_route(self.bootstrap_addr)
        return info

    def send_metadata(self, kv_indices: Any, *args: Any, **kwargs: Any) -> None:
        mgr = self.kv_mgr
        if (
            isinstance(mgr, HardenedNixlKVManager)
            and self.conclude_state is None
            and getattr(self, "bootstrap_infos", None) is not None
            and self._pdw_refuse_over_bound(mgr)
        ):
            # The writer went over its bound while this request waited for pages: nothing is
            # published, SGLang frees the pages (no drain wait: no bootstrap info).
            return
        super().send_metadata(kv_indices, *args, **kwargs)
        mgr = self.kv_mgr
        room = self.bootstrap_room
        if isinstance(mgr, HardenedNixlKVManager) and self.init_time is not None and room is not None:
            with mgr._pdw_guard(WHERE_PEERS):  # published: the prefill may write these pages now
                addr = self.bootstrap_addr
                to = mgr._pdw_writers.identity(addr) if mgr._pdw_writers is not None else None
                mgr.pdwarden.held_pages.published(room, peer_of_address(addr), addr, len(kv_indices), to)

    def poll(self) -> Any:
        mgr = self.kv_mgr
        if not isinstance(mgr, HardenedNixlKVManager):
            return super().poll()
        # inflight_deadline: it also holds when the reaper thread is starved of the GIL (the
        # engine polls every room anyway; O(1) while nothing is due).
        with mgr._pdw_guard(WHERE_DEADLINE):
            mgr.pdwarden.tracker.maybe_expire()
        state = super().poll()
        room = self.bootstrap_room
        if int(state) == KVPoll.Failed:
            deadline_rooms = mgr.pdwarden.decode_deadline_rooms
            if room in deadline_rooms:
                # inflight_deadline on decode: the prefill may be alive and still writing.
                # Abort it (both engines poll here) so its pages are held until it drains.
                deadline_rooms.discard(room)
                with mgr._pdw_guard(WHERE_DEADLINE):
                    self.ensure_abort_notified()
        return state

    def clear(self) -> None:
        super().clear()
        mgr = self.kv_mgr
        room = self.bootstrap_room
        if isinstance(mgr, HardenedNixlKVManager) and room is not None:
            mgr.pdwarden.held_pages.concluded(room)  # held pages stay until freed
            mgr.pdwarden.decode_deadline_rooms.discard(room)


class HardenedNixlKVBootstrapServer(NixlKVBootstrapServer):
    """NixlKVBootstrapServer that also says which process it is (``INCARNATION_PATH``): a
    decode holding pages for this prefill learns from a new answer that the old writer is
    gone (``writer_watch``). It takes rank registrations and gives ranks' addresses only
    with the side channel's proof, and registrations only of this pod's ranks
    (``bootstrap_guard``). The incarnation stays open: it names nothing a caller can use,
    and a decode whose key differs from the prefill's during a key's rollout must still
    learn that the writer is gone."""

    def __init__(self, host: str, port: int) -> None:
        # Before SGLang's __init__: it starts serving at its end.
        self._pdw_gate = RouteGate.for_server(
            installed_config().side_keys, _own_addresses(host), _multi_node()
        )
        self._pdw_refusals = DropLog("pdwarden KV bootstrap server", events="request(s) refused (403)")
        super().__init__(host, port)

    def _setup_routes(self) -> None:
        super()._setup_routes()
        self.app.router.add_get(INCARNATION_PATH, _incarnation)

    async def _handle_route(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.read() if request.method == "PUT" else b""
        refusal = self._pdw_gate.refusal(
            request.method, request.query, request.headers.get(PROOF_HEADER), body
        )
        if refusal is not None:
            self._pdw_refusals.dropped(f"{request.method} {request.path} from {request.remote}: {refusal}")
            return web.Response(status=403, text=refusal)
        response = await super()._handle_route(request)
        keys = self._pdw_gate.keys
        if (
            keys.signer is not None
            and request.method == "GET"
            and is_rank_query(request.query)
            and response.status == 200
            and isinstance(response.body, bytes)
        ):
            # A decode publishes its pages only to a rank named by a key holder's answer.
            response.headers[ANSWER_PROOF_HEADER] = route_answer_proof(keys.signer, response.body)
        return response


def _own_addresses(host: str) -> list[str | None]:
    """This pod's addresses: the bootstrap server's own, and the one SGLang's ranks register
    (``SGLANG_HOST_IP``, else the address SGLang finds on the pod's network interface)."""
    from sglang.srt.utils.network import get_local_ip_auto

    try:
        local: str | None = get_local_ip_auto()
    except Exception:
        local = None
    return [host, local]


def _multi_node() -> bool:
    """A replica over several pods: ranks of the other pods register here too."""
    try:
        from sglang.srt.runtime_context import get_server_args

        return int(getattr(get_server_args(), "nnodes", 1) or 1) > 1
    except Exception:  # no SGLang server arguments here: the synthetic engine's one process
        return False


async def _incarnation(request: Any) -> Any:
    from aiohttp import web

    return web.json_response(incarnation_body())


def _pool_pages(args: Any) -> int | None:
    """Pages of the KV pool the manager registered (each buffer holds that many items)."""
    try:
        return int(args.kv_data_lens[0] // args.kv_item_lens[0])
    except (AttributeError, IndexError, TypeError, ZeroDivisionError):
        return None


HARDENED_CLASSES: Final = {
    "NixlKVManager": HardenedNixlKVManager,
    "NixlKVSender": HardenedNixlKVSender,
    "NixlKVReceiver": HardenedNixlKVReceiver,
    "NixlKVBootstrapServer": HardenedNixlKVBootstrapServer,
}

"""SGLang's NIXL KV classes, hardened by subclassing (no SGLang code is copied).

This module is the seam: each SGLang method pdwarden changes is overridden here in a line
or two that hands it to the collaborator owning that concern (the fixes are ``Fix``):

- ``status_writes.StatusWriter`` (``sticky_status``): ``request_status`` is a
  ``RoomStatusMap`` over pdwarden's ``RoomStatusTable``, and ``update_status`` does what
  ``STATUS_WRITES`` names for the write (opening, decode's metadata, failure...); the table
  then allows or refuses the move (``STICKY_TRANSITIONS``; legacy ``max()`` without the fix).
- ``skip_guard.SkipGuard`` (``no_silent_skip``, prefill): a chunk, ABORT or metadata SGLang
  would drop silently fails its room aloud; decode gets ``KV_STATUS Failed`` once, when no
  chunk of the room can still write into its pages (``worker_queues``: chunk accounting).
- ``transfer_guard.TransferGuard`` (``transfer_deadline``, prefill): handles in PROC past the
  deadline are quarantined, never reported settled; drain ACKs wait for the quarantine.
- ``deadline_guard.DeadlineGuard`` (``inflight_deadline``): rooms waiting or moving KV too
  long are failed. A prefill room still waiting for decode's metadata is bounded by the same
  deadline: SGLang's bootstrap timeout (300 s) is lowered to it.
- ``pages_guard.PagesGuard`` (decode): pages held for their writer until its drain ACK or
  proof it is gone (``writer_watch``), new requests to a writer over its bound refused
  before anything is published (``writer_bound``), and the receiver's hooks.
- ``side_guard.SideChannelGuard`` (every mode; a proof only with the model's worker key):
  messages checked on receipt and signed on the way out; the bootstrap server below refuses
  unproven ``/route`` requests (``bootstrap_guard``).
- ``faults.fault_set.FaultSet``: the test faults, as hooks the overrides always call; with
  no fault on they do nothing (``faults.hooks.NO_FAULTS``).
- ``metrics``: the table, tracker, RuntimeMetrics and thread watch live in ``RoomRuntime``
  (``mgr.pdwarden``). Every hook pdwarden adds inside SGLang's threads runs under
  ``RoomRuntime.guard``: an exception in it is logged and counted
  (``pdwarden_runtime_errors_total{where}``) and the thread goes on.

The collaborators reach SGLang's own methods of the manager through ``stock`` (the
manager's ``super()``), and its overridden ones through the manager.
"""

from __future__ import annotations

import functools
from typing import Any, Final

from sglang.srt.disaggregation.nixl.conn import (
    NixlKVBootstrapServer,
    NixlKVManager,
    NixlKVReceiver,
    NixlKVSender,
)
from sglang.srt.disaggregation.utils import DisaggregationMode

from pdwarden_contract import ROLE_DECODE, ROLE_PREFILL
from pdwarden_runtime.hardening.bootstrap_guard import (
    ANSWER_PROOF_HEADER,
    PROOF_HEADER,
    RouteGate,
    is_rank_query,
    route_answer_proof,
)
from pdwarden_runtime.hardening.config import Fix, installed_config
from pdwarden_runtime.hardening.deadline_guard import DeadlineGuard
from pdwarden_runtime.hardening.faults.fault_set import FaultSet
from pdwarden_runtime.hardening.pages_guard import PagesGuard
from pdwarden_runtime.hardening.runtime import RoomRuntime
from pdwarden_runtime.hardening.side_guard import (
    SideChannelGuard,
    checked_route_fetch,
    refuse_unsigned_staging,
    signing_connect,
)
from pdwarden_runtime.hardening.side_socket import CheckingSocket, DropLog
from pdwarden_runtime.hardening.skip_guard import SkipGuard
from pdwarden_runtime.hardening.status_writes import StatusWriter
from pdwarden_runtime.hardening.transfer_guard import TransferGuard
from pdwarden_runtime.hardening.worker_queues import ChunkSlot, WorkerQueues
from pdwarden_runtime.hardening.writer_watch import INCARNATION_PATH, incarnation_body


class HardenedNixlKVManager(NixlKVManager):
    """NixlKVManager with pdwarden's fixes (``Fix``; see the module docstring)."""

    pdwarden: RoomRuntime

    def __init__(
        self, args: Any, disaggregation_mode: Any, server_args: Any, is_mla_backend: bool | None = False
    ) -> None:
        config = installed_config()
        role = ROLE_PREFILL if disaggregation_mode == DisaggregationMode.PREFILL else ROLE_DECODE
        self.pdwarden = rt = RoomRuntime(config, role)
        refuse_unsigned_staging(config)
        # Everything SGLang's threads may call is built first: super().__init__ starts them.
        stock: Any = super()
        self._pdw_faults = FaultSet(config, role, args, self._pdw_forget_registrations)
        slot = ChunkSlot()
        self._pdw_side = SideChannelGuard(rt, stock)
        self._pdw_skip = SkipGuard(self, stock, rt, self._pdw_faults)
        self._pdw_transfer = TransferGuard(self, stock, rt, slot, self._pdw_faults, self._pdw_skip)
        self._pdw_pages = PagesGuard(self, stock, rt)
        self._pdw_status = StatusWriter(self, stock, rt, self._pdw_skip)
        self._pdw_queues = WorkerQueues(rt, slot, self._pdw_transfer.fail_if_peer_stalled, self._pdw_skip)
        role_fails = (
            self._pdw_skip.deadline_failed if role == ROLE_PREFILL else self._pdw_pages.deadline_failed
        )
        self._pdw_deadline = DeadlineGuard(self, rt, role_fails)
        if role == ROLE_PREFILL and config.has(Fix.TRANSFER_DEADLINE):
            self._pdw_transfer.build_quarantine()
        with rt.threads.record_started():
            super().__init__(args, disaggregation_mode, server_args, is_mla_backend)
        if role == ROLE_PREFILL:
            queues: list[Any] = list(self.transfer_queues)  # type: ignore[has-type]
            self.transfer_queues = [self._pdw_queues.watched(q) for q in queues]
        rt.tracker.on_deadline = self._pdw_deadline.rooms_due
        deadline = rt.tracker.deadline
        if role == ROLE_PREFILL and deadline is not None:
            # inflight_deadline: SGLang's sender fails a room still Bootstrapping after this many seconds.
            self.bootstrap_timeout: float = min(float(self.bootstrap_timeout), deadline)
        self._pdw_transfer.start()
        if role == ROLE_DECODE:
            self._pdw_pages.watch_writers()
        rt.pool_pages = _pool_pages(args)
        rt.start()

    def _pdw_forget_registrations(self) -> None:
        """Forget the prefills this decode registered with (SGLang registers once each)."""
        with self.connection_lock:
            self.connection_pool.clear()

    # --- the side channel (side_guard) ----------------------------------------------------
    @property
    def server_socket(self) -> Any:
        return self._pdw_server_socket

    @server_socket.setter
    def server_socket(self, sock: Any) -> None:
        # CommonKVManager.__init__ binds it before SGLang's reading thread starts: that
        # thread only ever sees the checking socket.
        self._pdw_server_socket: CheckingSocket = self._pdw_side.checking_socket(sock)

    def _send_multipart_locked(self, endpoint: str, parts: list[bytes], is_ipv6: bool = False) -> None:
        self._pdw_side.send(endpoint, parts, is_ipv6)

    def _register_topology_row(self, url: str, payload: dict[str, Any]) -> None:
        self._pdw_side.register_topology_row(url, payload)

    def _add_remote_peer(self, decode_kv_args: Any) -> None:
        self._pdw_side.add_remote_peer(decode_kv_args, self.decode_kv_args_table)

    # --- status writes (status_writes) ----------------------------------------------------
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
        self._pdw_status.update_status(bootstrap_room, status)

    # --- prefill: rooms concluded aloud (skip_guard, worker_queues) -----------------------
    def send_kv_status_message(
        self,
        *,
        targets: list[tuple[str, int]],
        bootstrap_room: int,
        status: Any,
        failure_reason: str | None = None,
    ) -> None:
        self._pdw_skip.status_message(targets, bootstrap_room, status, failure_reason)

    def transfer_worker(self, queue: Any, staging_buffer: Any = None, worker_index: int = 0) -> None:
        super().transfer_worker(self._pdw_queues.watched(queue), staging_buffer, worker_index)

    def add_transfer_request(self, bootstrap_room: int, *args: Any, **kwargs: Any) -> Any:
        return self._pdw_skip.add_transfer_request(bootstrap_room, *args, **kwargs)

    def _handle_abort_notification(self, msg: list[bytes]) -> bool:
        return self._pdw_skip.abort_message(msg)

    # --- prefill: stalled handles and drain ACKs (transfer_guard) -------------------------
    def _await_handles(self, handles: list[Any], *, failure_seen: bool) -> tuple[bool, bool]:
        return self._pdw_transfer.await_handles(handles, failure_seen)

    def record_failure(self, bootstrap_room: int, failure_reason: str) -> None:
        self._pdw_transfer.record_failure(bootstrap_room, failure_reason)

    def poison_deferred_ack_room(self, room: int) -> None:
        self._pdw_transfer.poison_deferred_ack_room(room)

    def _maybe_ack_drained_abort(self, room: int) -> None:
        self._pdw_transfer.ack_drained_abort(room)

    def check_status(self, bootstrap_room: int) -> Any:
        return self._pdw_transfer.check_status(bootstrap_room)

    # --- decode: the messages a receiver sends (faults: stall-kv-receive) -----------------
    def build_receiver_registration_message(self) -> list[bytes]:
        message = list(super().build_receiver_registration_message())
        return self._pdw_faults.active().registration_message(message)

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
        message = super().build_receiver_metadata_message(
            bootstrap_room=bootstrap_room,
            required_dst_info_num=required_dst_info_num,
            kv_indices=kv_indices,
            aux_index=aux_index,
            state_indices=state_indices,
            decode_prefix_len=decode_prefix_len,
            is_dummy=is_dummy,
            device_kv_indices=device_kv_indices,
        )
        return self._pdw_faults.active().metadata_message(list(message))

    # --- decode: pages held for their writer (pages_guard) --------------------------------
    def register_deferred_abort_room(self, bootstrap_room: int) -> int:
        return self._pdw_pages.hold(bootstrap_room)

    def is_abort_release_safe(self, bootstrap_room: int, required_acks: int) -> bool:
        return self._pdw_pages.release_safe(bootstrap_room, required_acks)

    def clear_deferred_abort_state(self, bootstrap_room: int) -> None:
        self._pdw_pages.release(bootstrap_room)

    def writer_refusals(self) -> dict[str, int]:
        """Decode requests refused before publishing, by reason (for /debug/state)."""
        return self._pdw_pages.refusals.counts()

    def shutdown_pdwarden(self) -> None:
        self._pdw_transfer.stop()
        self._pdw_pages.stop()
        self.pdwarden.stop()


class HardenedNixlKVSender(NixlKVSender):
    """NixlKVSender that tells the manager which room it owns, and when its lifecycle ends."""

    def __init__(self, mgr: Any, bootstrap_addr: str, bootstrap_room: int, *args: Any, **kwargs: Any) -> None:
        if isinstance(mgr, HardenedNixlKVManager):
            mgr._pdw_skip.owners.sender_created(bootstrap_room)
        super().__init__(mgr, bootstrap_addr, bootstrap_room, *args, **kwargs)

    def clear(self) -> None:
        super().clear()
        mgr = self.kv_mgr
        if isinstance(mgr, HardenedNixlKVManager):
            mgr._pdw_skip.room_cleared(self.bootstrap_room)


class HardenedNixlKVReceiver(NixlKVReceiver):
    """NixlKVReceiver (decode); its manager's table is already the sticky one. Its hooks are
    the pages guard's (``PagesGuard``) and the side channel's (``side_guard``)."""

    def __init__(self, mgr: Any, bootstrap_addr: str, bootstrap_room: int | None = None) -> None:
        super().__init__(mgr, bootstrap_addr, bootstrap_room)
        if (
            isinstance(mgr, HardenedNixlKVManager)
            and bootstrap_room is not None
            and self.conclude_state is None
        ):
            mgr._pdw_pages.receiver_opened(bootstrap_room, bootstrap_addr)

    def init(self, prefill_dp_rank: int) -> None:
        mgr = self.kv_mgr
        if isinstance(mgr, HardenedNixlKVManager):
            mgr._pdw_faults.receiver_starting()
            if self.conclude_state is None and mgr._pdw_pages.refuse_over_bound(self):
                return
        super().init(prefill_dp_rank)

    @classmethod
    def _connect(cls, endpoint: str, is_ipv6: bool = False) -> tuple[Any, Any]:
        # Every message a decode sends a prefill goes through a socket from here.
        sock, lock = super()._connect(endpoint, is_ipv6=is_ipv6)
        return signing_connect(sock, installed_config().side_keys), lock

    def _get_bootstrap_info_from_server(
        self, prefill_dp_rank: Any, prefill_cp_rank: Any, target_tp_rank: Any, target_pp_rank: Any
    ) -> Any:
        fetch = functools.partial(
            super()._get_bootstrap_info_from_server,
            prefill_dp_rank,
            prefill_cp_rank,
            target_tp_rank,
            target_pp_rank,
        )
        return checked_route_fetch(
            self.bootstrap_addr, installed_config().side_keys, fetch, self._pdw_refused
        )

    def _pdw_refused(self) -> None:
        mgr = self.kv_mgr
        if isinstance(mgr, HardenedNixlKVManager):
            mgr._pdw_pages.unproven_route(self.bootstrap_addr)

    def send_metadata(self, kv_indices: Any, *args: Any, **kwargs: Any) -> None:
        mgr = self.kv_mgr
        if (
            isinstance(mgr, HardenedNixlKVManager)
            and self.conclude_state is None
            and getattr(self, "bootstrap_infos", None) is not None
            and mgr._pdw_pages.refuse_over_bound(self)
        ):
            # The writer went over its bound while this request waited for pages: nothing is
            # published, SGLang frees the pages (no drain wait: no bootstrap info).
            return
        super().send_metadata(kv_indices, *args, **kwargs)
        room = self.bootstrap_room
        if isinstance(mgr, HardenedNixlKVManager) and self.init_time is not None and room is not None:
            mgr._pdw_pages.published(room, self.bootstrap_addr, kv_indices)

    def poll(self) -> Any:
        mgr = self.kv_mgr
        if not isinstance(mgr, HardenedNixlKVManager):
            return super().poll()
        return mgr._pdw_pages.poll(self, super().poll)

    def clear(self) -> None:
        super().clear()
        mgr = self.kv_mgr
        room = self.bootstrap_room
        if isinstance(mgr, HardenedNixlKVManager) and room is not None:
            mgr._pdw_pages.receiver_cleared(room)


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

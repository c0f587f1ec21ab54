"""The synthetic engine: the PD path of SGLang on CPU, without a model.

One process per role. Its KV pool is torch tensors registered with NIXL as DRAM by
SGLang's own (hardened) NixlKVManager; requests move through SGLang's real
NixlKVSender/NixlKVReceiver exactly as SGLang's schedulers drive them:

- prefill: open a sender (Bootstrapping) -> wait for decode's metadata (WaitingForInput)
  -> fill the request's pages deterministically, chunk by chunk, ``send()`` each chunk ->
  poll until Success/Failed (SGLang's inflight queue) -> ``clear()``.
- decode: open a receiver, resolve the prefill at ``bootstrap_host:bootstrap_port``,
  allocate pages and an aux slot, ``send_metadata()`` -> poll until Success/Failed ->
  verify every page and aux byte -> produce synthetic tokens one by one
  (``token_interval_ms`` apart), holding the request's pages until the last.

Every serving route reaches ``generate`` as one native body (``synthetic_api``), so this PD
path is the same whatever the route; a stream's tokens go out through a ``TokenSink``. A client
that disconnects aborts its request (``sender.abort()`` / ``receiver.abort()``, as SGLang
does; mid-answer, before decode's next token); decode keeps an aborted request's pages until
prefill acknowledges the drain (SGLang's deferred KV release) or the writer is proven gone
(``hardening.writer_watch``), never on a timer, so a late write cannot corrupt a later
request. A decode request that ends before its metadata went out (no pages in time, an
error, a disconnect) still sends prefill its ABORT, so the prefill room ends at once
instead of waiting for metadata that never comes. Requests wait in FIFO order for KV pages
(``kv_admission``), as SGLang's queues hold them, instead of failing when the pool is
full; a room number is used once per process (a resend of the same request is refused).
Blocking SGLang calls (bootstrap HTTP) run in a thread pool; status changes wake the
waiting request through the manager's status listener.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Protocol

import numpy as np

import pdwarden_contract as c
from pdwarden_runtime.engines.kv_admission import KVAdmission
from pdwarden_runtime.engines.synthetic_pattern import (
    BadRequest,
    RequestSpec,
    fill,
    output_ids,
    verify,
    verify_pages,
)
from pdwarden_runtime.engines.synthetic_shapes import native_output
from pdwarden_runtime.hardening import HardeningConfig, install
from pdwarden_runtime.hardening.config import FaultSwitch
from pdwarden_runtime.hardening.deadline_guard import REASON_INFLIGHT_DEADLINE
from pdwarden_runtime.hardening.handle_wait import REASON_HANDLE_DEADLINE
from pdwarden_runtime.hardening.mirror import StockMirror, wake_on_status_change
from pdwarden_runtime.hardening.nixl import HardenedNixlKVManager
from pdwarden_runtime.hardening.runtime import RoomRuntime
from pdwarden_runtime.hardening.transfer_guard import REASON_PEER_STALLED
from pdwarden_runtime.kvpoll import KVPoll
from pdwarden_runtime.transfer.context import publish_sglang_context
from pdwarden_runtime.transfer.kvpool import KVPool, PoolShape

log = logging.getLogger(__name__)

ENGINE_NAME: Final = "synthetic"
# A waiting request re-polls at least this often even without a status change (SGLang's
# own timeouts are evaluated inside poll()).
REPOLL_S: Final = 0.05
PARALLEL_INFO_TIMEOUT_S: Final = 30.0
# How long a request may wait for KV pages when the inflight deadline is off (SGLang's own
# bootstrap and waiting timeouts have this default).
ADMISSION_TIMEOUT_S: Final = 300.0


@dataclass(frozen=True)
class SyntheticOptions:
    role: str
    host: str
    port: int
    bootstrap_port: int
    metrics_port: int
    model: str = "pdwarden/synthetic"
    page_size: int = 16
    pool_pages: int = 1024
    layers: int = 4
    page_bytes: int = 16 * 1024
    aux_slots: int = 512
    chunk_pages: int = 8
    compute_ms_per_chunk: float = 0.0
    # Decode: the pace of its tokens (0: all at once), so a stream lasts long enough to be read
    # and cancelled mid-answer.
    token_interval_ms: float = 0.0

    def shape(self) -> PoolShape:
        return PoolShape(
            layers=self.layers,
            pages=self.pool_pages,
            page_bytes=self.page_bytes,
            aux_slots=self.aux_slots,
            page_size_tokens=self.page_size,
        )


# What a request whose room ended Failed answers: SGLang's own status for a failed KV
# transfer (its decode and prefill abort such a request with 500), except where the runtime's
# deadline ended it: 503, the room's pair could not serve it in time and another may (smg
# retries both on a new pair and a new bootstrap_room; 503 also says the failure is no fault of
# the request).
KV_FAILED_STATUS: Final = 500
DEADLINE_STATUS: Final = 503
# How the hardening's deadline reasons begin (transfer deadline: a stalled handle, or a room for
# a decode peer with one; inflight deadline: a room that waited for or moved KV too long), read
# from the reasons themselves.
DEADLINE_REASON_PREFIXES: Final = tuple(
    {
        r.partition(":")[0] + ":"
        for r in (REASON_HANDLE_DEADLINE, REASON_PEER_STALLED, REASON_INFLIGHT_DEADLINE)
    }
)


def failed_room_status(reason: str) -> int:
    """The HTTP status of a request whose room ended Failed for ``reason``."""
    return DEADLINE_STATUS if reason.startswith(DEADLINE_REASON_PREFIXES) else KV_FAILED_STATUS


class RequestFailed(Exception):
    """The KV transfer of a request ended Failed (reason from SGLang/pdwarden)."""

    def __init__(self, reason: str, status: int = KV_FAILED_STATUS) -> None:
        super().__init__(reason)
        self.status = status

    @classmethod
    def room(cls, reason: str) -> RequestFailed:
        """A request whose room ended Failed: the status says whether a deadline ended it."""
        return cls(reason, failed_room_status(reason))


class ClientGone(Exception):
    """The client of a request hung up while decode was producing its tokens."""


class TokenSink(Protocol):
    """Where decode's tokens go as they are produced: the HTTP answer of one request."""

    streaming: bool  # emit() wants every intermediate output (a stream)

    def gone(self) -> bool:
        """The client hung up."""

    async def emit(self, out: dict[str, Any]) -> None:
        """Send one intermediate native output; ClientGone when the client is gone."""


class _Waiters:
    """asyncio wake-ups for rooms, fed from SGLang's threads via the status listener."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._events: dict[int, asyncio.Event] = {}

    def listener(self, room: int) -> None:  # any thread
        if room in self._events:
            self._loop.call_soon_threadsafe(self._wake, room)

    def _wake(self, room: int) -> None:
        event = self._events.get(room)
        if event is not None:
            event.set()

    def register(self, room: int) -> asyncio.Event:
        event = self._events[room] = asyncio.Event()
        return event

    def drop(self, room: int) -> None:
        self._events.pop(room, None)

    async def until(self, room: int, poll: Any, wanted: Iterable[int], timeout: float | None = None) -> int:
        wanted = frozenset(int(w) for w in wanted)
        event = self._events.get(room) or self.register(room)
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            event.clear()
            state = int(poll())
            if state in wanted:
                return state
            if end is not None and time.monotonic() >= end:
                return state
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow the
                # cancellation of a client disconnect when the event fires at once.
                async with asyncio.timeout(REPOLL_S):
                    await event.wait()
            except TimeoutError:
                pass


class SyntheticEngine:
    """Shared part of both roles: the pool, the hardened manager, request bookkeeping."""

    def __init__(self, options: SyntheticOptions, hardening: HardeningConfig) -> None:
        self.options = options
        self.hardening = hardening
        self.pool = KVPool(options.shape())
        self.mgr: Any = None
        # pdwarden's view of the rooms: the hardened manager's own, or (stock classes)
        # one a StockMirror fills from SGLang's dict.
        self.rt: RoomRuntime | None = None
        self._mirror: StockMirror | None = None
        self.bootstrap_server: Any = None
        self.pending: dict[int, str] = {}
        self.completed = 0
        self.failed = 0
        self.aborted = 0
        self.verify_failures = 0
        # decode's tokens: produced, produced after their client hung up (a cancellation that
        # came late), and requests whose client hung up mid-answer
        self.tokens_produced = 0
        self.tokens_after_hangup = 0
        self.hangups = 0
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="synthetic")
        self._waiters: _Waiters | None = None
        self._admission: KVAdmission | None = None
        self._ready = threading.Event()
        self._background: set[asyncio.Task[Any]] = set()

    @property
    def role(self) -> str:
        return self.options.role

    @property
    def fault(self) -> FaultSwitch:
        return self.hardening.fault

    async def start(self) -> None:
        """Build SGLang's KV manager (and, on prefill, its bootstrap server)."""
        loop = asyncio.get_running_loop()
        self._waiters = _Waiters(loop)
        self._admission = KVAdmission(self.pool, loop)
        await loop.run_in_executor(self._executor, self._start_blocking)
        assert self.rt is not None
        self.rt.status_listeners.append(self._waiters.listener)
        self.rt.pages_in_use = lambda: self.options.pool_pages - self.pool.free_pages
        self._ready.set()

    def _start_blocking(self) -> None:
        install(self.hardening)
        o = self.options
        publish_sglang_context(host=o.host, bootstrap_port=o.bootstrap_port, http_port=o.port)
        from sglang.srt.disaggregation.utils import (
            DisaggregationMode,
            KVClassType,
            TransferBackend,
            get_kv_class,
        )

        if self.role == c.ROLE_PREFILL:
            server_cls = get_kv_class(TransferBackend.NIXL, KVClassType.BOOTSTRAP_SERVER)
            self.bootstrap_server = server_cls(host=o.host, port=o.bootstrap_port)
            mode = DisaggregationMode.PREFILL
        else:
            mode = DisaggregationMode.DECODE
        manager_cls = get_kv_class(TransferBackend.NIXL, KVClassType.MANAGER)
        if self.hardening.stock_classes:
            from sglang.srt.disaggregation.nixl.conn import NixlKVManager

            if manager_cls is not NixlKVManager:
                raise RuntimeError(
                    f"--hardening off must run SGLang's NixlKVManager, got {manager_cls.__name__}"
                )
            self.rt = RoomRuntime(self.hardening, self.role)
            with self.rt.threads.record_started():
                self.mgr = manager_cls(self.pool.kv_args(), mode, None)
            self._mirror = StockMirror(self.rt, self.mgr)
            if self.hardening.stock_prompt_wake:  # bench only (bench-stock-prompt-wake)
                wake_on_status_change(self.rt, self.mgr)
            self._mirror.start()
            self.rt.start()
            return
        self.mgr = manager_cls(self.pool.kv_args(), mode, None)
        if not isinstance(self.mgr, HardenedNixlKVManager):
            raise RuntimeError(
                "the hardening seam did not take: SGLang built "
                f"{type(self.mgr).__name__}, not pdwarden's manager"
            )
        self.rt = self.mgr.pdwarden

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def sglang_threads_alive(self) -> dict[str, int]:
        """SGLang's NIXL threads of this process, by target (a dead bootstrap thread
        wedges every new prefill room: wedge mode 4)."""
        wanted = ("bootstrap_thread_guarded", "transfer_worker", "decode_listener_thread")
        counts = dict.fromkeys(wanted, 0)
        for thread in threading.enumerate():
            for name in wanted:
                if thread.name.endswith(f"({name})") and thread.is_alive():
                    counts[name] += 1
        return counts

    def healthy(self) -> tuple[bool, str]:
        if not self.ready:
            return False, "starting"
        assert self.rt is not None
        dead = self.rt.threads.dead()
        if dead:
            gone = ", ".join(f"{k} {a}/{n} alive" for k, (a, n) in sorted(dead.items()))
            return False, f"dead thread(s): {gone}"
        threads = self.sglang_threads_alive()
        if self.role == c.ROLE_PREFILL:
            if threads["bootstrap_thread_guarded"] < 1:
                return False, "SGLang's NIXL bootstrap thread is dead"
            if threads["transfer_worker"] < 1:
                return False, "no NIXL transfer worker is alive"
        elif threads["decode_listener_thread"] < 1:
            return False, "SGLang's decode listener thread is dead"
        return True, "ok"

    async def generate(self, body: Any, sink: TokenSink | None = None) -> dict[str, Any]:
        """Serve one native request body; its final native output (SGLang's shape)."""
        raise NotImplementedError

    @staticmethod
    def _failure_reason(endpoint: Any) -> str:
        """The failure reason of a sender's or receiver's room (and clear its record)."""
        from sglang.srt.disaggregation.common.conn import KVTransferError

        try:
            endpoint.failure_exception()  # clears the room, pops its failure record
        except KVTransferError as err:
            return err.failure_reason
        return "KV transfer failed"

    def _failure_reason_quiet(self, endpoint: Any) -> None:
        try:
            self._failure_reason(endpoint)
        except Exception:
            log.exception("clearing a room's failure record failed")

    def _give(self, pages: np.ndarray | None, aux: int | None) -> None:
        if self._admission is not None:
            self._admission.give(pages, aux)

    async def _take(self, spec: RequestSpec) -> tuple[np.ndarray, int]:
        """The request's pages and aux slot, after the requests queued before it; bounded
        by the inflight deadline (PagesExhausted past it)."""
        assert self._admission is not None
        return await self._admission.take(spec.pages, self.hardening.inflight_deadline or ADMISSION_TIMEOUT_S)

    def _claim_room(self, room: int) -> None:
        """A room number names one request: a second request with a live or recently ended
        room is refused (a router's resend of the same body must not reuse its KV pages)."""
        if room in self.pending or (self.rt is not None and self.rt.table.is_cleared(room)):
            raise RequestFailed(f"bootstrap_room {room} is already in use", status=409)

    async def health_generate(self) -> tuple[bool, str]:
        """A local round through the engine's own path: pool, pattern, SGLang threads
        (SGLang's own health_generate on a PD prefill also skips the transfer)."""
        ok, why = self.healthy()
        if not ok:
            return ok, why
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._local_round)

    def _local_round(self) -> tuple[bool, str]:
        spec = RequestSpec(room=0, tokens=self.options.page_size, pages=1, max_new_tokens=1, digest=1)
        assert self._admission is not None
        granted = self._admission.try_take(1)
        if granted is None:  # every page is serving requests: busy is not unhealthy
            return True, "ok (KV pool busy: local round skipped)"
        pages, aux = granted
        try:
            fill(self.pool, spec, pages, 0, aux)
            problems = verify(self.pool, spec, pages, aux)
            return (not problems), "; ".join(problems) or "ok"
        finally:
            self._give(pages, aux)

    def spec_for(self, body: Any) -> RequestSpec:
        return RequestSpec.from_body(body, self.options.page_size, self.options.pool_pages)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def debug_state(self) -> dict[str, Any]:
        mgr = self.mgr
        state: dict[str, Any] = {
            "role": self.role,
            "fault": self.fault.active,
            "fixes": self.hardening.active_fixes(),
            "pending_requests": len(self.pending),
            "completed": self.completed,
            "failed": self.failed,
            "aborted": self.aborted,
            "verify_failures": self.verify_failures,
            "tokens_produced": self.tokens_produced,
            "tokens_after_hangup": self.tokens_after_hangup,
            "hangups": self.hangups,
            "free_pages": self.pool.free_pages,
            "total_pages": self.options.pool_pages,
            "free_aux": self.pool.free_aux,
            "total_aux": self.options.aux_slots,
            "background_tasks": len(self._background),
            "admission_waiting": self._admission.waiting if self._admission is not None else 0,
            "sglang_threads": self.sglang_threads_alive(),
            "stock_classes": self.hardening.stock_classes,
        }
        rt = self.rt
        if mgr is None or rt is None:
            return state
        quarantine = rt.quarantine
        state.update(
            {
                "threads_alive": rt.threads.alive(),
                "threads_expected": rt.threads.expected(),
                "quarantined_handles": rt.quarantined_handles(),
                "quarantine_ended": quarantine.ended() if quarantine is not None else {},
                "oldest_in_state": {
                    KVPoll(s).label: round(a, 3) for s, a in rt.table.oldest_in_state().items()
                },
                "rooms": {KVPoll(s).label: n for s, n in rt.table.counts().items() if n},
                "room_list": {str(r): KVPoll(s).label for r, s in list(rt.table.snapshot().items())[:50]},
                "refused": {
                    f"{getattr(a, 'label', a)}->{b.label}": n for (a, b), n in rt.table.refused().items()
                },
                "outcomes": rt.tracker.outcomes(),
                "inflight": rt.tracker.count(),
                "failure_records": len(mgr.failure_records),
                "handle_deadlines": rt.handle_deadlines,
                "peer_fast_fails": rt.peer_fast_fails,
                "failure_notices": rt.failure_notices,
                "skips_concluded": rt.silent_skips_concluded,
            }
        )
        if self.role == c.ROLE_PREFILL:
            state.update(
                {
                    "transfer_infos": len(mgr.transfer_infos),
                    "staging_outstanding": len(mgr._staging_outstanding),
                    "quarantined_rooms": quarantine.room_list()[:200] if quarantine is not None else [],
                    "ledger": rt.ledger.sizes(),
                    "transfer_queue_depth": sum(
                        q.qsize() if hasattr(q, "qsize") else 0 for q in getattr(mgr, "transfer_queues", [])
                    ),
                }
            )
        else:
            state.update(
                {
                    "prefill_response_tracker": len(mgr.prefill_response_tracker),
                    "required_prefill_response_num_table": len(mgr.required_prefill_response_num_table),
                    "deferred_abort_acks": len(mgr._deferred_abort_ack_tracker),
                    "writer_refusals": (
                        mgr.writer_refusals() if isinstance(mgr, HardenedNixlKVManager) else {}
                    ),
                    "held_rooms": [
                        {"room": h.room, "peer": h.peer, "pages": h.pages, "seconds": round(h.seconds, 3)}
                        for h in rt.held_pages.held()[:50]
                    ],
                    "freed_held_rooms": [
                        {
                            "room": f.room,
                            "peer": f.peer,
                            "pages": f.pages,
                            "seconds": round(f.held_seconds, 3),
                            "how": f.how,
                        }
                        for f in rt.held_pages.freed()[-50:]
                    ],
                }
            )
        return state

    async def close(self) -> None:
        if self._mirror is not None:
            self._mirror.stop()
        if isinstance(self.mgr, HardenedNixlKVManager):
            self.mgr.shutdown_pdwarden()
        elif self.rt is not None:
            self.rt.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)


class PrefillEngine(SyntheticEngine):
    """Prefill: bootstraps the room, fills and sends the request's KV pages."""

    async def generate(self, body: Any, sink: TokenSink | None = None) -> dict[str, Any]:
        started = time.perf_counter()
        spec = self.spec_for(body)
        assert self.mgr is not None and self._waiters is not None
        host = body.get("bootstrap_host") or self.options.host
        from sglang.srt.disaggregation.utils import KVClassType, TransferBackend, get_kv_class

        sender_cls = get_kv_class(TransferBackend.NIXL, KVClassType.SENDER)
        room = spec.room
        self._claim_room(room)
        self.pending[room] = "bootstrapping"
        self._waiters.register(room)
        sender = sender_cls(self.mgr, f"{host}:{self.options.bootstrap_port}", room)
        pages: np.ndarray | None = None
        aux: int | None = None
        concluded = False
        try:
            state = await self._waiters.until(
                room,
                sender.poll,
                (KVPoll.WaitingForInput, KVPoll.Failed, KVPoll.Transferring, KVPoll.Success),
            )
            if state != KVPoll.Failed:
                self.pending[room] = "admission"
                pages, aux = await self._take(spec)
                state = await self._send(sender, body, spec, pages, aux)
            concluded = True
            if state == KVPoll.Success:
                metric = sender.get_transfer_metric()
                sender.clear()
                self.completed += 1
                # SGLang's prefill ends its request with FINISH_LENGTH(0) once the KV is sent
                extras = {
                    "bootstrap_room": room,
                    "kv_pages": spec.pages,
                    "kv_transfer_latency_s": metric.transfer_latency_s,
                    "kv_transfer_bytes": metric.transfer_total_bytes,
                }
                return native_output(
                    _rid(body, room), spec.tokens, [], finished=True, started=started, extras=extras
                )
            self.failed += 1
            raise RequestFailed.room(self._failure_reason(sender))
        except asyncio.CancelledError:
            if not concluded:
                self.aborted += 1
                sender.abort()
                self._failure_reason(sender)
                concluded = True
            raise
        finally:
            if not concluded:  # an unexpected error: never leave the room open
                sender.abort()
                self._failure_reason(sender)
            self._waiters.drop(room)
            self.pending.pop(room, None)
            # Chunks of a failed room may still be read by a worker; their bytes only
            # reach decode pages that decode holds until the drain (or discards).
            self._give(pages, aux)

    async def _send(self, sender: Any, body: Any, spec: RequestSpec, pages: np.ndarray, aux: int) -> int:
        """Fill the request's pages and send them chunk by chunk; the room's final status."""
        assert self._waiters is not None
        room = spec.room
        if sender.poll() == KVPoll.Failed:  # failed while it waited for pages (decode's ABORT)
            return int(KVPoll.Failed)
        self.pending[room] = "sending"
        sender.init(spec.pages, aux_index=aux)
        step = max(1, self.options.chunk_pages)
        compute_ms = self._compute_ms(body)
        # The request's KV is computed first (one fill), then sent chunk by chunk (with the
        # simulated compute between chunks): SGLang's transfer latency then measures the
        # transfer path alone.
        fill(self.pool, spec, pages, 0, aux)
        for first in range(0, spec.pages, step):
            last = first + step >= spec.pages
            sender.send(pages[first : first + step])
            if compute_ms > 0 and not last:
                await asyncio.sleep(compute_ms / 1000)
        self.pending[room] = "inflight"
        return await self._waiters.until(room, sender.poll, (KVPoll.Success, KVPoll.Failed))

    def _compute_ms(self, body: dict[str, Any]) -> float:
        """Simulated compute per chunk: the flag, or the request's ``synthetic_compute_ms``
        (a synthetic-engine knob so a test can hold a transfer open between chunks)."""
        value = body.get("synthetic_compute_ms", self.options.compute_ms_per_chunk)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 60000:
            raise BadRequest(f"synthetic_compute_ms must be a number in [0, 60000], got {value!r}")
        return float(value)


class DecodeEngine(SyntheticEngine):
    """Decode: receives the request's KV pages, verifies them, answers with tokens."""

    def __init__(self, options: SyntheticOptions, hardening: HardeningConfig) -> None:
        super().__init__(options, hardening)
        self._prefill_lock = asyncio.Lock()

    async def _ensure_prefill(self, addr: str) -> None:
        """SGLang's decode knows the prefill at ``addr`` (it forgets one whose heartbeat
        failed, so a prefill that restarted is asked again)."""
        assert self.mgr is not None
        if addr in self.mgr.prefill_info_table:
            return
        loop = asyncio.get_running_loop()
        end = time.monotonic() + PARALLEL_INFO_TIMEOUT_S
        async with self._prefill_lock:
            while addr not in self.mgr.prefill_info_table:
                if await loop.run_in_executor(self._executor, self.mgr.try_ensure_parallel_info, addr):
                    return
                if time.monotonic() > end:
                    raise RequestFailed(f"prefill bootstrap server at {addr} is not reachable", status=503)
                await asyncio.sleep(0.2)

    async def generate(self, body: Any, sink: TokenSink | None = None) -> dict[str, Any]:
        started = time.perf_counter()
        spec = self.spec_for(body)
        pages, aux = await self._receive(body, spec)
        room, rid = spec.room, _rid(body, spec.room)
        # The request holds its pages while it decodes, as SGLang's decode holds its KV.
        try:
            ids = await self._decode(spec, rid, sink, started)
        except (asyncio.CancelledError, ClientGone):
            self.aborted += 1
            self.hangups += 1
            raise
        finally:
            self.pending.pop(room, None)
            self._give(pages, aux)
        self.completed += 1
        extras = {"bootstrap_room": room, "kv_pages": spec.pages, "kv_verified": True}
        return native_output(rid, spec.tokens, ids, finished=True, started=started, extras=extras)

    async def _decode(self, spec: RequestSpec, rid: str, sink: TokenSink | None, started: float) -> list[int]:
        """The request's tokens, one by one at the configured pace. A client that hangs up
        cancels this (the handler's cancellation) before the next token; a token produced after
        the hang-up is counted (tokens_after_hangup) and ends the request."""
        ids = output_ids(spec)
        interval = self.options.token_interval_ms / 1000
        self.pending[spec.room] = "decoding"
        for produced in range(1, len(ids) + 1):
            if interval > 0:
                await asyncio.sleep(interval)
            self.tokens_produced += 1
            if sink is None:
                continue
            if sink.gone():
                self.tokens_after_hangup += 1
                raise ClientGone(f"the client of request {rid} hung up")
            if sink.streaming and produced < len(ids):  # the last goes out as the final output
                await sink.emit(
                    native_output(rid, spec.tokens, ids[:produced], finished=False, started=started)
                )
        return ids

    async def _receive(self, body: Any, spec: RequestSpec) -> tuple[np.ndarray, int]:
        """The PD path: the request's KV pages from its prefill, verified; they stay the
        request's (its pending entry too) until the caller gives them back."""
        assert self.mgr is not None and self._waiters is not None
        host, port = body.get("bootstrap_host"), body.get("bootstrap_port")
        if not isinstance(host, str) or not host:
            raise BadRequest("bootstrap_host is required on decode (the prefill's address)")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise BadRequest(f"bootstrap_port must be a TCP port, got {port!r}")
        addr = f"{host}:{port}"
        room = spec.room
        self._claim_room(room)
        await self._ensure_prefill(addr)
        from sglang.srt.disaggregation.utils import KVClassType, TransferBackend, get_kv_class

        receiver_cls = get_kv_class(TransferBackend.NIXL, KVClassType.RECEIVER)
        self.pending[room] = "bootstrapping"
        self._waiters.register(room)
        receiver = receiver_cls(self.mgr, addr, room)
        pages: np.ndarray | None = None
        aux: int | None = None
        handed_off = False
        kept = False  # verified: the pages go to the caller
        init: asyncio.Future[Any] | None = None
        try:
            loop = asyncio.get_running_loop()
            init = loop.run_in_executor(self._executor, receiver.init, 0)
            await asyncio.shield(init)
            if receiver.conclude_state == KVPoll.Failed:
                # Refused before anything was published (its prefill unproven or over its
                # held-pages bound, no bootstrap info): it fails now, without waiting for pages.
                self.failed += 1
                raise RequestFailed.room(self._failure_reason(receiver))
            self.pending[room] = "admission"
            pages, aux = await self._take(spec)
            receiver.send_metadata(pages, aux_index=aux)
            self.pending[room] = "waiting"
            state = await self._waiters.until(room, receiver.poll, (KVPoll.Success, KVPoll.Failed))
            if state != KVPoll.Success:
                self.failed += 1
                # (a room the decode deadline failed was aborted by the receiver's poll)
                reason = self._failure_reason(receiver)
                if receiver.init_time is not None and not receiver.abort_notified:
                    # A failure decode did not start (a lost heartbeat, a transport error):
                    # the prefill may be alive behind a partition and still write these
                    # pages. As SGLang's decode does: ABORT, and hold them for the drain.
                    receiver.ensure_abort_notified(force_arm=True)
                if receiver.abort_notified:  # an ABORT went out: wait for the drain
                    self._spawn(self._release_after_drain(receiver, pages, aux))
                    handed_off = True
                raise RequestFailed.room(reason)
            problems, corrupted = await loop.run_in_executor(
                self._executor, verify_pages, self.pool, spec, pages, aux
            )
            receiver.clear()
            if problems:
                assert self.rt is not None
                self.rt.metrics.add_verify_failures(corrupted)
                self.verify_failures += 1
                self.failed += 1
                raise RequestFailed("KV verification failed: " + "; ".join(problems))
            shape = self.pool.shape
            moved = spec.pages * shape.bytes_per_page_all_layers + shape.aux_bytes
            assert self.rt is not None
            self.rt.metrics.add_bytes(moved)
            kept = True
            return pages, aux
        except asyncio.CancelledError:
            self.aborted += 1
            # Abort once the receiver knows its prefill (init may still run in a thread),
            # so prefill hears of it; hold the pages until prefill confirms the drain.
            self._spawn(self._abort_and_release(receiver, init, pages, aux))
            handed_off = True
            raise
        finally:
            self._waiters.drop(room)
            if not kept:
                self.pending.pop(room, None)
            if not handed_off:
                if receiver.init_time is None:
                    # Ended before its metadata went out (no pages in time, an error):
                    # nothing can write its pages, but prefill holds the room until it hears.
                    self._abort_quiet(receiver)
                if receiver.conclude_state is None or self.mgr.request_status.get(room) is not None:
                    self._failure_reason_quiet(receiver)
                if not kept:
                    self._give(pages, aux)

    @staticmethod
    def _abort_quiet(receiver: Any) -> None:
        try:
            receiver.abort()  # sends prefill the ABORT once the receiver knows its prefill
        except Exception:
            log.exception("aborting room %s before its metadata failed", receiver.bootstrap_room)

    async def _abort_and_release(
        self, receiver: Any, init: asyncio.Future[Any] | None, pages: np.ndarray | None, aux: int | None
    ) -> None:
        if init is not None:
            with contextlib.suppress(Exception):
                await init
        receiver.abort()
        await self._release_after_drain(receiver, pages, aux)

    async def _release_after_drain(self, receiver: Any, pages: np.ndarray | None, aux: int | None) -> None:
        assert self.mgr is not None
        room = receiver.bootstrap_room
        # Only a receiver that published its pages (init_time set) can be written to;
        # SGLang's decode waits for prefill's drain ACKs for those alone.
        published = receiver.init_time is not None and receiver.abort_notified
        acks = len(receiver.bootstrap_infos) if published and receiver.bootstrap_infos else 0
        try:
            # No clock: a write may land until the prefill drains or is proven gone. The
            # pages stay held meanwhile (pdwarden_kv_pages_held) for the watchdog to see.
            while acks and not self.mgr.is_abort_release_safe(room, acks):
                await asyncio.sleep(REPOLL_S)
        finally:
            self.mgr.clear_deferred_abort_state(room)
            self._failure_reason_quiet(receiver)
            self._give(pages, aux)


def _rid(body: Any, room: int) -> str:
    """The request's id (SGLang's rid; the server gives every request one)."""
    rid = body.get("rid")
    return rid if isinstance(rid, str) and rid else f"room-{room}"


def build_engine(options: SyntheticOptions, hardening: HardeningConfig) -> SyntheticEngine:
    if options.role == c.ROLE_PREFILL:
        return PrefillEngine(options, hardening)
    if options.role == c.ROLE_DECODE:
        return DecodeEngine(options, hardening)
    raise ValueError(f"unknown role {options.role!r}; expected prefill or decode")

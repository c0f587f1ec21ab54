"""Leader election on a coordination.k8s.io Lease: one replica acts, the others stand by.

The protocol is client-go's (and controller-runtime's timings): the leader renews the Lease
`renew_period` after its last renewal (a failed try again every `retry_period`); it counts as
leader only while its last successful renewal is younger than `renew_deadline`, and steps down
(the process exits) once it is older. A standby takes
the Lease over when the record it last saw has not changed for `lease_duration`, measured on
ITS OWN monotonic clock from when it saw that record (no comparison of clocks across nodes).
Every write is a compare-and-swap on the Lease's resourceVersion, so two standbys cannot
both win. A paused (SIGSTOP) or partitioned leader resumes with a stale renewal: `is_leader`
is False at once, before any renewal is even attempted.

The operator runs the elector on a thread of its own (`start`), with its own event loop and
its own API connection (`lease_client`): kopf's handlers and the watchdogs share the main loop
and the main client's connections, and a loop or pool kept busy by them must not delay a renewal
past the deadline (that would end the process: losing the Lease means exiting). `is_leader`
may be called from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import pdwarden_contract as contract
from pdwarden_operator.kube import lease as kube_lease
from pdwarden_operator.kube.client import KubeApiError, KubeClient, connect
from pdwarden_operator.metrics import OperatorMetrics
from pdwarden_operator.timestamps import format_micro_time

log = logging.getLogger("pdwarden.leader")

T = TypeVar("T")
DEFAULT_LEASE_NAME = "pdwarden-operator"
# The elector's own connection: a renewal is one or two requests, and one stuck on a dead socket
# must free its worker before the next try (every retry period), not after the default 30 s.
LEASE_CLIENT_CONNECTIONS = 4
# How often a caller waiting for leadership looks (standing by costs nothing else).
_WAIT_POLL_S = 0.1


@dataclass(frozen=True)
class Timing:
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    # A leader's renewal every retry period was most of an idle operator's CPU (a TLS request
    # on the elector's thread every 2 s). Every 5 s still leaves three tries (5, 7, 9 s) before
    # the deadline, and the standby's takeover still waits the whole lease_duration.
    renew_period: float = 5.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period <= self.renew_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader timing needs 0 < retry_period <= renew_period < renew_deadline < lease_duration, "
                f"not {self}"
            )


def default_identity() -> str:
    """The pod's name (unique among replicas), else host and process, plus a per-start suffix."""
    base = os.environ.get(contract.ENV_POD_NAME) or f"{socket.gethostname()}-{os.getpid()}"
    return f"{base}_{uuid.uuid4().hex[:8]}"


def _micro_time(now: dt.datetime) -> str:
    return format_micro_time(now)


def may_take(holder: str | None, identity: str, observed_at: float, duration: float, now: float) -> bool:
    """Whether `identity` may write the Lease: it holds it, nobody does, or the record it saw
    has not changed for `duration` seconds (the holder stopped renewing)."""
    return not holder or holder == identity or now - observed_at >= duration


def lease_client(timing: Timing = Timing(), kubeconfig: str | None = None) -> KubeClient:
    """A connection for the elector alone (its own connection pool, requests bounded by the
    retry period)."""
    return connect(kubeconfig, max_connections=LEASE_CLIENT_CONNECTIONS, request_timeout=timing.retry_period)


class Elector:
    def __init__(
        self,
        namespace: str,
        name: str = DEFAULT_LEASE_NAME,
        identity: str | None = None,
        timing: Timing = Timing(),
        clock: Callable[[], float] = time.monotonic,
        *,
        metrics: OperatorMetrics,
        client: KubeClient,
    ) -> None:
        """`metrics`: the operator's, whose leader gauge the operator serves (required: an
        elector with metrics of its own would lead while the served gauge says it does not).
        `client`: the elector's own connection (`lease_client`), closed when its thread ends."""
        self.namespace, self.name = namespace, name
        self.identity = identity or default_identity()
        self.timing = timing
        self._clock = clock
        self._metrics = metrics
        self._client = client
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._lock = threading.Lock()  # guards _renewed_at: renewed on the elector's thread, read anywhere
        self._renewed_at: float | None = None
        self._tried_at: float | None = None  # when the last renewal was sent (the elector's thread)
        self.renewals = 0  # successful writes of the Lease
        self._written: dict[str, Any] | None = None  # the Lease as this replica last wrote it
        # the elector's own thread and loop (start)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stop_requested = threading.Event()  # stop() before the thread made its loop
        self._leading = threading.Event()  # set once the thread holds the Lease
        metrics.leader.set(0)

    def is_leader(self) -> bool:
        """Leader now: the last successful renewal is younger than the renew deadline."""
        with self._lock:
            renewed = self._renewed_at
        return renewed is not None and self._clock() - renewed < self.timing.renew_deadline

    async def try_acquire_or_renew(self) -> bool:
        started = self._clock()  # a renewal counts from when it was sent, never later
        self._tried_at = started
        try:
            written = await self._renew_written() if self.is_leader() else None
            if written is None:
                written = await self._read_and_write()
            if written is None:
                return False
        except KubeApiError as exc:
            if exc.status != 409:
                log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            return False
        self._written = written
        if not self.is_leader():
            log.warning("lease %s/%s acquired by %s: leading", self.namespace, self.name, self.identity)
        with self._lock:
            self._renewed_at = started
            self.renewals += 1
        self._metrics.leader.set(1)
        return True

    async def _renew_written(self) -> dict[str, Any] | None:
        """The leader's renewal in one request, as client-go's fast path does: a replace of the
        Lease this replica last wrote, at that write's resourceVersion. None (the caller reads
        the Lease and tries again) when there is no such write or the Lease changed since."""
        last = self._written
        if last is None:
            return None
        rv = str((last.get("metadata") or {}).get("resourceVersion") or "")
        spec = self._spec(last)
        if not rv or spec is None:
            return None
        try:
            return await kube_lease.replace_lease(self._client, self.namespace, self.name, rv, spec)
        except KubeApiError as exc:
            if exc.status != 409:
                raise
            return None  # written by someone else since: the slow path reads who

    async def _read_and_write(self) -> dict[str, Any] | None:
        """Read the Lease and write it when this replica may: the Lease written, or None."""
        current = await kube_lease.get_lease(self._client, self.namespace, self.name)
        spec = self._spec(current)
        if spec is None:
            return None
        if current is None:
            return await kube_lease.create_lease(self._client, self.namespace, self.name, spec)
        rv = str((current.get("metadata") or {}).get("resourceVersion") or "")
        return await kube_lease.replace_lease(self._client, self.namespace, self.name, rv, spec)

    def _spec(self, current: dict[str, Any] | None) -> dict[str, Any] | None:
        """The spec to write, or None when another holder's lease is still valid."""
        spec = dict((current or {}).get("spec") or {})
        holder = spec.get("holderIdentity")
        record = (holder, spec.get("renewTime"), (current or {}).get("metadata", {}).get("resourceVersion"))
        if record != self._observed:
            self._observed, self._observed_at = record, self._clock()
        duration = float(spec.get("leaseDurationSeconds") or self.timing.lease_duration)
        if not may_take(holder, self.identity, self._observed_at, duration, self._clock()):
            return None
        now = _micro_time(dt.datetime.now(dt.UTC))
        taking_over = holder != self.identity
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.timing.lease_duration),
            "acquireTime": now if taking_over else spec.get("acquireTime", now),
            "renewTime": now,
            "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (1 if taking_over and holder else 0),
        }

    async def acquire(self) -> None:
        """Wait until this replica holds the Lease (a standby does nothing else meanwhile)."""
        log.info("lease %s/%s: standing by as %s", self.namespace, self.name, self.identity)
        while not await self.try_acquire_or_renew():
            await asyncio.sleep(self.timing.retry_period)

    def until_next_try(self) -> float:
        """Seconds until the leader's next renewal: `renew_period` after its last one, a failed
        try again `retry_period` after it."""
        if self._tried_at is None:
            return 0.0
        with self._lock:
            renewed = self._renewed_at
        due = self._tried_at + self.timing.retry_period
        if renewed is not None:
            due = max(due, renewed + self.timing.renew_period)
        return max(0.0, due - self._clock())

    async def hold(self) -> None:
        """Renew (`until_next_try`); return when leadership is lost (the caller must stop acting)."""
        while True:
            await asyncio.sleep(self.until_next_try())
            if not self.is_leader():
                break  # paused or partitioned past the deadline: never renew a lapsed term
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
            # that lands as its inner call finishes, and this loop would then never stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.timing.retry_period):
                    await self.try_acquire_or_renew()
            if not self.is_leader():
                break
        self._metrics.leader.set(0)
        log.error("lease %s/%s: leadership lost by %s", self.namespace, self.name, self.identity)

    async def prove(self) -> bool:
        """Just before acting: still leader by the clock, and the Lease still names this replica."""
        if not self.is_leader():
            return False
        try:
            current = await self._on_own_loop(kube_lease.get_lease(self._client, self.namespace, self.name))
        except KubeApiError:
            return False
        holder = ((current or {}).get("spec") or {}).get("holderIdentity")
        return holder == self.identity and self.is_leader()

    async def release(self) -> None:
        """On a clean shutdown: hand the Lease back so a standby takes over at once."""
        if not self.is_leader():
            return
        with self._lock:
            self._renewed_at = None
        self._written = None
        self._metrics.leader.set(0)
        try:
            current = await kube_lease.get_lease(self._client, self.namespace, self.name)
            if current is None or (current.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            spec = {**current["spec"], "holderIdentity": None, "leaseDurationSeconds": 1}
            rv = str(current["metadata"]["resourceVersion"])
            await kube_lease.replace_lease(self._client, self.namespace, self.name, rv, spec)
        except KubeApiError as exc:
            log.warning("lease %s/%s: not released: %s", self.namespace, self.name, exc)

    # --- the elector's own thread ----------------------------------------------------------

    def start(self, on_lost: Callable[[], None]) -> None:
        """Stand by, acquire and hold the Lease on a thread of its own with its own event loop.
        `on_lost` runs on that thread when leadership is lost (or the elector fails): the
        operator exits there, whatever its main loop is doing."""
        if self._thread is not None:
            raise RuntimeError("the elector is already started")
        self._thread = threading.Thread(
            target=self._run_thread, args=(on_lost,), name="pdwarden-leader", daemon=True
        )
        self._thread.start()

    async def wait_leading(self) -> None:
        """From any loop: return once the elector's thread holds the Lease (a standby waits
        here). Raises RuntimeError if the thread ended without it."""
        while not self._leading.is_set():
            if self._thread is None or not self._thread.is_alive():
                raise RuntimeError("the leader elector is not running")
            await asyncio.sleep(_WAIT_POLL_S)

    async def stop(self, timeout: float = 10.0) -> None:
        """From any loop: stop renewing and hand the Lease back (on the elector's own loop)."""
        thread = self._thread
        if thread is None:
            return
        self._stop_requested.set()
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # its loop already ended
                loop.call_soon_threadsafe(stop.set)
        await asyncio.to_thread(thread.join, timeout)

    def _run_thread(self, on_lost: Callable[[], None]) -> None:
        try:
            lost = asyncio.run(self._thread_main())
        except BaseException:
            log.exception("lease %s/%s: the elector failed", self.namespace, self.name)
            lost = True
        if lost:
            with self._lock:
                self._renewed_at = None
            self._metrics.leader.set(0)
            on_lost()

    async def _thread_main(self) -> bool:
        """Acquire, then hold; True when leadership was lost, False when stopped."""
        self._stop = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        if self._stop_requested.is_set():
            self._stop.set()
        stopping = asyncio.create_task(self._stop.wait())
        try:
            if not await self._unless_stopped(self.acquire(), stopping):
                return False
            self._leading.set()
            return await self._unless_stopped(self.hold(), stopping)
        finally:
            stopping.cancel()
            await self._client.aclose()  # its session belongs to this loop, which ends here

    async def _unless_stopped(self, phase: Coroutine[Any, Any, None], stopping: asyncio.Task[Any]) -> bool:
        """Run `phase` to its end (True) or until stopped (False: the Lease is handed back). An
        error in it ends the elector: the caller exits."""
        task = asyncio.create_task(phase)
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not stopping.done():
            task.result()
            return True
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await self.release()
        return False

    async def _on_own_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the elector's loop when it has one (its client lives there), else here."""
        loop = self._loop
        if loop is not None and not loop.is_closed() and loop is not asyncio.get_running_loop():
            try:
                future = asyncio.run_coroutine_threadsafe(coro, loop)
            except RuntimeError:  # its loop closed meanwhile (stopped)
                pass
            else:
                return await asyncio.wrap_future(future)
        return await coro


@dataclass
class Leadership:
    """The process's elector, once `pdwarden operator run` has started one (None: leader
    election off, or not started yet; the watchdog context holds this)."""

    elector: Elector | None = None

    async def still_leading(self) -> bool:
        """The check before every remediation: True without an elector (election off)."""
        return True if self.elector is None else await self.elector.prove()

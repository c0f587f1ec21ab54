"""Leader election on a coordination.k8s.io Lease: one replica acts, the others stand by.

The protocol is client-go's (and controller-runtime's timings): the leader renews the Lease
every `retry_period`; it counts as leader only while its last successful renewal is younger
than `renew_deadline`, and steps down (the process exits) once it is older. A standby takes
the Lease over when the record it last saw has not changed for `lease_duration`, measured on
ITS OWN monotonic clock from when it saw that record (no comparison of clocks across nodes).
Every write is a compare-and-swap on the Lease's resourceVersion, so two standbys cannot
both win. A paused (SIGSTOP) or partitioned leader resumes with a stale renewal: `is_leader`
is False at once, before any renewal is even attempted.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pdwarden_operator.kube import lease as kube_lease
from pdwarden_operator.kube.client import KubeApiError
from pdwarden_operator.metrics import METRICS, OperatorMetrics
from pdwarden_runtime import contract

log = logging.getLogger("pdwarden.leader")

DEFAULT_LEASE_NAME = "pdwarden-operator"


@dataclass(frozen=True)
class Timing:
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


def default_identity() -> str:
    """The pod's name (unique among replicas), else host and process, plus a per-start suffix."""
    base = os.environ.get(contract.ENV_POD_NAME) or f"{socket.gethostname()}-{os.getpid()}"
    return f"{base}_{uuid.uuid4().hex[:8]}"


def _micro_time(now: dt.datetime) -> str:
    return now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def may_take(holder: str | None, identity: str, observed_at: float, duration: float, now: float) -> bool:
    """Whether `identity` may write the Lease: it holds it, nobody does, or the record it saw
    has not changed for `duration` seconds (the holder stopped renewing)."""
    return not holder or holder == identity or now - observed_at >= duration


class Elector:
    def __init__(
        self,
        namespace: str,
        name: str = DEFAULT_LEASE_NAME,
        identity: str | None = None,
        timing: Timing = Timing(),
        clock: Callable[[], float] = time.monotonic,
        metrics: OperatorMetrics = METRICS,
    ) -> None:
        self.namespace, self.name = namespace, name
        self.identity = identity or default_identity()
        self.timing = timing
        self._clock = clock
        self._metrics = metrics
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None
        metrics.leader.set(0)

    def is_leader(self) -> bool:
        """Leader now: the last successful renewal is younger than the renew deadline."""
        return self._renewed_at is not None and self._clock() - self._renewed_at < self.timing.renew_deadline

    async def try_acquire_or_renew(self) -> bool:
        started = self._clock()  # a renewal counts from when it was sent, never later
        try:
            current = await kube_lease.get_lease(self.namespace, self.name)
            spec = self._spec(current)
            if spec is None:
                return False
            if current is None:
                await kube_lease.create_lease(self.namespace, self.name, spec)
            else:
                rv = str((current.get("metadata") or {}).get("resourceVersion") or "")
                await kube_lease.replace_lease(self.namespace, self.name, rv, spec)
        except KubeApiError as exc:
            if exc.status != 409:
                log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            return False
        if self._renewed_at is None or not self.is_leader():
            log.warning("lease %s/%s acquired by %s: leading", self.namespace, self.name, self.identity)
        self._renewed_at = started
        self._metrics.leader.set(1)
        return True

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

    async def hold(self) -> None:
        """Renew every retry period; return when leadership is lost (the caller must stop acting)."""
        while True:
            await asyncio.sleep(self.timing.retry_period)
            if not self.is_leader():
                break  # paused or partitioned past the deadline: never renew a lapsed term
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.try_acquire_or_renew(), timeout=self.timing.retry_period)
            if not self.is_leader():
                break
        self._metrics.leader.set(0)
        log.error("lease %s/%s: leadership lost by %s", self.namespace, self.name, self.identity)

    async def prove(self) -> bool:
        """Just before acting: still leader by the clock, and the Lease still names this replica."""
        if not self.is_leader():
            return False
        try:
            current = await kube_lease.get_lease(self.namespace, self.name)
        except KubeApiError:
            return False
        holder = ((current or {}).get("spec") or {}).get("holderIdentity")
        return holder == self.identity and self.is_leader()

    async def release(self) -> None:
        """On a clean shutdown: hand the Lease back so a standby takes over at once."""
        if not self.is_leader():
            return
        self._renewed_at = None
        self._metrics.leader.set(0)
        try:
            current = await kube_lease.get_lease(self.namespace, self.name)
            if current is None or (current.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            spec = {**current["spec"], "holderIdentity": None, "leaseDurationSeconds": 1}
            rv = str(current["metadata"]["resourceVersion"])
            await kube_lease.replace_lease(self.namespace, self.name, rv, spec)
        except KubeApiError as exc:
            log.warning("lease %s/%s: not released: %s", self.namespace, self.name, exc)


# The process's elector (None: leader election off, e.g. a unit test).
_elector: Elector | None = None


def set_elector(elector: Elector | None) -> None:
    global _elector
    _elector = elector


async def still_leading() -> bool:
    """The check before every remediation: True without an elector (election off)."""
    return True if _elector is None else await _elector.prove()

"""What every model's watchdog shares in one operator process, built once at start-up.

`pdwarden operator run` builds one `context.OperatorContext`, whose `watchdog` is the one
`WatchdogContext` (the brakes' limits from its flags), and hands it to kopf as the operator's
memo (copied into every object's memo), to the external metrics API (`role_loads`) and,
through kopf_handlers.py, to each model's watchdog. Nothing here is module state: a test
builds a context of its own.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from pdwarden_operator.cache import ChildStore
from pdwarden_operator.kube.client import KubeClient
from pdwarden_operator.leader import Leadership
from pdwarden_operator.metrics import OperatorMetrics
from pdwarden_operator.status_writer import StatusWriter, patching_through
from pdwarden_operator.watchdog.brake import (
    DEFAULT_FLEET,
    DEFAULT_NAMESPACE,
    BrakeLimits,
    Brakes,
    FleetLimits,
)
from pdwarden_operator.watchdog.budget import ScrapeBudget
from pdwarden_operator.watchdog.latest_body import LatestBody
from pdwarden_operator.watchdog.pod_cache import PodCache
from pdwarden_operator.watchdog.role_load import RoleLoads

log = logging.getLogger("pdwarden.watchdog")

Key = tuple[str, str]  # (namespace, model name)


def _current_task() -> asyncio.Task[object] | None:
    """The task running now; None outside a loop (a test tearing down its watchdogs)."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


@dataclass
class Models:
    """The running watchdogs, per model: its latest body, its task and the uid it watches."""

    bodies: dict[Key, LatestBody] = field(default_factory=dict)
    tasks: dict[Key, asyncio.Task[None]] = field(default_factory=dict)
    uids: dict[Key, str] = field(default_factory=dict)

    def forget(self, namespace: str, name: str) -> None:
        """The model's watchdog ends (its task cancelled, unless it is the one ending) and
        nothing of it stays."""
        key = (namespace, name)
        latest = self.bodies.pop(key, None)
        if latest is not None:
            latest.end()
        self.uids.pop(key, None)
        task = self.tasks.pop(key, None)
        if task is not None and task is not _current_task():
            task.cancel()
            log.info("%s/%s: watchdog stopped", namespace, name)

    def in_namespace(self, namespace: str) -> list[Key]:
        return sorted(key for key in self.tasks if key[0] == namespace)


@dataclass
class WatchdogContext:
    """The process-wide parts: the brakes every model reports to, the one pod watch's cache,
    the autoscaled roles' loads (read by the external metrics API), the scrape budget shared
    by every model's scrapes, the operator's metrics, the registry of running watchdogs, and
    what the watchdogs share with the reconciler: the API client, the status writer, the child
    store (the autoscaler reads the Deployments' counts from it) and leadership (asked before
    acting)."""

    metrics: OperatorMetrics
    brakes: Brakes
    kube: KubeClient
    writer: StatusWriter
    children: ChildStore = field(default_factory=ChildStore)
    leadership: Leadership = field(default_factory=Leadership)
    pods: PodCache = field(default_factory=PodCache)
    role_loads: RoleLoads = field(default_factory=RoleLoads)
    budget: ScrapeBudget = field(default_factory=ScrapeBudget)
    models: Models = field(default_factory=Models)

    @classmethod
    def build(
        cls,
        metrics: OperatorMetrics | None = None,
        fleet: FleetLimits = DEFAULT_FLEET,
        namespace: BrakeLimits = DEFAULT_NAMESPACE,
        *,
        kube: KubeClient,
        writer: StatusWriter | None = None,
        children: ChildStore | None = None,
    ) -> WatchdogContext:
        """A context with the brakes' limits (ValueError when they do not fit together), its
        requests sent with `kube`; what is not given is its own (a model watched alone, as in
        a test)."""
        metrics = metrics if metrics is not None else OperatorMetrics()
        return cls(
            metrics=metrics,
            brakes=Brakes(fleet, namespace, metrics=metrics),
            kube=kube,
            writer=writer if writer is not None else StatusWriter(patching_through(kube)),
            children=children if children is not None else ChildStore(),
        )

    def close(self) -> None:
        """The scrape budget's parse workers end."""
        self.budget.close()

"""The operator's context: everything one operator process keeps, built once at start-up.

`pdwarden operator run` builds one `OperatorContext` and hands it to kopf as the operator's
memo (`memo.operator`, copied into every object's memo); the handlers (handlers.py, the
watchdog's kopf_handlers.py, namespace_deletions.py) take it from there and pass its parts
down as parameters: the reconciler gets `reconcile_parts`, each model's watchdog the
`watchdog` context, both with the one API client (`kube`). No module of the operator holds a
mutable instance of its own: a test builds a context of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pdwarden_operator.cache import ChildStore, ModelKey, ResyncQueue
from pdwarden_operator.kube.client import KubeClient
from pdwarden_operator.metrics import OperatorMetrics
from pdwarden_operator.model_registry import ModelRegistry
from pdwarden_operator.podpolicy import PodPolicy
from pdwarden_operator.reconcile.observe import Baseline
from pdwarden_operator.reconcile.run import ReconcileParts
from pdwarden_operator.status_writer import StatusWriter, patching_through
from pdwarden_operator.watchdog.brake import DEFAULT_FLEET, DEFAULT_NAMESPACE, BrakeLimits, FleetLimits
from pdwarden_operator.watchdog.context import WatchdogContext

MEMO_KEY = "operator"  # the context's name in kopf's memo
# Full reconciles (create, resume, spec change) running at once. kopf starts one per object; a
# burst of 100 new models would otherwise share the API server evenly and all finish at the end.
# Bounded, they finish in arrival order; 8 x 10 applies still keep the client pool busy.
RECONCILE_CONCURRENCY = 8


@dataclass
class Reconciles:
    """The bookkeeping of handlers.py's full reconciles and resyncs: per model, what of it the
    last full reconcile handled (`handlers._essence`; a refused spec counts as handled until
    it changes), the ones queued and not started yet, the ones running, their tasks, and the
    consecutive transient failures of its resyncs (their backoff)."""

    slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(RECONCILE_CONCURRENCY))
    handled: dict[ModelKey, Hashable] = field(default_factory=dict)
    queued: set[ModelKey] = field(default_factory=set)
    running: dict[ModelKey, Hashable] = field(default_factory=dict)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    failures: dict[ModelKey, int] = field(default_factory=dict)
    resync_loop: asyncio.Task[None] | None = None

    def forget(self, namespace: str, name: str) -> None:
        """A model that is gone; a queued or running pass finds it gone by itself."""
        self.handled.pop((namespace, name), None)
        self.failures.pop((namespace, name), None)


@dataclass
class OperatorContext:
    """One operator process: its API client (`kube`: the operator's requests and kopf's
    credentials), the metrics, the status writer, the child store and its resync queue, the
    full reconciles' bookkeeping, the namespace baseline, the installation's pod policy, the
    watchdogs' context (sharing the same client, writer and store), and the registry of every
    per-model store. Also what handlers.py lists before start (`prefill_scope`: None for
    every namespace) and the namespaces being deleted (namespace_deletions.py)."""

    kube: KubeClient
    metrics: OperatorMetrics
    writer: StatusWriter
    children: ChildStore
    resync: ResyncQueue
    reconciles: Reconciles
    baseline: Baseline
    pod_policy: PodPolicy
    watchdog: WatchdogContext
    registry: ModelRegistry
    prefill_scope: list[str | None] = field(default_factory=lambda: [None])
    deleting: set[str] = field(default_factory=set)

    @classmethod
    def build(
        cls,
        metrics: OperatorMetrics | None = None,
        *,
        kube: KubeClient,
        pod_policy: PodPolicy | None = None,
        fleet: FleetLimits = DEFAULT_FLEET,
        namespace: BrakeLimits = DEFAULT_NAMESPACE,
    ) -> OperatorContext:
        """A context whose requests go through `kube`, with the brakes' limits (ValueError
        when they do not fit together) and the pod policy (the default allows nothing)."""
        metrics = metrics if metrics is not None else OperatorMetrics()
        writer, children = StatusWriter(patching_through(kube)), ChildStore()
        watchdog = WatchdogContext.build(
            metrics, fleet, namespace, kube=kube, writer=writer, children=children
        )
        context = cls(
            kube=kube,
            metrics=metrics,
            writer=writer,
            children=children,
            resync=ResyncQueue(children),
            reconciles=Reconciles(),
            baseline=Baseline(),
            pod_policy=pod_policy if pod_policy is not None else PodPolicy(allow=frozenset()),
            watchdog=watchdog,
            registry=ModelRegistry(),
        )
        context.registry.register(
            context.children,
            context.resync,
            context.reconciles,
            context.writer,
            watchdog.models,
            watchdog.brakes,
            watchdog.role_loads,
            metrics,
        )
        return context

    @cached_property
    def reconcile_parts(self) -> ReconcileParts:
        return ReconcileParts(self.kube, self.writer, self.baseline, self.pod_policy)

    def model_event(self, event_type: str | None, body: Mapping[str, Any]) -> ModelKey | None:
        """A model's watch event as every handler of it takes it: its key, or None when the model
        is gone or going (deleted, being deleted, or in a namespace being deleted: kopf may still
        deliver its events after the namespace's). Nothing is kept of a model that is gone, nor of
        an earlier model of the same name whose deletion went unseen (another UID)."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if event_type == "DELETED" or meta.get("deletionTimestamp") or key[0] in self.deleting:
            self.registry.forget(*key)
            return None
        uid = str(meta.get("uid") or "")
        known = {self.children.uid(key), self.watchdog.models.uids.get(key)} - {None}
        if known - {uid}:
            self.registry.forget(*key)
        return key

    def forget_namespace(self, namespace: str) -> list[ModelKey]:
        """Every model of a namespace being deleted; returns the ones it knew."""
        gone = sorted({*self.children.in_namespace(namespace), *self.watchdog.models.in_namespace(namespace)})
        for key in gone:
            self.registry.forget(*key)
        return gone

    def close(self) -> None:
        self.watchdog.close()


def context_of(memo: Any) -> OperatorContext:
    """The operator's context, from kopf's memo (cli.py puts it there)."""
    context = memo.get(MEMO_KEY) if isinstance(memo, Mapping) else None
    if not isinstance(context, OperatorContext):
        raise RuntimeError(
            f"kopf's memo holds no operator context ({MEMO_KEY!r}): start the operator with one"
        )
    return context

"""What every model's watchdog shares in one operator process, built once at start-up.

`pdwarden operator run` builds one `WatchdogContext` (the brakes' limits from its flags) and
hands it to kopf as the operator's memo (`memo.watchdog`, copied into every object's memo), to
the external metrics API (`role_loads`) and, through kopf_handlers.py, to each model's
watchdog. Nothing here is module state: a test builds a context of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from pdwarden_operator.metrics import METRICS, OperatorMetrics
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

Key = tuple[str, str]  # (namespace, model name)

MEMO_KEY = "watchdog"  # the context's name in kopf's memo


@dataclass
class Models:
    """The running watchdogs, per model: its latest body, its task and the uid it watches."""

    bodies: dict[Key, LatestBody] = field(default_factory=dict)
    tasks: dict[Key, asyncio.Task[None]] = field(default_factory=dict)
    uids: dict[Key, str] = field(default_factory=dict)
    # kopf_handlers.attach's subscription to namespace deletions (None: not attached)
    on_namespace_deleted: Callable[[str], None] | None = None


@dataclass
class WatchdogContext:
    """The process-wide parts: the brakes every model reports to, the one pod watch's cache,
    the autoscaled roles' loads (read by the external metrics API), the scrape budget shared
    by every model's scrapes, the operator's metrics and the registry of running watchdogs."""

    metrics: OperatorMetrics
    brakes: Brakes
    pods: PodCache = field(default_factory=PodCache)
    role_loads: RoleLoads = field(default_factory=RoleLoads)
    budget: ScrapeBudget = field(default_factory=ScrapeBudget)
    models: Models = field(default_factory=Models)

    @classmethod
    def build(
        cls,
        metrics: OperatorMetrics = METRICS,
        fleet: FleetLimits = DEFAULT_FLEET,
        namespace: BrakeLimits = DEFAULT_NAMESPACE,
    ) -> WatchdogContext:
        """A context with the brakes' limits (ValueError when they do not fit together)."""
        return cls(metrics=metrics, brakes=Brakes(fleet, namespace, metrics=metrics))

    def close(self) -> None:
        """The scrape budget's parse workers end."""
        self.budget.close()

"""Each autoscaled role's load as the last watchdog round saw it, for autoscalers of the cluster.

The external metrics API (external_metrics.py) serves these figures to HPA or KEDA. They count
the pods the planner counts (autoscale.PodLoad): ready, sampled and not judged wedged, so a
wedged pod's queue is no more demand for another autoscaler than for pdwarden's own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pdwarden_operator.watchdog.autoscale import PodLoad

Key = tuple[str, str, str]  # namespace, model, role


@dataclass(frozen=True)
class RoleLoad:
    pods: int  # pods counted (ready, sampled, not wedged)
    inflight: float  # rooms in flight, summed over the counted pods
    pages_in_use: float | None  # KV pages in use, summed; None when no counted pod exports them
    queue_age: float | None  # the oldest inflight room's age among them; None when not exported
    observed_at: float  # time.time() of the round


def summarise(loads: Iterable[PodLoad], observed_at: float) -> RoleLoad:
    counted = [p for p in loads if p.ready and not p.wedged]
    pages = [p.pages_in_use for p in counted if p.pages_in_use is not None]
    ages = [p.queue_age for p in counted if p.queue_age is not None]
    return RoleLoad(
        pods=len(counted),
        inflight=sum(p.inflight for p in counted),
        pages_in_use=sum(pages) if pages else None,
        queue_age=max(ages) if ages else None,
        observed_at=observed_at,
    )


class RoleLoads:
    """The last load per (namespace, model, role); the leader's rounds write, the API reads."""

    def __init__(self) -> None:
        self._loads: dict[Key, RoleLoad] = {}

    def record(self, namespace: str, model: str, role: str, load: RoleLoad) -> None:
        self._loads[(namespace, model, role)] = load

    def forget(self, namespace: str, model: str, roles: Iterable[str] | None = None) -> None:
        for key in [k for k in self._loads if k[:2] == (namespace, model)]:
            if roles is None or key[2] in roles:
                del self._loads[key]

    def in_namespace(self, namespace: str, fresh_since: float) -> dict[Key, RoleLoad]:
        """The namespace's loads observed at or after `fresh_since` (an older one is no signal)."""
        return {k: v for k, v in self._loads.items() if k[0] == namespace and v.observed_at >= fresh_since}

"""The operator's own Prometheus metrics (its `/metrics`), names from the runtime contract.

One `OperatorMetrics` per process, in the operator's context (context.py), served by
`serve(metrics, port)` on a background thread; a test builds its own.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    ProcessCollector,
    start_http_server,
)

from pdwarden_contract import (
    ENV_POD_IP,
    METRIC_OPERATOR_ABANDONED_ROOMS,
    METRIC_OPERATOR_AUTOSCALE_DECISIONS_TOTAL,
    METRIC_OPERATOR_AUTOSCALE_RECOMMENDED,
    METRIC_OPERATOR_AUTOSCALE_REPLICAS,
    METRIC_OPERATOR_AUTOSCALE_SATURATED,
    METRIC_OPERATOR_BRAKE_ENGAGED,
    METRIC_OPERATOR_BUDGET_EXHAUSTED,
    METRIC_OPERATOR_LEADER,
    METRIC_OPERATOR_NAMESPACE_BRAKE_ENGAGED,
    METRIC_OPERATOR_RATIO_UNKEEPABLE,
    METRIC_OPERATOR_REMEDIATIONS_TOTAL,
    METRIC_OPERATOR_ROUND_SECONDS,
    METRIC_OPERATOR_ROUNDS_LATE_TOTAL,
    METRIC_OPERATOR_SCRAPE_DURATION,
    METRIC_OPERATOR_SCRAPE_ERRORS_TOTAL,
    METRIC_OPERATOR_UNOBSERVED_PODS,
    METRIC_OPERATOR_WEDGED_PODS,
    RUNTIME_ROLES,
)

_MODEL = ("namespace", "model")


def _base(name: str) -> str:
    """prometheus_client appends `_total` to counters itself."""
    return name.removesuffix("_total")


class OperatorMetrics:
    """Every metric family of the operator, one registry; each family is an attribute, built
    by concern below."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # The process's own CPU, memory and open descriptors (`process_*`) and its garbage
        # collections per generation (`python_gc_*`): what a fleet's size costs the operator.
        ProcessCollector(registry=r)
        GCCollector(registry=r)
        # The page lists the families in the order they were registered.
        self._add_pod_health(r)
        self._add_watchdog_rounds(r)
        self._add_leadership_and_brakes(r)
        self._add_autoscaling(r)
        # every metric labelled with a model: dropped together when the model is gone
        self.per_model: tuple[Counter | Gauge | Histogram, ...] = (
            self.wedged_pods,
            self.unobserved_pods,
            self.abandoned_rooms,
            self.remediations,
            self.scrape_errors,
            self.scrape_duration,
            self.budget_exhausted,
            self.autoscale_replicas,
            self.autoscale_recommended,
            self.autoscale_saturated,
            self.autoscale_decisions,
            self.ratio_unkeepable,
        )

    def _add_pod_health(self, r: CollectorRegistry) -> None:
        """What the watchdog finds on the runtime pods, and what it does about it."""
        self.wedged_pods = Gauge(
            METRIC_OPERATOR_WEDGED_PODS,
            "Runtime pods the watchdog judges wedged now",
            [*_MODEL, "role"],
            registry=r,
        )
        self.unobserved_pods = Gauge(
            METRIC_OPERATOR_UNOBSERVED_PODS,
            "Runtime pods whose /metrics could not be scraped or parsed",
            [*_MODEL, "role"],
            registry=r,
        )
        self.abandoned_rooms = Gauge(
            METRIC_OPERATOR_ABANDONED_ROOMS,
            "Rooms the model's runtime pods hold for requests that ended (never remediated)",
            [*_MODEL, "role"],
            registry=r,
        )
        self.remediations = Counter(
            _base(METRIC_OPERATOR_REMEDIATIONS_TOTAL),
            "Watchdog decisions on wedged pods, by action and outcome",
            [*_MODEL, "action", "outcome"],
            registry=r,
        )
        self.scrape_errors = Counter(
            _base(METRIC_OPERATOR_SCRAPE_ERRORS_TOTAL),
            "Failed scrapes of runtime pods' /metrics",
            [*_MODEL, "role"],
            registry=r,
        )
        self.scrape_duration = Histogram(
            METRIC_OPERATOR_SCRAPE_DURATION,
            "Duration of one watchdog scrape round over a model's pods",
            list(_MODEL),
            registry=r,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )

    def _add_watchdog_rounds(self, r: CollectorRegistry) -> None:
        """How the watchdog's rounds keep time, and a model's remediation budget."""
        # operator-wide, not per model: a thousand models must not mean a thousand histograms
        self.round_seconds = Histogram(
            METRIC_OPERATOR_ROUND_SECONDS,
            "Duration of one model's watchdog round (observe, plan, act), across all models",
            registry=r,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.rounds_late = Counter(
            _base(METRIC_OPERATOR_ROUNDS_LATE_TOTAL),
            "Watchdog rounds that took longer than their model's scrape interval",
            registry=r,
        )
        self.budget_exhausted = Gauge(
            METRIC_OPERATOR_BUDGET_EXHAUSTED,
            "1 while a model's remediation budget is spent",
            list(_MODEL),
            registry=r,
        )

    def _add_leadership_and_brakes(self, r: CollectorRegistry) -> None:
        """Whether this replica acts at all, and whether a brake holds remediation."""
        self.leader = Gauge(
            METRIC_OPERATOR_LEADER,
            "1 while this replica holds the leader Lease (only the leader acts)",
            registry=r,
        )
        self.brake_engaged = Gauge(
            METRIC_OPERATOR_BRAKE_ENGAGED,
            "1 while the fleet brake holds some namespace's remediation (too many wedges or "
            "remediations across namespaces at once)",
            registry=r,
        )
        self.namespace_brake_engaged = Gauge(
            METRIC_OPERATOR_NAMESPACE_BRAKE_ENGAGED,
            "1 while a namespace's brake holds its models' remediation (too many wedges or "
            "remediations there at once)",
            ["namespace"],
            registry=r,
        )

    def _add_autoscaling(self, r: CollectorRegistry) -> None:
        """The autoscaler's view of each role it scales, and of the prefill:decode band."""
        self.autoscale_replicas = Gauge(
            METRIC_OPERATOR_AUTOSCALE_REPLICAS,
            "An autoscaled role's replicas as its Deployment holds them",
            [*_MODEL, "role"],
            registry=r,
        )
        self.autoscale_recommended = Gauge(
            METRIC_OPERATOR_AUTOSCALE_RECOMMENDED,
            "Replicas the role's load alone asks for, within its bounds",
            [*_MODEL, "role"],
            registry=r,
        )
        self.autoscale_saturated = Gauge(
            METRIC_OPERATOR_AUTOSCALE_SATURATED,
            "1 while the role is at maxReplicas and its load asks for more",
            [*_MODEL, "role"],
            registry=r,
        )
        self.autoscale_decisions = Counter(
            _base(METRIC_OPERATOR_AUTOSCALE_DECISIONS_TOTAL),
            "Replica changes the autoscaler made, by direction and reason",
            [*_MODEL, "role", "direction", "reason"],
            registry=r,
        )
        self.ratio_unkeepable = Gauge(
            METRIC_OPERATOR_RATIO_UNKEEPABLE,
            "1 while spec.prefillDecodeRatio cannot be kept within the roles' bounds",
            list(_MODEL),
            registry=r,
        )

    def forget(self, namespace: str, model: str) -> None:
        """Drop every series of a model that is gone: a gauge would report a stale value (an
        alert firing for a model that no longer exists), and counters of deleted models would
        only grow the page."""
        for metric in self.per_model:
            metric.remove_by_labels({"namespace": namespace, "model": model})

    def forget_autoscaling(self, namespace: str, model: str, roles: tuple[str, ...] = RUNTIME_ROLES) -> None:
        """Drop the autoscaling gauges of `roles` (no longer autoscaled, or the model gone)."""
        for gauge in (self.autoscale_replicas, self.autoscale_recommended, self.autoscale_saturated):
            for role in roles:
                gauge.remove_by_labels({"namespace": namespace, "model": model, "role": role})
        if set(roles) == set(RUNTIME_ROLES):
            self.ratio_unkeepable.remove_by_labels({"namespace": namespace, "model": model})


def serve(metrics: OperatorMetrics, port: int, host: str | None = None) -> Any:
    """Serve `metrics` at http://host:port/metrics on a daemon thread; returns the server.

    host defaults to $POD_IP (the pod's own address), else 127.0.0.1.
    """
    addr = host or os.environ.get(ENV_POD_IP) or "127.0.0.1"
    server, _thread = start_http_server(port, addr=addr, registry=metrics.registry)
    return server

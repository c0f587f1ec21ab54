"""A runtime's metrics on a fake clock, and the contract's families: shared by the unit tests
of the exposition and the integration tests that serve it."""

from __future__ import annotations

import pdwarden_contract as c
from pdwarden_runtime.inflight import InflightTracker
from pdwarden_runtime.metrics import RuntimeMetrics
from pdwarden_runtime.status import RoomStatusTable

# family name as the parser reports it (counters lose `_total`) -> type
CONTRACT_FAMILIES = {
    c.METRIC_INFLIGHT_REQUESTS: "gauge",
    c.METRIC_INFLIGHT_OLDEST_AGE: "gauge",
    c.METRIC_KV_ROOMS: "gauge",
    c.METRIC_KV_TRANSFERS_BASE: "counter",
    c.METRIC_KV_TRANSFER_BYTES_BASE: "counter",
    c.METRIC_KV_TRANSFER_SECONDS: "histogram",
    c.METRIC_STATUS_WRITES_REFUSED_BASE: "counter",
    c.METRIC_RUNTIME_INFO: "gauge",
}


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def runtime(
    role: str = c.ROLE_PREFILL, deadline: float | None = None
) -> tuple[FakeClock, RoomStatusTable, InflightTracker, RuntimeMetrics]:
    clock = FakeClock()
    table = RoomStatusTable("sticky")
    tracker = InflightTracker(table, deadline=deadline, clock=clock)
    metrics = RuntimeMetrics(
        role, table, tracker, engine="synthetic", transfer_backend="nixl", version="9.9.9"
    )
    return clock, table, tracker, metrics

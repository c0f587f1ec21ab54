"""The watchdog e2e harness; it lives in pdwarden_bench.cluster_env, which the remediation
benchmark shares."""

from __future__ import annotations

from pdwarden_bench.cluster_env import (
    API_TRANSIENT,
    EMULATED_PORT_PREFILL,
    INTERVAL,
    SOAK_ROUNDS,
    STUCK,
    WATCHDOG,
    Env,
    Load,
    assert_each_pod_acted_on_once,
    epoch,
    open_env,
    operator_metric,
    pod_metrics,
    remediations,
    up,
    wait_rounds,
    wedge,
    with_outcome,
)

__all__ = [
    "API_TRANSIENT",
    "EMULATED_PORT_PREFILL",
    "INTERVAL",
    "SOAK_ROUNDS",
    "STUCK",
    "WATCHDOG",
    "Env",
    "Load",
    "assert_each_pod_acted_on_once",
    "epoch",
    "open_env",
    "operator_metric",
    "pod_metrics",
    "remediations",
    "up",
    "wait_rounds",
    "wedge",
    "with_outcome",
]

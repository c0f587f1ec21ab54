"""A DisaggregatedModel whose pods all run on the simulated fleet."""

from __future__ import annotations

from typing import Any

from pdwarden_testkit.cluster_env import HOST_PLAYS_ROUTER, synthetic_body
from pdwarden_testkit.fleet import placement


def fleet_model(namespace: str, name: str, prefill: int, decode: int, interval: int) -> dict[str, Any]:
    """A synthetic model whose pods (router too) all land on the simulated node; a wedge is
    remediated by a restart, after two scrape intervals without progress."""
    stuck = 2 * interval
    return synthetic_body(
        namespace,
        name,
        {
            "prefill": {"replicas": prefill, "podTemplate": placement.pod_template()},
            "decode": {"replicas": decode, "podTemplate": placement.pod_template()},
            "router": {"replicas": 1, "podTemplate": placement.pod_template()},
            "transfer": {"inflightDeadlineSeconds": stuck - 1, "transferDeadlineSeconds": stuck - 1},
            "watchdog": {
                "scrapeIntervalSeconds": interval,
                "stuckAfterSeconds": stuck,
                "action": "restart",
                "budgetWindowSeconds": max(60, stuck),
            },
            **HOST_PLAYS_ROUTER,
        },
    )

"""A DisaggregatedModel whose pods all run on the simulated fleet."""

from __future__ import annotations

from typing import Any

from pdwarden_testkit.cluster_env import HOST_PLAYS_ROUTER, synthetic_body
from pdwarden_testkit.fleet import placement
from pdwarden_testkit.fleet.runtimes import MODE_ANNOTATION, Mode


def fleet_model(
    namespace: str, name: str, prefill: int, decode: int, interval: int, mode: Mode = "serving"
) -> dict[str, Any]:
    """A synthetic model whose pods (router too) all land on the simulated node, its runtime
    pods exporting what a runtime in `mode` does; a wedge is remediated by a restart, after two
    scrape intervals without progress."""
    stuck = 2 * interval
    return synthetic_body(
        namespace,
        name,
        {
            "prefill": {"replicas": prefill, "podTemplate": _runtime_template(mode)},
            "decode": {"replicas": decode, "podTemplate": _runtime_template(mode)},
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


def _runtime_template(mode: Mode) -> dict[str, Any]:
    template = placement.pod_template()
    if mode != "serving":
        template["metadata"] = {"annotations": {MODE_ANNOTATION: mode}}
    return template

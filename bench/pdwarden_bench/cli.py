"""`pdwarden bench ...`: each benchmark is its own module and prints one JSON line last."""

from __future__ import annotations

import importlib
from typing import Any

import click

BENCHMARKS: dict[str, str] = {
    "status": "pdwarden_bench.status:status",
    "transfer": "pdwarden_bench.transfer:transfer",
    "abort-storm": "pdwarden_bench.abort_storm:abort_storm",
    "cancellations": "pdwarden_bench.cancellations:cancellations",
    "stalled-peer": "pdwarden_bench.stalled_peer:stalled_peer",
    "reconcile": "pdwarden_bench.reconcile:reconcile",
    "remediation": "pdwarden_bench.remediation:remediation",
    "watchdog": "pdwarden_bench.watchdog:watchdog",
    "metrics-bomb": "pdwarden_bench.metrics_bomb:metrics_bomb",
    "router-gate": "pdwarden_bench.gate_cost:router_gate",
    "side-channel": "pdwarden_bench.side_channel:side_channel",
    "serving": "pdwarden_bench.serving:serving",
    "autoscale": "pdwarden_bench.autoscale:autoscale",
}


class _LazyBenchGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(BENCHMARKS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = BENCHMARKS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        command: Any = getattr(importlib.import_module(module_name), attr)
        return command  # type: ignore[no-any-return]


@click.group(cls=_LazyBenchGroup)
def bench() -> None:
    """Benchmarks; each prints one JSON line of figures last."""

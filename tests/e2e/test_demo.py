"""`pdwarden demo --json` end to end: what `make demo` shows a new user must really happen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pdwarden_demo import demo_scenario

# cluster_exclusive: its operator, in cluster scope, watches every namespace (no other e2e module beside it)
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.cluster_exclusive]


def test_demo_detects_remediates_recovers_alerts_and_cleans_up(cluster: Any) -> None:
    pdwarden = Path(sys.executable).with_name("pdwarden")
    # the chart's default scope (the demo picks it by itself only on a cluster it started)
    proc = subprocess.run(
        [str(pdwarden), "demo", "--json", "--scope", "cluster"],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON line; stderr tail:\n{proc.stderr[-4000:]}"
    result = json.loads(lines[-1])
    assert proc.returncode == 0, f"{result}\n{proc.stderr[-4000:]}"
    assert result["operator_scope"] == "cluster"
    assert result["wedges_injected"] == 1
    assert result["wedges_detected"] == 1
    assert result["remediations"] >= 1
    assert result["recovered"] is True
    assert result["requests_ok"] > 0
    # as Alertmanager received them from the cluster's Prometheus (the chart's rules)
    assert set(demo_scenario.INFLIGHT_ALERTS) & set(result["alerts_for_wedged_pod"])
    assert "PdwardenWedgeRemediated" in result["alerts_fired"]
    assert set(result["alerts_before_fault"]) <= set(demo_scenario.ALLOWED_BEFORE_FAULT)
    # generous bound: the watchdog's stuckAfterSeconds (20) plus scrapes and polling
    assert 0 < result["detection_seconds"] < 120
    # it cleaned up after itself: no demo namespace left behind
    check = subprocess.run(
        [str(pdwarden.with_name("kubectl")), "get", "namespace", demo_scenario.NAMESPACE],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        check=False,
    )
    assert check.returncode != 0 and "NotFound" in check.stderr

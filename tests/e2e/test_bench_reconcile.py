"""`pdwarden bench reconcile` runs end to end on the local cluster and counts what it claims.

Its figures are timings and belong to the benchmark; this test checks only that a small run
reconciles every model completely and reports it in the JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdwarden_bench.reconcile import children_per_model
from pdwarden_localcluster.cluster import ClusterInfo

pytestmark = pytest.mark.e2e

MODELS = 5


def test_small_run_reconciles_every_model_completely(cluster: ClusterInfo) -> None:
    pdwarden = Path(sys.executable).parent / "pdwarden"
    out = subprocess.run(
        [str(pdwarden), "bench", "reconcile", "--models", str(MODELS), "--steady-seconds", "3", "--json"],
        capture_output=True,
        text=True,
        timeout=420,
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["models"] == MODELS
    assert figures["status_written"] == MODELS
    assert figures["children_complete"] == MODELS
    assert 0 < figures["p50_s"] <= figures["p99_s"] <= figures["max_s"]
    assert figures["operator_peak_rss_mib"] > 0
    assert figures["steady_seconds"] == 3 and figures["steady_cpu_s_per_min"] >= 0
    assert figures["controllers_caught_up_s"] >= 0
    assert figures["deployments_unobserved_at_steady"] == 0  # the steady window began once they had
    # a second operator process resumed every model (the warm-up one too)
    assert figures["resume_models_handled"] == MODELS + 1 and figures["resume_seconds"] > 0
    # the API server's share: each model's worker key Secret and children, written with no operator
    assert figures["floor_writes"] == MODELS * (children_per_model() + 1)
    assert figures["floor_all_written_s"] > 0 and figures["floor_writes_per_s"] > 0

"""Hostile /metrics beside healthy ones, through the real operator (`pdwarden bench
metrics-bomb`): a pod serving 1 MiB of long, varied labels on every scrape is only ever
unobserved, the healthy pods keep being scraped on time, the Lease is held and the operator's
memory stays bounded. The figures belong to the benchmark; this checks what it must never do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdwarden_localcluster.cluster import ClusterInfo

pytestmark = pytest.mark.e2e

HOSTILE, HEALTHY = 4, 2
RSS_BOUND_MIB = 400  # the operator's chart limit is 512Mi; the bound is the feature


def test_a_metrics_bomb_leaves_the_operator_bounded_and_leading(cluster: ClusterInfo) -> None:
    pdwarden = Path(sys.executable).parent / "pdwarden"
    out = subprocess.run(
        [
            str(pdwarden),
            "bench",
            "metrics-bomb",
            "-N",
            str(HOSTILE),
            "-M",
            str(HEALTHY),
            "--seconds",
            "20",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["lease_lost"] is False and figures["operator_exited"] is False, figures
    assert figures["hostile_unobserved_min"] == HOSTILE, figures
    assert figures["healthy_scrape_errors"] == 0, figures
    assert figures["operator_rss_mib_max"] < RSS_BOUND_MIB, figures

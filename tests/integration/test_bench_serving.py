"""`pdwarden bench serving` for real, on a tiny workload: hardened, stock and stock woken at
once, each a synthetic pair behind its own router (smg), here as a model runs by default (the
worker key, the side channel signed, smg behind the gate: `--front-door`); every request
answered in every arm, every figure there."""

from __future__ import annotations

import pytest

from pdwarden_bench.serving import ARMS, RATIOS, run

pytestmark = pytest.mark.integration


def test_the_serving_benchmark_answers_every_request_in_every_arm() -> None:
    result = run(pairs=1, requests=20, concurrency=2, seed=1, front_door=True)
    assert result["benchmark"] == "serving" and result["pairs"] == 1 and result["front_door"] is True
    for arm in ARMS:
        figures = result[arm]
        assert figures["requests_failed"] == 0 and figures["requests"] == 20, result
        assert figures["requests_per_second"] > 0, result
        assert 0 < figures["latency_p50_ms"] <= figures["latency_p99_ms"], result
    for ratio in RATIOS:
        assert 0 < result[f"{ratio}_min"] <= result[ratio] <= result[f"{ratio}_max"], result

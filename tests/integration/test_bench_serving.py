"""`pdwarden bench serving` for real, on a tiny workload: hardened, stock and stock woken at
once, each a synthetic pair behind its own router (smg), here as a model runs by default (the
worker key, the side channel signed, smg behind the gate: `--front-door`); every request and
every streamed chat answered in every arm, every figure there."""

from __future__ import annotations

import pytest

from pdwarden_bench.serving import ARMS, RATIOS, STREAM_FIGURES, STREAM_RATIO_PREFIX, run

pytestmark = pytest.mark.integration


def test_the_serving_benchmark_answers_every_request_in_every_arm() -> None:
    result = run(
        pairs=1, requests=20, concurrency=2, seed=1, front_door=True, stream_requests=6, token_interval_ms=2
    )
    assert result["benchmark"] == "serving" and result["pairs"] == 1 and result["front_door"] is True
    for arm in ARMS:
        figures = result[arm]
        assert figures["requests_failed"] == 0 and figures["requests"] == 20, result
        assert figures["requests_per_second"] > 0, result
        assert 0 < figures["latency_p50_ms"] <= figures["latency_p99_ms"], result
    for ratio in RATIOS:
        assert 0 < result[f"{ratio}_min"] <= result[ratio] <= result[f"{ratio}_max"], result
    assert (result["stream_requests_per_round"], result["token_interval_ms"]) == (6, 2), result
    for arm in ARMS:
        figures = result[arm]
        assert figures["stream_failed"] == 0 and figures["stream_requests"] == 6, result
        for key in STREAM_FIGURES:
            assert figures[f"{key}_ms"] is not None and figures[f"{key}_ms"] >= 0, (key, result)
        assert figures["ttft_p50_ms"] <= figures["ttft_p99_ms"], result
        assert figures["itl_p50_ms"] <= figures["itl_p99_ms"], result
    for key in STREAM_FIGURES:
        ratio = f"{STREAM_RATIO_PREFIX}{key}"
        assert 0 < result[f"{ratio}_min"] <= result[ratio] <= result[f"{ratio}_max"], (ratio, result)

"""`pdwarden bench serving`'s pure parts: the paired round order, the workload, each arm's
percentiles and rate, the paired rate ratio; the streamed rounds' time to first token and
inter-token gaps and their paired ratios; the JSON keys its docstring names."""

from __future__ import annotations

import math
import os

import pytest

import pdwarden_bench.serving as serving
from pdwarden_bench import streams
from pdwarden_bench.gate_cost import percentile, short_requests
from pdwarden_bench.serving import (
    ARMS,
    HARDENED,
    P99_RATIO,
    PROMPT_WAKE,
    RATIO,
    STOCK,
    RoundFigures,
    StreamFigures,
    arm_summary,
    schedule,
    stream_bodies,
    stream_figures,
    stream_ratios,
    stream_summary,
    summarize,
)
from pdwarden_bench.streams import StreamAnswer
from pdwarden_runtime.hardening.config import (
    HARDENING_BENCH_STOCK_PROMPT_WAKE,
    HARDENING_OFF,
    HARDENING_ON,
)

pytestmark = pytest.mark.unit


def _round(rps: float, latencies: tuple[float, ...] = (0.01,), failed: int = 0) -> RoundFigures:
    """A round whose answered requests came at ``rps`` per second."""
    return RoundFigures(latencies, failed, len(latencies) / rps)


PROMPT_WAKE_RATIO = "hardened_over_stock_prompt_wake_rps"


def test_the_arms_are_hardened_stock_and_stock_woken_at_once() -> None:
    assert ARMS == {
        HARDENED: HARDENING_ON,
        STOCK: HARDENING_OFF,
        PROMPT_WAKE: HARDENING_BENCH_STOCK_PROMPT_WAKE,
    }


def test_schedule_warms_up_then_alternates_abc_cba() -> None:
    abc, cba = [HARDENED, STOCK, PROMPT_WAKE], [PROMPT_WAKE, STOCK, HARDENED]
    assert schedule(3) == [(i, arm) for i, order in enumerate((abc, cba, abc, cba)) for arm in order]


@pytest.mark.parametrize("pairs", [1, 2, 5, 8])
def test_every_measured_round_runs_each_arm_once_and_neither_always_goes_first(pairs: int) -> None:
    measured = [(i, arm) for i, arm in schedule(pairs) if i]
    for i in range(1, pairs + 1):
        assert sorted(arm for r, arm in measured if r == i) == sorted(ARMS)
    firsts = [arm for r, arm in measured[:: len(ARMS)]]
    assert abs(firsts.count(HARDENED) - firsts.count(PROMPT_WAKE)) <= 1


def test_the_workload_is_seeded_and_short() -> None:
    bodies = short_requests(50, seed=7)
    assert bodies == short_requests(50, seed=7)
    assert bodies != short_requests(50, seed=8)
    assert all(8 <= len(b["input_ids"]) <= 64 for b in bodies)
    assert all(b["sampling_params"]["max_new_tokens"] <= 4 for b in bodies)


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1 .. 100
    assert percentile(values, 0.5) == 51.0
    assert percentile(values, 0.99) == 100.0
    assert percentile([3.0], 0.99) == 3.0
    assert math.isnan(percentile([], 0.5))


def test_arm_summary_pools_latencies_and_takes_the_median_round_rate() -> None:
    rounds = [
        RoundFigures((0.010, 0.020), 0, 1.0),  # 2 req/s
        RoundFigures((0.030,), 1, 0.25),  # 4 req/s
        RoundFigures((0.040, 0.050, 0.060), 0, 0.5),  # 6 req/s
    ]
    assert arm_summary(rounds) == {
        "latency_p50_ms": 40.0,
        "latency_p99_ms": 60.0,
        "requests_per_second": 4.0,
        "requests_failed": 1,
        "requests": 7,
        "cpu_ms_per_request": None,  # the processes' CPU was not read
    }


def test_cpu_per_request_is_the_rounds_cpu_over_their_answered_requests() -> None:
    rounds = [RoundFigures((0.01,) * 100, 2, 1.0, cpu_s=0.3), RoundFigures((0.01,) * 50, 0, 1.0, cpu_s=0.15)]
    assert arm_summary(rounds)["cpu_ms_per_request"] == 3.0
    figures = {
        HARDENED: [RoundFigures((0.01,) * 100, 0, 1.0, cpu_s=0.33)],
        STOCK: [RoundFigures((0.01,) * 100, 0, 1.0, cpu_s=0.3)],
        PROMPT_WAKE: [RoundFigures((0.01,) * 100, 0, 1.0, cpu_s=0.3)],
    }
    assert summarize(figures)["hardened_over_stock_cpu_per_request"] == 1.1


def test_cpu_seconds_reads_live_processes_and_none_for_an_ended_one() -> None:
    own = serving.cpu_seconds([os.getpid()])
    assert own is not None and own > 0
    assert serving.cpu_seconds([os.getpid(), 2**22 + 12345]) is None  # no such pid


def test_arm_summary_of_rounds_that_answered_nothing_has_no_percentiles() -> None:
    summary = arm_summary([RoundFigures((), 3, 1.0)])
    assert summary["latency_p50_ms"] is None and summary["latency_p99_ms"] is None
    assert summary["requests_per_second"] == 0.0 and summary["requests_failed"] == 3


def test_summarize_reports_the_paired_ratio_not_the_ratio_of_medians() -> None:
    # Round 2 is slow for both arms (machine load): within each round hardened is 5% slower,
    # which the ratio of the medians (200 / 100 = 2.0) would hide.
    figures = {
        HARDENED: [_round(95.0), _round(47.5), _round(190.0)],
        STOCK: [_round(100.0), _round(50.0), _round(200.0)],
        PROMPT_WAKE: [_round(95.0), _round(50.0), _round(200.0)],
    }
    result = summarize(figures)
    assert result[RATIO] == 0.95 and result[f"{RATIO}_min"] == 0.95 and result[f"{RATIO}_max"] == 0.95
    assert (result[f"{PROMPT_WAKE_RATIO}_min"], result[PROMPT_WAKE_RATIO]) == (0.95, 0.95)
    assert result[f"{PROMPT_WAKE_RATIO}_max"] == 1.0
    assert result[HARDENED]["requests_per_second"] == 95.0
    assert result[STOCK]["requests_per_second"] == 100.0


def test_summarize_gives_the_ratio_s_spread() -> None:
    figures = {
        HARDENED: [_round(90.0), _round(110.0), _round(100.0)],
        STOCK: [_round(100.0), _round(100.0), _round(100.0)],
        PROMPT_WAKE: [_round(100.0), _round(100.0), _round(100.0)],
    }
    result = summarize(figures)
    assert (result[f"{RATIO}_min"], result[RATIO], result[f"{RATIO}_max"]) == (0.9, 1.0, 1.1)


def test_summarize_has_no_ratio_when_a_stock_round_answered_nothing() -> None:
    figures = {HARDENED: [_round(100.0)], STOCK: [RoundFigures((), 5, 1.0)], PROMPT_WAKE: [_round(50.0)]}
    result = summarize(figures)
    assert result[RATIO] is None and result[f"{RATIO}_min"] is None and result[f"{RATIO}_max"] is None
    assert result[STOCK]["requests_failed"] == 5
    assert result[PROMPT_WAKE_RATIO] == 2.0  # the other ratio stands


def _rounds_at(rps: list[float], p99: float = 0.01) -> list[RoundFigures]:
    # 100 answers per round: the p99 (nearest rank) is the slowest of them.
    return [_round(rate, (0.005,) * 99 + (p99,)) for rate in rps]


@pytest.mark.parametrize(
    ("hardened_rps", "hardened_p99", "met", "failed_goal"),
    [
        ([98.0, 97.0, 99.0], 0.011, True, None),
        ([96.0, 96.0, 99.0], 0.010, False, "goal_met_rps"),  # the median under 0.97
        ([99.0, 92.0, 99.0], 0.010, False, "goal_met_rps"),  # one round under 0.93
        ([100.0, 100.0, 100.0], 0.0111, False, "goal_met_p99"),  # p99 over 1.1x stock's
    ],
)
def test_goal_met_reads_the_rate_and_p99_ratios(
    hardened_rps: list[float], hardened_p99: float, met: bool, failed_goal: str | None
) -> None:
    figures = {
        HARDENED: _rounds_at(hardened_rps, hardened_p99),
        STOCK: _rounds_at([100.0] * 3),
        PROMPT_WAKE: _rounds_at([100.0] * 3),
    }
    result = summarize(figures)
    assert result[P99_RATIO] == round(hardened_p99 / 0.01, 3)
    assert result["goal_met"] is met
    assert "goal_met_ttft_p99" not in result  # no streamed rounds, no streamed goal
    if failed_goal is not None:
        assert result[failed_goal] is False
        assert all(
            value for key, value in result.items() if key.startswith("goal_met_") and key != failed_goal
        )


def test_a_ratio_that_could_not_be_read_is_a_goal_not_met() -> None:
    figures = {HARDENED: [_round(100.0)], STOCK: [RoundFigures((), 5, 1.0)], PROMPT_WAKE: [_round(50.0)]}
    result = summarize(figures)
    assert result[P99_RATIO] is None
    assert result["goal_met_rps"] is False and result["goal_met_p99"] is False and result["goal_met"] is False


def test_the_docstring_names_every_json_key() -> None:
    result = summarize({arm: [_round(1.0)] for arm in ARMS})
    keys = {key for key in result if key not in ARMS} | set(ARMS) | set(result[HARDENED])
    keys |= {"benchmark", "pairs", "requests_per_round", "concurrency", "seed", "seconds"}
    doc = " ".join((serving.__doc__ or "").split())
    for key in keys:
        assert key.removesuffix("_min").removesuffix("_max") in doc, key
    assert "_min and _max" in doc


def _streams(ttft: tuple[float, ...], itl: tuple[float, ...], failed: int = 0) -> StreamFigures:
    return StreamFigures(ttft, itl, failed, len(ttft) + failed)


def test_a_streamed_round_times_answered_streams_only() -> None:
    answers = [
        StreamAnswer(streams.OK, 1.0, 5, (0.1, 0.15, 0.25)),
        StreamAnswer(streams.OK, 1.0, 4, (0.2, 0.3)),
        StreamAnswer(streams.FAILED, 0.5, 2, (0.05,), 200, "the stream ended without data: [DONE]"),
        StreamAnswer(streams.OK, 1.0, 2, ()),  # its [DONE] came, no token: no time to first token
    ]
    figures = stream_figures(answers, requests=4)
    assert figures.ttft == (0.1, 0.2) and figures.failed == 1 and figures.requests == 4
    assert figures.itl == pytest.approx((0.05, 0.1, 0.1))


def test_stream_summary_pools_each_arm_s_rounds() -> None:
    summary = stream_summary([_streams((0.1, 0.2), (0.01,)), _streams((0.3,), (0.02, 0.04), failed=2)])
    assert summary == {
        "ttft_p50_ms": 200.0,
        "ttft_p99_ms": 300.0,
        "itl_p50_ms": 20.0,
        "itl_p99_ms": 40.0,
        "stream_requests": 5,
        "stream_failed": 2,
    }
    empty = stream_summary([_streams((), (), failed=3)])
    assert empty["ttft_p50_ms"] is None and empty["itl_p99_ms"] is None and empty["stream_failed"] == 3


def test_the_streamed_ratios_are_paired_by_round() -> None:
    # round 2 is slow for both arms: within each round hardened's first token comes 10 % later
    hardened = [_streams((0.11,), (0.02,)), _streams((0.22,), (0.01,))]
    stock = [_streams((0.10,), (0.01,)), _streams((0.20,), (0.01,))]
    ratios = stream_ratios(hardened, stock)
    assert ratios["hardened_over_stock_ttft_p50"] == 1.1 and ratios["hardened_over_stock_ttft_p99_max"] == 1.1
    key = "hardened_over_stock_itl_p50"
    assert (ratios[f"{key}_min"], ratios[key], ratios[f"{key}_max"]) == (1.0, 1.5, 2.0)


def test_a_streamed_ratio_is_none_when_a_round_lacks_the_figure() -> None:
    ratios = stream_ratios([_streams((0.1,), ())], [_streams((0.1,), (0.0,))])
    assert ratios["hardened_over_stock_ttft_p50"] == 1.0
    assert ratios["hardened_over_stock_itl_p50"] is None  # hardened has no gap, stock's is 0
    assert stream_ratios([], []) == {key: None for key in ratios}


def test_the_streamed_bodies_are_seeded_chats() -> None:
    bodies = stream_bodies(20, seed=3, max_tokens=16)
    assert bodies == stream_bodies(20, seed=3, max_tokens=16) != stream_bodies(20, seed=4, max_tokens=16)
    assert all(b["stream"] and b["max_tokens"] == 16 for b in bodies)
    assert all(8 <= len(b["messages"][0]["content"]) <= 64 for b in bodies)


def test_the_docstring_names_every_streamed_json_key() -> None:
    result = summarize(
        {arm: [_round(1.0)] for arm in ARMS}, {arm: [_streams((0.1,), (0.01,))] for arm in ARMS}
    )
    assert set(stream_summary([])) <= set(result[HARDENED])
    keys = {key for key in result if key not in ARMS} | set(result[HARDENED])
    keys |= {"stream_requests_per_round", "stream_tokens", "token_interval_ms"}
    doc = " ".join((serving.__doc__ or "").split())
    for key in keys:
        assert key.removesuffix("_min").removesuffix("_max") in doc, key


@pytest.mark.parametrize(("hardened_ttft", "met"), [(0.109, True), (0.12, False)])
def test_streamed_rounds_add_the_time_to_first_token_goal(hardened_ttft: float, met: bool) -> None:
    rounds = {arm: _rounds_at([100.0]) for arm in ARMS}
    streamed = {arm: [_streams((0.1,), (0.01,))] for arm in ARMS}
    streamed[HARDENED] = [_streams((hardened_ttft,), (0.01,))]
    result = summarize(rounds, streamed)
    assert result["goal_met_ttft_p99"] is met and result["goal_met"] is met
    assert result["goal_met_rps"] and result["goal_met_p99"]

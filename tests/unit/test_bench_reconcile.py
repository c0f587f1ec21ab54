"""bench reconcile judges a run by its goals, each a ratio or a bound measured in the same
run (`goals`): a burst against the API server's own share, paced arrivals by p50 and p99, a
settled fleet by its CPU. The earlier goal in seconds stays as `queue_goal_met`: up to 100 models
p50 1 s, 150 MiB; beyond, p50 2 s, every model within 30 s, 300 MiB."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from pdwarden_bench.reconcile import (
    BURST_OVER_FLOOR,
    LARGE_GOAL,
    SMALL_GOAL,
    FullResync,
    full_resyncs,
    goal_for,
    goal_met,
    goals,
    idle_cpu_s_per_min,
    ratio,
    requests_per_model,
    with_goals,
)

pytestmark = pytest.mark.unit


def test_the_goal_follows_the_number_of_models() -> None:
    assert goal_for(20) == goal_for(100) == SMALL_GOAL
    assert goal_for(101) == goal_for(1000) == LARGE_GOAL
    assert (LARGE_GOAL.p50_s, LARGE_GOAL.all_reconciled_s, LARGE_GOAL.rss_mib) == (2.0, 30.0, 300.0)


@pytest.mark.parametrize(
    ("figures", "met"),
    [
        ({"p50_s": 1.9, "all_reconciled_s": 29.0, "peak_rss_mib": 290.0, "complete": True}, True),
        ({"p50_s": 2.1, "all_reconciled_s": 29.0, "peak_rss_mib": 290.0, "complete": True}, False),
        ({"p50_s": 1.9, "all_reconciled_s": 31.0, "peak_rss_mib": 290.0, "complete": True}, False),
        ({"p50_s": 1.9, "all_reconciled_s": 29.0, "peak_rss_mib": 310.0, "complete": True}, False),
        ({"p50_s": 1.9, "all_reconciled_s": 29.0, "peak_rss_mib": 290.0, "complete": False}, False),
    ],
)
def test_a_thousand_models_meet_the_goal_only_with_every_figure_within_it(
    figures: dict[str, Any], met: bool
) -> None:
    assert goal_met(LARGE_GOAL, **figures) is met


def test_a_small_run_has_no_bound_on_all_reconciled() -> None:
    assert goal_met(SMALL_GOAL, p50_s=0.5, all_reconciled_s=500.0, peak_rss_mib=140.0, complete=True)
    assert not goal_met(SMALL_GOAL, p50_s=1.5, all_reconciled_s=5.0, peak_rss_mib=140.0, complete=True)


# The goals: ratios and bounds measured in one run (`goals`).

_MET: dict[str, Any] = {
    "complete": True,
    "p50_s": 1.5,
    "p99_s": 8.0,
    "peak_rss_mib": 250.0,
    "all_reconciled_over_floor": 1.2,
    "idle_cpu_s_per_min": 0.04,
    "full_resync_over_model_passes": 1.5,
}


def test_ratio_is_unknown_without_both_figures() -> None:
    assert ratio(56.0, 43.0) == 1.302
    assert ratio(None, 43.0) is None and ratio(56.0, None) is None and ratio(1.0, 0.0) is None


def test_a_burst_is_judged_against_the_floor_of_the_same_run_not_its_p50() -> None:
    # p50 and p99 measure the queue of a burst: they do not count
    figures = _MET | {"p50_s": 30.0, "p99_s": 55.0}
    assert goals(rate=None, **figures) == {
        "goal_met_burst": True,
        "goal_met_rate": None,
        "goal_met_settled": True,
        "goal_met": True,
    }
    over = goals(rate=None, **figures | {"all_reconciled_over_floor": BURST_OVER_FLOOR + 0.01})
    assert over["goal_met_burst"] is False and over["goal_met"] is False
    assert goals(rate=None, **figures | {"peak_rss_mib": 301.0})["goal_met"] is False
    assert goals(rate=None, **figures | {"complete": False})["goal_met"] is False


def test_a_burst_without_a_floor_is_not_met() -> None:
    result = goals(rate=None, **_MET | {"all_reconciled_over_floor": None})
    assert result["goal_met_burst"] is False and result["goal_met"] is False


@pytest.mark.parametrize(
    ("change", "met"),
    [
        ({}, True),
        ({"p50_s": 2.01}, False),
        ({"p99_s": 10.5}, False),
        ({"all_reconciled_over_floor": 5.0}, True),  # paced arrivals: the floor is not the bound
        ({"complete": False}, False),
    ],
)
def test_paced_arrivals_are_judged_by_p50_and_p99(change: dict[str, Any], met: bool) -> None:
    result = goals(rate=10.0, **_MET | change)
    assert result["goal_met_rate"] is met and result["goal_met_burst"] is None
    assert result["goal_met"] is met


@pytest.mark.parametrize(
    ("change", "settled"),
    [
        ({"idle_cpu_s_per_min": 0.06}, False),
        ({"full_resync_over_model_passes": 2.1}, False),
        ({"idle_cpu_s_per_min": None}, None),  # no window between passes
        ({"full_resync_over_model_passes": None}, None),  # no full pass in the window
    ],
)
def test_the_settled_fleet_counts_in_every_mode(change: dict[str, Any], settled: bool | None) -> None:
    for rate in (None, 10.0):
        result = goals(rate=rate, **_MET | change)
        assert result["goal_met_settled"] is settled
        assert result["goal_met"] is False


def test_idle_cpu_leaves_the_full_passes_out() -> None:
    # 300 s window, 3 CPU-s, of which one pass took 2.5 CPU-s over 10 s: 0.5 CPU-s in 290 s
    assert idle_cpu_s_per_min(3.0, 300.0, 2.5, 10.0) == round(0.5 * 60 / 290, 4)
    assert idle_cpu_s_per_min(1.0, 60.0, 0.0, 0.0) == 1.0
    assert idle_cpu_s_per_min(1.0, 10.0, 1.0, 9.5) is None  # nothing left between passes


def test_full_resync_passes_are_read_from_the_operators_log() -> None:
    log = (
        "2026-01-01 00:00:00,000 INFO pdwarden.handlers: full resync: 1001 models in 0.532s, 0.4210 CPU-s\n"
        "2026-01-01 00:00:01,000 INFO pdwarden.handlers: ns/m: reconciled generation 1 in 0.01s\n"
        "2026-01-01 00:05:00,000 INFO pdwarden.handlers: full resync: 3 models in 1.000s, 0.0100 CPU-s\n"
    )
    assert full_resyncs(log) == [FullResync(1001, 0.532, 0.421), FullResync(3, 1.0, 0.01)]
    assert full_resyncs("") == []


def test_requests_per_model_are_the_difference_of_two_readings_by_verb() -> None:
    before = Counter({"GET": 100, "APPLY": 10, "WATCH": 5, "PATCH status": 1})
    after = Counter({"GET": 340, "APPLY": 230, "WATCH": 9, "PATCH status": 41, "POST": 20})
    assert requests_per_model(before, after, 20) == {
        "APPLY": 11.0,
        "GET": 12.0,
        "PATCH status": 2.0,
        "POST": 1.0,
    }  # watches are long-running: not counted
    assert requests_per_model(None, after, 20) is None


def _run_figures(**extra: float | None) -> dict[str, Any]:
    return {
        "models": 200,
        "children_complete": 200,
        "p50_s": 1.7,
        "p99_s": 2.8,
        "operator_peak_rss_mib": 123.0,
        "all_reconciled_s": 13.0,
        "floor_all_written_s": 5.0,
        "idle_cpu_s_per_min": 0.04,
        "full_resync_over_model_passes": 0.7,
        **extra,
    }


def test_the_arrivals_floor_is_the_same_clocks_ratio_beside_the_issues_own() -> None:
    result = with_goals(_run_figures(floor_arrivals_all_written_s=11.0), rate=None)
    assert result["all_reconciled_over_floor"] == 2.6
    assert result["all_reconciled_over_arrivals_floor"] == 1.182
    assert result["goal_met_burst_over_arrivals"] is True
    # informative: the run's goal stays the one over the floor without arrivals
    assert result["goal_met_burst"] is False and result["goal_met"] is False
    slow = with_goals(_run_figures(floor_arrivals_all_written_s=9.0), rate=None)
    assert slow["goal_met_burst_over_arrivals"] is False
    assert with_goals(_run_figures(), rate=None)["goal_met_burst_over_arrivals"] is None
    assert (
        with_goals(_run_figures(floor_arrivals_all_written_s=11.0), rate=10.0)["goal_met_burst_over_arrivals"]
        is None
    )

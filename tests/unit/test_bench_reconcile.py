"""bench reconcile judges a run by the goal of its size: up to 100 models the first goal (p50
1 s, 150 MiB), beyond it the thousand-model one (p50 2 s, every model within 30 s, 300 MiB)."""

from __future__ import annotations

from typing import Any

import pytest

from pdwarden_bench.reconcile import LARGE_GOAL, SMALL_GOAL, goal_for, goal_met

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

"""`pdwarden bench transfer`'s pure parts: the paired ratios, their summary and the round
order; the JSON keys its docstring names."""

from __future__ import annotations

import pytest

import pdwarden_bench.transfer as transfer
from pdwarden_bench.arms import paired_ratios, ratio_summary, round_order
from pdwarden_bench.transfer import (
    ARMS,
    RATIOS,
    summarize,
)
from pdwarden_runtime.hardening.config import BENCH_HARDENING_MODES, HARDENING_OFF, HARDENING_ON

pytestmark = pytest.mark.unit


def test_paired_ratios_divide_within_each_round() -> None:
    assert paired_ratios([2.0, 3.0, 8.0], [1.0, 3.0, 4.0]) == [2.0, 1.0, 2.0]


@pytest.mark.parametrize(
    "top, bottom, message",
    [
        ([1.0], [1.0, 2.0], "equal, non-empty"),
        ([], [], "equal, non-empty"),
        ([1.0], [0.0], "positive denominators"),
    ],
)
def test_paired_ratios_refuse_unpaired_or_zero_series(
    top: list[float], bottom: list[float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        paired_ratios(top, bottom)


def test_ratio_summary_is_the_median_with_its_spread() -> None:
    assert ratio_summary("a_over_b", [1.2, 0.9, 1.05, 1.5]) == {
        "a_over_b": 1.125,
        "a_over_b_min": 0.9,
        "a_over_b_max": 1.5,
    }
    assert ratio_summary("x", [1.23456]) == {"x": 1.235, "x_min": 1.235, "x_max": 1.235}


def test_round_order_alternates_so_no_arm_always_goes_first() -> None:
    arms = ["stock", "hardened", "stock_prompt_wake"]
    assert round_order(arms, 0) == arms
    assert round_order(arms, 1) == list(reversed(arms))
    assert round_order(arms, 2) == arms
    firsts = {round_order(arms, i)[0] for i in range(4)}
    assert firsts == {"stock", "stock_prompt_wake"}


def test_summarize_reports_paired_ratios_not_ratios_of_medians() -> None:
    # Round 2 is slow for every arm (machine load): within each round hardened is 10%
    # faster than stock, which the ratio of the medians (3.3 / 2.0 = 1.65) would hide.
    rates = {
        "stock": [2.0, 1.0, 3.0],
        "hardened": [2.2, 1.1, 3.3],
        "stock_prompt_wake": [2.0, 1.0, 3.6],
    }
    result = summarize(rates)
    assert result["stock_gbps"] == 2.0 and result["hardened_gbps"] == 2.2
    assert result["stock_prompt_wake_gbps"] == 2.0
    assert result["hardened_over_stock"] == 1.1
    assert result["hardened_over_stock_min"] == 1.1 and result["hardened_over_stock_max"] == 1.1
    assert result["stock_prompt_wake_over_stock"] == 1.0
    assert result["stock_prompt_wake_over_stock_max"] == 1.2
    assert result["hardened_over_stock_prompt_wake"] == 1.1
    assert result["hardened_over_stock_prompt_wake_min"] == pytest.approx(0.917)


def test_the_arms_are_stock_hardened_and_the_bench_only_stock_mode() -> None:
    assert ARMS["stock"] == HARDENING_OFF and ARMS["hardened"] == HARDENING_ON
    assert ARMS["stock_prompt_wake"] in BENCH_HARDENING_MODES
    for top, bottom in RATIOS.values():
        assert top in ARMS and bottom in ARMS


def test_the_docstring_names_every_json_key() -> None:
    keys = set(summarize({arm: [1.0] for arm in ARMS}))
    keys |= {"size_bytes", "chunk_bytes", "pairs", "raw_iters", "seconds", "stock_over_raw_best"}
    keys |= {"raw_nixl_best_gbps", "raw_nixl_large_gbps", "raw_nixl_batched_gbps", "raw_nixl_error"}
    doc = " ".join((transfer.__doc__ or "").split())
    for key in keys:
        base = key.removesuffix("_min").removesuffix("_max")
        assert base in doc, key
    assert "_min and _max" in doc

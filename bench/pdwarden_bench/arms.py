"""The runtime arms the benchmarks compare, and paired rounds over them: every arm runs in
every round, in an order reversed every other round, and a ratio between two arms is the
median of its per-round ratios (a round's load drift falls on both of its arms alike)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Final

from pdwarden_runtime.hardening.config import (
    HARDENING_BENCH_STOCK_PROMPT_WAKE,
    HARDENING_OFF,
    HARDENING_ON,
)

HARDENED: Final = "hardened"
STOCK: Final = "stock"
# Stock whose requests learn of a finished transfer at once, as hardened ones do (stock's
# learn of it at the status mirror's next copy): bench only, synthetic engine only.
PROMPT_WAKE: Final = "stock_prompt_wake"
# An arm's name in the JSON -> the runtime's --hardening mode.
ARM_MODES: Final = {
    HARDENED: HARDENING_ON,
    STOCK: HARDENING_OFF,
    PROMPT_WAKE: HARDENING_BENCH_STOCK_PROMPT_WAKE,
}


def paired_ratios(numerator: Sequence[float], denominator: Sequence[float]) -> list[float]:
    """numerator[i] / denominator[i] for each round i (both arms measured in round i)."""
    if len(numerator) != len(denominator) or not numerator:
        raise ValueError(f"paired ratios need equal, non-empty series ({len(numerator)}, {len(denominator)})")
    if any(value <= 0 for value in denominator):
        raise ValueError("paired ratios need positive denominators")
    return [top / bottom for top, bottom in zip(numerator, denominator, strict=True)]


def ratio_summary(key: str, ratios: Sequence[float]) -> dict[str, float]:
    """The median of paired ratios as ``key``, with its spread as ``key``_min / _max."""
    return {
        key: round(statistics.median(ratios), 3),
        f"{key}_min": round(min(ratios), 3),
        f"{key}_max": round(max(ratios), 3),
    }


def round_order(arms: Sequence[str], index: int) -> list[str]:
    """The arms' order in round ``index``: as given in even rounds, reversed in odd ones,
    so no arm always goes first or last (a round's load drift falls on both sides)."""
    return list(arms) if index % 2 == 0 else list(reversed(arms))

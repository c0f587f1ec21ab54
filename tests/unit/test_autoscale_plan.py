"""The autoscaling planner (operator/pdwarden_operator/watchdog/autoscale.py): load -> desired
replicas per role, with the tolerance, the windows, the step limits and the prefill:decode band."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdwarden_contract import RUNTIME_ROLES
from pdwarden_operator.resource.autoscaling import AutoscalingSpec, AutoscalingTarget, RatioBand, ScalePolicy
from pdwarden_operator.watchdog.autoscale import (
    PodLoad,
    Reason,
    RoleMemory,
    fresh,
    plan,
    recommend,
    remember,
    write_order,
)

pytestmark = pytest.mark.unit

NOW = 1000.0
OLD = RoleMemory(started_at=0.0)  # has watched every window


def pod(
    inflight: float = 0.0,
    age: float | None = None,
    pages: float | None = None,
    ready: bool = True,
    wedged: bool = False,
    name: str = "p",
) -> PodLoad:
    return PodLoad(name, ready, wedged, inflight, age, pages)


def inflights(*values: float) -> list[PodLoad]:
    return [pod(v, name=f"p{i}") for i, v in enumerate(values)]


# The spec's parts built without their validation: the planner must hold up for figures the
# spec's rules refuse (no target, a zero one, a zero step or period, a band from 0).


def load_target(
    inflight: float | None = None, age: float | None = None, pages: float | None = None
) -> AutoscalingTarget:
    return AutoscalingTarget.model_construct(
        inflight_per_pod=inflight, queue_age_seconds=age, kv_pages_in_use=pages
    )


def policy(stabilization: float, step: int, period: float) -> ScalePolicy:
    return ScalePolicy.model_construct(
        stabilization_seconds=stabilization, max_step=step, period_seconds=period
    )


def role_scaling(
    lo: int, hi: int, target: AutoscalingTarget, up: ScalePolicy, down: ScalePolicy
) -> AutoscalingSpec:
    return AutoscalingSpec.model_construct(
        min_replicas=lo, max_replicas=hi, target=target, scale_up=up, scale_down=down
    )


def ratio_band(least: float, most: float) -> RatioBand:
    return RatioBand.model_construct(min=least, max=most)


def scaling(
    lo: int = 1,
    hi: int = 10,
    inflight: float | None = 4.0,
    age: float | None = None,
    pages: float | None = None,
    up: tuple[float, int, float] = (0.0, 100, 60.0),
    down: tuple[float, int, float] = (0.0, 100, 60.0),
) -> AutoscalingSpec:
    return role_scaling(lo, hi, load_target(inflight, age, pages), policy(*up), policy(*down))


def mem(
    recs: tuple[tuple[float, int], ...] = (),
    changes: tuple[tuple[float, int], ...] = (),
    started: float = 0.0,
) -> RoleMemory:
    return RoleMemory(started, recs, changes)


@dataclass(frozen=True)
class Case:
    id: str
    roles: dict[str, AutoscalingSpec]
    current: dict[str, int]
    loads: dict[str, list[PodLoad]]
    expect: dict[str, tuple[int, Reason]]  # role -> (desired, reason)
    memory: dict[str, RoleMemory] = field(default_factory=dict)  # missing role: OLD unless fresh_roles
    ratio: RatioBand | None = None
    unkeepable: bool = False
    saturated: tuple[str, ...] = ()
    says: dict[str, tuple[str, ...]] = field(default_factory=dict)  # role (or "ratio") -> substrings
    fresh_roles: tuple[str, ...] = ()


BAND = ratio_band(0.5, 2.0)
SLOW_DOWN = (300.0, 100, 60.0)

CASES = [
    # --- tolerance and the plain recommendation ---
    Case(
        "steady",
        {"prefill": scaling()},
        {"prefill": 3},
        {"prefill": inflights(4.2, 4.0, 4.1)},
        {"prefill": (3, Reason.STEADY)},
        says={"prefill": ("holds 3", "mean inflight 4.1", "10% tolerance")},
    ),
    Case(
        "tolerance-edge-holds",
        {"prefill": scaling()},
        {"prefill": 3},
        {"prefill": inflights(4.4, 4.4, 4.4)},
        {"prefill": (3, Reason.STEADY)},
    ),
    Case(
        "just-over-tolerance",
        {"prefill": scaling()},
        {"prefill": 3},
        {"prefill": inflights(4.5, 4.5, 4.5)},
        {"prefill": (4, Reason.LOAD_ABOVE_TARGET)},
    ),
    Case(
        "just-under-tolerance",
        {"prefill": scaling()},
        {"prefill": 4},
        {"prefill": inflights(3.5, 3.5, 3.5, 3.5)},
        {"prefill": (4, Reason.STEADY)},
        says={"prefill": ("0.88x", "rounds to no change")},
    ),
    Case(
        "scale-up-inflight",
        {"prefill": scaling()},
        {"prefill": 3},
        {"prefill": inflights(8, 8, 8)},
        {"prefill": (6, Reason.LOAD_ABOVE_TARGET)},
        says={"prefill": ("prefill: 3 -> 6", "mean inflight 8 per pod over 3 pods", "2.00x the target 4")},
    ),
    Case(
        "scale-up-fractional",
        {"prefill": scaling()},
        {"prefill": 3},
        {"prefill": inflights(7.2, 7.2, 7.2)},
        {"prefill": (6, Reason.LOAD_ABOVE_TARGET)},
        says={"prefill": ("7.2 per pod", "1.80x")},
    ),
    Case(
        "scale-down-inflight",
        {"prefill": scaling()},
        {"prefill": 4},
        {"prefill": inflights(2, 2, 2, 2)},
        {"prefill": (2, Reason.LOAD_BELOW_TARGET)},
        says={"prefill": ("prefill: 4 -> 2", "0.50x")},
    ),
    # --- bounds ---
    Case(
        "idle-to-min",
        {"prefill": scaling(lo=2)},
        {"prefill": 4},
        {"prefill": inflights(0, 0, 0, 0)},
        {"prefill": (2, Reason.AT_MIN)},
        says={"prefill": ("wants 0", "minReplicas 2")},
    ),
    Case(
        "at-min-holds",
        {"prefill": scaling(lo=2)},
        {"prefill": 2},
        {"prefill": inflights(0, 0)},
        {"prefill": (2, Reason.AT_MIN)},
    ),
    Case(
        "capped-at-max",
        {"prefill": scaling(hi=10)},
        {"prefill": 8},
        {"prefill": inflights(*[10] * 8)},
        {"prefill": (10, Reason.AT_MAX)},
        saturated=("prefill",),
        says={"prefill": ("8 -> 10", "wants 20", "maxReplicas 10")},
    ),
    Case(
        "at-max-saturated",
        {"prefill": scaling(hi=10)},
        {"prefill": 10},
        {"prefill": inflights(*[8] * 10)},
        {"prefill": (10, Reason.AT_MAX)},
        saturated=("prefill",),
    ),
    Case(
        "at-max-steady-unsaturated",
        {"prefill": scaling(hi=10)},
        {"prefill": 10},
        {"prefill": inflights(*[4] * 10)},
        {"prefill": (10, Reason.STEADY)},
    ),
    Case(
        "above-max-out-of-bounds",
        {"prefill": scaling(hi=10, down=(300.0, 1, 60.0))},
        {"prefill": 14},
        {"prefill": inflights(*[8] * 14)},
        {"prefill": (10, Reason.OUT_OF_BOUNDS)},
        saturated=("prefill",),
        says={"prefill": ("14 -> 10", "outside [1, 10]")},
    ),
    Case(
        "below-min-out-of-bounds",
        {"prefill": scaling(lo=2, up=(600.0, 1, 60.0))},
        {"prefill": 0},
        {"prefill": []},
        {"prefill": (2, Reason.OUT_OF_BOUNDS)},
    ),
    Case(
        "out-of-bounds-fresh-memory",
        {"decode": scaling(hi=3, down=SLOW_DOWN)},
        {"decode": 5},
        {"decode": inflights(0)},
        {"decode": (3, Reason.OUT_OF_BOUNDS)},
        fresh_roles=("decode",),
    ),
    # --- targets ---
    Case(
        "queue-age",
        {"prefill": scaling(inflight=None, age=5.0)},
        {"prefill": 2},
        {"prefill": [pod(1, age=10), pod(1, age=10)]},
        {"prefill": (4, Reason.LOAD_ABOVE_TARGET)},
        says={"prefill": ("oldest-room age 10s over 2 pods", "target 5s")},
    ),
    Case(
        "queue-age-none-skipped",
        {"prefill": scaling(inflight=None, age=6.0)},
        {"prefill": 4},
        {"prefill": [pod(age=None), pod(age=12), pod(age=None), pod(age=12)]},
        {"prefill": (8, Reason.LOAD_ABOVE_TARGET)},
        says={"prefill": ("over 2 pods",)},
    ),
    Case(
        "kv-pages-up",
        {"decode": scaling(inflight=None, pages=1000.0)},
        {"decode": 2},
        {"decode": [pod(pages=1500), pod(pages=1500)]},
        {"decode": (3, Reason.LOAD_ABOVE_TARGET)},
        says={"decode": ("KV pages in use 1500 per pod", "target 1000")},
    ),
    Case(
        "kv-pages-down",
        {"decode": scaling(inflight=None, pages=1000.0)},
        {"decode": 4},
        {"decode": [pod(pages=200)] * 4},
        {"decode": (1, Reason.LOAD_BELOW_TARGET)},
    ),
    Case(
        "highest-target-wins-age",
        {"prefill": scaling(inflight=4.0, age=5.0)},
        {"prefill": 2},
        {"prefill": [pod(4, age=15), pod(4, age=15)]},
        {"prefill": (6, Reason.LOAD_ABOVE_TARGET)},
        says={"prefill": ("oldest-room age", "3.00x")},
    ),
    Case(
        "highest-target-wins-inflight",
        {"prefill": scaling(inflight=4.0, age=5.0)},
        {"prefill": 2},
        {"prefill": [pod(12, age=1), pod(12, age=1)]},
        {"prefill": (6, Reason.LOAD_ABOVE_TARGET)},
        says={"prefill": ("mean inflight 12",)},
    ),
    Case(
        "decode-inflight-and-pages",
        {"decode": scaling(inflight=4.0, pages=1000.0)},
        {"decode": 2},
        {"decode": [pod(2, pages=2000), pod(2, pages=2000)]},
        {"decode": (4, Reason.LOAD_ABOVE_TARGET)},
    ),
    # --- what counts ---
    Case(
        "wedged-queue-ignored",
        {"prefill": scaling(age=5.0)},
        {"prefill": 3},
        {"prefill": [pod(500, age=900, wedged=True), pod(4, age=5), pod(4, age=5)]},
        {"prefill": (3, Reason.STEADY)},
    ),
    Case(
        "unready-ignored",
        {"prefill": scaling()},
        {"prefill": 3},
        {"prefill": [pod(100, ready=False), pod(4), pod(4)]},
        {"prefill": (3, Reason.STEADY)},
    ),
    Case(
        "all-wedged-no-signal",
        {"prefill": scaling()},
        {"prefill": 3},
        {"prefill": [pod(50, wedged=True), pod(50, wedged=True)]},
        {"prefill": (3, Reason.NO_SIGNAL)},
        says={"prefill": ("holds 3", "no ready, unwedged pod")},
    ),
    Case("no-pods-no-signal", {"decode": scaling()}, {"decode": 5}, {}, {"decode": (5, Reason.NO_SIGNAL)}),
    Case(
        "signal-not-exported",
        {"prefill": scaling(inflight=None, age=5.0)},
        {"prefill": 3},
        {"prefill": [pod(9), pod(9)]},
        {"prefill": (3, Reason.NO_SIGNAL)},
    ),
    Case(
        "overload-while-pods-start",
        {"prefill": scaling()},
        {"prefill": 5},
        {"prefill": [pod(6), *[pod(0, ready=False)] * 4]},
        {"prefill": (5, Reason.STEADY)},
        says={"prefill": ("1 of 5 pods counted",)},
    ),
    # --- stabilisation windows ---
    Case(
        "up-window-lowest",
        {"prefill": scaling(up=(60.0, 100, 60.0))},
        {"prefill": 3},
        {"prefill": inflights(*[32 / 3] * 3)},
        {"prefill": (4, Reason.LOAD_ABOVE_TARGET)},
        memory={"prefill": mem(((950.0, 4), (980.0, 7)))},
    ),
    Case(
        "up-window-holds",
        {"prefill": scaling(up=(60.0, 100, 60.0))},
        {"prefill": 3},
        {"prefill": inflights(8, 8, 8)},
        {"prefill": (3, Reason.STABILISING)},
        memory={"prefill": mem(((970.0, 3),))},
        says={"prefill": ("wants 6", "lowest", "60s scale-up window")},
    ),
    Case(
        "up-window-expired",
        {"prefill": scaling(up=(60.0, 100, 60.0))},
        {"prefill": 3},
        {"prefill": inflights(8, 8, 8)},
        {"prefill": (6, Reason.LOAD_ABOVE_TARGET)},
        memory={"prefill": mem(((940.0, 3), (900.0, 1)))},
    ),
    Case(
        "down-window-highest",
        {"decode": scaling(down=SLOW_DOWN)},
        {"decode": 8},
        {"decode": inflights(*[1] * 8)},
        {"decode": (6, Reason.LOAD_BELOW_TARGET)},
        memory={"decode": mem(((800.0, 6), (900.0, 5)))},
    ),
    Case(
        "down-window-holds",
        {"decode": scaling(down=SLOW_DOWN)},
        {"decode": 6},
        {"decode": inflights(*[1] * 6)},
        {"decode": (6, Reason.STABILISING)},
        memory={"decode": mem(((900.0, 6),))},
        says={"decode": ("highest", "300s scale-down window is 6")},
    ),
    Case(
        "down-window-expired",
        {"decode": scaling(down=SLOW_DOWN)},
        {"decode": 6},
        {"decode": inflights(*[1] * 6)},
        {"decode": (2, Reason.LOAD_BELOW_TARGET)},
        memory={"decode": mem(((700.0, 6), (600.0, 9)))},
    ),
    Case(
        "fresh-never-scales-down",
        {"decode": scaling(down=SLOW_DOWN)},
        {"decode": 6},
        {"decode": inflights(*[1] * 6)},
        {"decode": (6, Reason.STABILISING)},
        fresh_roles=("decode",),
        says={"decode": ("watched 0s of the 300s",)},
    ),
    Case(
        "young-memory-never-scales-down",
        {"decode": scaling(down=SLOW_DOWN)},
        {"decode": 6},
        {"decode": inflights(*[1] * 6)},
        {"decode": (6, Reason.STABILISING)},
        memory={"decode": mem(started=NOW - 299)},
    ),
    Case(
        "memory-one-window-old-scales-down",
        {"decode": scaling(down=SLOW_DOWN)},
        {"decode": 6},
        {"decode": inflights(*[1] * 6)},
        {"decode": (2, Reason.LOAD_BELOW_TARGET)},
        memory={"decode": mem(started=NOW - 300)},
    ),
    Case(
        "fresh-scales-up",
        {"prefill": scaling(down=SLOW_DOWN)},
        {"prefill": 2},
        {"prefill": inflights(8, 8)},
        {"prefill": (4, Reason.LOAD_ABOVE_TARGET)},
        fresh_roles=("prefill",),
    ),
    # --- step limits ---
    Case(
        "step-up",
        {"prefill": scaling(up=(0.0, 2, 60.0))},
        {"prefill": 3},
        {"prefill": inflights(11, 11, 11)},
        {"prefill": (5, Reason.STEP_LIMITED)},
        says={"prefill": ("3 -> 5", "wants 9", "step limit 2 per 60s")},
    ),
    Case(
        "step-up-budget-used",
        {"prefill": scaling(up=(0.0, 2, 60.0))},
        {"prefill": 3},
        {"prefill": inflights(11, 11, 11)},
        {"prefill": (3, Reason.STEP_LIMITED)},
        memory={"prefill": mem(changes=((980.0, 2),))},
        says={"prefill": ("holds 3", "2 used")},
    ),
    Case(
        "step-up-partial-budget",
        {"prefill": scaling(up=(0.0, 2, 60.0))},
        {"prefill": 3},
        {"prefill": inflights(11, 11, 11)},
        {"prefill": (4, Reason.STEP_LIMITED)},
        memory={"prefill": mem(changes=((980.0, 1),))},
    ),
    Case(
        "step-up-period-expired",
        {"prefill": scaling(up=(0.0, 2, 60.0))},
        {"prefill": 3},
        {"prefill": inflights(11, 11, 11)},
        {"prefill": (5, Reason.STEP_LIMITED)},
        memory={"prefill": mem(changes=((940.0, 2), (900.0, 2)))},
    ),
    Case(
        "step-up-ignores-downs",
        {"prefill": scaling(up=(0.0, 2, 60.0))},
        {"prefill": 3},
        {"prefill": inflights(11, 11, 11)},
        {"prefill": (5, Reason.STEP_LIMITED)},
        memory={"prefill": mem(changes=((990.0, -3),))},
    ),
    Case(
        "step-within-limit",
        {"prefill": scaling(up=(0.0, 4, 60.0))},
        {"prefill": 3},
        {"prefill": inflights(6, 6, 6)},
        {"prefill": (5, Reason.LOAD_ABOVE_TARGET)},
        memory={"prefill": mem(changes=((990.0, 2),))},
    ),
    Case(
        "step-down",
        {"decode": scaling(down=(0.0, 1, 60.0))},
        {"decode": 6},
        {"decode": inflights(*[1] * 6)},
        {"decode": (5, Reason.STEP_LIMITED)},
        says={"decode": ("6 -> 5", "scale-down step limit 1 per 60s")},
    ),
    Case(
        "step-down-budget-used",
        {"decode": scaling(down=(0.0, 1, 60.0))},
        {"decode": 6},
        {"decode": inflights(*[1] * 6)},
        {"decode": (6, Reason.STEP_LIMITED)},
        memory={"decode": mem(changes=((990.0, -1),))},
    ),
    Case(
        "step-down-period-expired",
        {"decode": scaling(down=(0.0, 1, 60.0))},
        {"decode": 6},
        {"decode": inflights(*[1] * 6)},
        {"decode": (5, Reason.STEP_LIMITED)},
        memory={"decode": mem(changes=((930.0, -1),))},
    ),
    # --- the band ---
    Case(
        "band-above-raises-decode",
        {"prefill": scaling(), "decode": scaling()},
        {"prefill": 3, "decode": 2},
        {"prefill": inflights(8, 8, 8), "decode": inflights(4, 4)},
        {"prefill": (6, Reason.LOAD_ABOVE_TARGET), "decode": (3, Reason.RATIO_BAND)},
        ratio=BAND,
        says={"decode": ("2 -> 3", "6:3", "band [0.5, 2]", "gave 2")},
    ),
    Case(
        "band-above-lowers-prefill",
        {"prefill": scaling(), "decode": scaling(hi=2)},
        {"prefill": 3, "decode": 2},
        {"prefill": inflights(8, 8, 8), "decode": inflights(4, 4)},
        {"prefill": (4, Reason.RATIO_BAND), "decode": (2, Reason.STEADY)},
        ratio=BAND,
        says={"prefill": ("3 -> 4", "4:2", "gave 6")},
    ),
    Case(
        "band-above-unkeepable",
        {"prefill": scaling(lo=5), "decode": scaling(hi=2)},
        {"prefill": 6, "decode": 2},
        {"prefill": inflights(*[4] * 6), "decode": inflights(4, 4)},
        {"prefill": (5, Reason.RATIO_BAND), "decode": (2, Reason.STEADY)},
        ratio=BAND,
        unkeepable=True,
        says={"ratio": ("5:2", "prefill in [5, 10]", "decode in [1, 2]", "[0.5, 2]")},
    ),
    Case(
        "band-below-raises-prefill",
        {"prefill": scaling(), "decode": scaling()},
        {"prefill": 2, "decode": 4},
        {"prefill": inflights(4, 4), "decode": inflights(8, 8, 8, 8)},
        {"prefill": (4, Reason.RATIO_BAND), "decode": (8, Reason.LOAD_ABOVE_TARGET)},
        ratio=BAND,
    ),
    Case(
        "band-below-lowers-decode",
        {"prefill": scaling(hi=3), "decode": scaling()},
        {"prefill": 2, "decode": 4},
        {"prefill": inflights(4, 4), "decode": inflights(8, 8, 8, 8)},
        {"prefill": (3, Reason.RATIO_BAND), "decode": (6, Reason.RATIO_BAND)},
        ratio=BAND,
    ),
    Case(
        "band-below-unkeepable",
        {"prefill": scaling(hi=3), "decode": scaling(lo=8)},
        {"prefill": 2, "decode": 8},
        {"prefill": inflights(4, 4), "decode": inflights(*[4] * 8)},
        {"prefill": (3, Reason.RATIO_BAND), "decode": (8, Reason.STEADY)},
        ratio=BAND,
        unkeepable=True,
        says={"ratio": ("3:8", "prefill in [1, 3]", "decode in [8, 10]")},
    ),
    Case(
        "band-fixed-prefill-raises-decode",
        {"decode": scaling()},
        {"prefill": 6, "decode": 3},
        {"decode": inflights(2, 2, 2)},
        {"decode": (3, Reason.RATIO_BAND)},
        ratio=BAND,
        says={"decode": ("holds 3", "6:3", "gave 2")},
    ),
    Case(
        "band-fixed-decode-lowers-prefill",
        {"prefill": scaling()},
        {"prefill": 4, "decode": 2},
        {"prefill": inflights(8, 8, 8, 8)},
        {"prefill": (4, Reason.RATIO_BAND)},
        ratio=BAND,
    ),
    Case(
        "band-fixed-decode-unkeepable",
        {"prefill": scaling(lo=4)},
        {"prefill": 4, "decode": 1},
        {"prefill": inflights(4, 4, 4, 4)},
        {"prefill": (4, Reason.STEADY)},
        ratio=BAND,
        unkeepable=True,
        says={"ratio": ("decode fixed at 1",)},
    ),
    Case(
        "band-inside-no-move",
        {"prefill": scaling(), "decode": scaling()},
        {"prefill": 3, "decode": 3},
        {"prefill": inflights(4, 4, 4), "decode": inflights(4, 4, 4)},
        {"prefill": (3, Reason.STEADY), "decode": (3, Reason.STEADY)},
        ratio=BAND,
    ),
    Case(
        "band-floor-float",
        {"prefill": scaling(hi=50)},
        {"prefill": 20, "decode": 100},
        {"prefill": inflights(*[8] * 20)},
        {"prefill": (29, Reason.RATIO_BAND)},
        ratio=ratio_band(0.1, 0.29),
    ),
    Case(
        "band-ceil-float",
        {"decode": scaling(hi=200)},
        {"prefill": 29, "decode": 100},
        {"decode": inflights(*[2] * 100)},
        {"decode": (100, Reason.RATIO_BAND)},
        ratio=ratio_band(0.1, 0.29),
    ),
    Case(
        "band-narrow",
        {"prefill": scaling(), "decode": scaling()},
        {"prefill": 4, "decode": 2},
        {"prefill": inflights(4, 4, 4, 4), "decode": inflights(4, 4)},
        {"prefill": (6, Reason.RATIO_BAND), "decode": (4, Reason.RATIO_BAND)},
        ratio=ratio_band(1.5, 1.5),
        says={"prefill": ("4 -> 6", "6:4")},
    ),
    Case(
        "band-narrow-capped",
        {"prefill": scaling(hi=5), "decode": scaling()},
        {"prefill": 4, "decode": 2},
        {"prefill": inflights(4, 4, 4, 4), "decode": inflights(4, 4)},
        {"prefill": (3, Reason.RATIO_BAND), "decode": (2, Reason.STEADY)},
        ratio=ratio_band(1.5, 1.5),
    ),
    Case(
        "band-bypasses-windows",
        {"prefill": scaling(), "decode": scaling(up=(600.0, 1, 600.0))},
        {"prefill": 2, "decode": 1},
        {"prefill": inflights(12, 12), "decode": inflights(4)},
        {"prefill": (6, Reason.LOAD_ABOVE_TARGET), "decode": (3, Reason.RATIO_BAND)},
        ratio=BAND,
        memory={"decode": mem(((900.0, 1),), ((950.0, 1),))},
    ),
    Case(
        "band-tiny-max-unkeepable",
        {"prefill": scaling(), "decode": scaling()},
        {"prefill": 2, "decode": 2},
        {"prefill": inflights(4, 4), "decode": inflights(4, 4)},
        {"prefill": (1, Reason.RATIO_BAND), "decode": (10, Reason.RATIO_BAND)},
        ratio=ratio_band(0.0, 2e-9),
        unkeepable=True,
    ),
    Case(
        "band-no-signal-role-moved",
        {"prefill": scaling(), "decode": scaling()},
        {"prefill": 4, "decode": 1},
        {"prefill": inflights(4, 4, 4, 4)},
        {"prefill": (4, Reason.STEADY), "decode": (2, Reason.RATIO_BAND)},
        ratio=BAND,
        says={"decode": ("NoSignal",)},
    ),
    Case(
        "band-skipped-at-zero",
        {"prefill": scaling(), "decode": scaling(lo=0)},
        {"prefill": 3, "decode": 1},
        {"prefill": inflights(4, 4, 4), "decode": inflights(0)},
        {"prefill": (3, Reason.STEADY), "decode": (0, Reason.LOAD_BELOW_TARGET)},
        ratio=BAND,
    ),
    Case(
        "no-band-no-move",
        {"prefill": scaling(), "decode": scaling()},
        {"prefill": 8, "decode": 1},
        {"prefill": inflights(*[4] * 8), "decode": inflights(4)},
        {"prefill": (8, Reason.STEADY), "decode": (1, Reason.STEADY)},
    ),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_plan(case: Case) -> None:
    memory = {r: case.memory.get(r, OLD) for r in case.roles if r not in case.fresh_roles}
    result = plan(case.roles, case.current, case.loads, memory, case.ratio, NOW)

    assert set(result.decisions) == set(case.roles) == set(result.memory)
    got = {r: (d.desired, d.reason) for r, d in result.decisions.items()}
    assert got == case.expect, {r: d.message for r, d in result.decisions.items()}
    assert result.ratio_unkeepable is case.unkeepable
    assert {r for r, d in result.decisions.items() if d.saturated} == set(case.saturated)
    for role, parts in case.says.items():
        text = result.ratio_message if role == "ratio" else result.decisions[role].message
        for part in parts:
            assert part in text
    for r, d in result.decisions.items():
        assert d.message.startswith(f"{r}: ")
        lo, hi = case.roles[r].min_replicas, case.roles[r].max_replicas
        assert lo <= d.desired <= hi
        assert lo <= d.recommended <= hi or d.reason is Reason.NO_SIGNAL
        # every applied change is remembered, none other
        made = [c for c in result.memory[r].changes if c[0] == NOW]
        assert made == ([(NOW, d.desired - d.current)] if d.desired != d.current else [])


@pytest.mark.parametrize(
    ("target", "current", "pods", "expected"),
    [
        pytest.param(load_target(4.0), 3, inflights(8, 8, 8), (6, 2.0), id="double"),
        pytest.param(load_target(4.0), 3, inflights(4.4, 4.4, 4.4), (3, 1.1), id="tolerance"),
        pytest.param(load_target(4.0), 4, inflights(0, 0, 0, 0), (0, 0.0), id="idle-to-zero"),
        pytest.param(load_target(4.0), 5, inflights(12), (5, 3.0), id="never-down-when-above"),
        pytest.param(load_target(4.0), 2, inflights(1, 1, 1, 1), (1, 0.25), id="extra-pods-counted"),
        pytest.param(load_target(4.0), 1, inflights(2, 2, 2), (1, 0.5), id="never-up-when-below"),
        pytest.param(load_target(None, 5.0), 2, inflights(8, 8), (None, None), id="no-data"),
        pytest.param(load_target(), 2, inflights(8, 8), (None, None), id="no-target"),
        pytest.param(load_target(0.0), 2, inflights(8, 8), (None, None), id="zero-target-unset"),
        pytest.param(load_target(4.0), 2, [], (None, None), id="no-pods"),
        pytest.param(load_target(4.0), 2, [pod(8, wedged=True)], (None, None), id="wedged-only"),
        pytest.param(
            load_target(4.0, 5.0), 2, [pod(4, age=20), pod(4, age=None)], (8, 4.0), id="age-over-one-pod"
        ),
        pytest.param(load_target(None, None, 100.0), 3, [pod(pages=120)] * 3, (4, 1.2), id="pages"),
    ],
)
def test_recommend(
    target: AutoscalingTarget, current: int, pods: list[PodLoad], expected: tuple[int | None, float | None]
):
    raw, load = recommend(role_scaling(1, 10, target, policy(0, 1, 1), policy(0, 1, 1)), current, pods)
    assert raw == expected[0]
    assert load == (None if expected[1] is None else pytest.approx(expected[1]))


def test_no_signal_records_no_recommendation() -> None:
    s = scaling(up=(60.0, 100, 60.0))
    result = plan({"prefill": s}, {"prefill": 3}, {}, {"prefill": mem(((990.0, 6),))}, None, NOW)
    assert result.memory["prefill"].recommendations == ((990.0, 6),)


def test_out_of_bounds_records_recommendation_and_change() -> None:
    result = plan({"prefill": scaling(hi=4)}, {"prefill": 7}, {"prefill": inflights(*[2] * 7)}, {}, None, NOW)
    d = result.decisions["prefill"]
    assert (d.desired, d.recommended) == (4, 4)
    assert result.memory["prefill"].recommendations == ((NOW, 4),)
    assert result.memory["prefill"].changes == ((NOW, -3),)


def test_memory_pruned_to_longest_window_and_period() -> None:
    s = scaling(up=(60.0, 5, 30.0), down=(300.0, 5, 120.0))
    old = mem(((600.0, 9), (750.0, 3), (990.0, 4)), ((850.0, 1), (900.0, -1), (995.0, 1)))
    kept = plan({"decode": s}, {"decode": 4}, {"decode": inflights(4, 4, 4, 4)}, {"decode": old}, None, NOW)
    m = kept.memory["decode"]
    assert m.recommendations == ((750.0, 3), (990.0, 4), (NOW, 4))  # 600 is past the 300s window
    assert m.changes == ((900.0, -1), (995.0, 1))  # 850 is past the 120s period
    assert m.started_at == 0.0


def test_remember_and_fresh() -> None:
    m = fresh(5.0)
    assert m == RoleMemory(5.0)
    assert remember(m, 6.0, 0) is m
    assert remember(remember(m, 6.0, 2), 7.0, -1).changes == ((6.0, 2), (7.0, -1))


def test_step_budget_across_rounds() -> None:
    """2 pods per 60s: +2 now, nothing 30s later, +2 once the first change is 60s old."""
    s = scaling(up=(0.0, 2, 60.0))
    current, memory, seen = 2, {"prefill": fresh(0.0)}, []
    for now in (1000.0, 1030.0, 1060.0):
        p = plan(
            {"prefill": s}, {"prefill": current}, {"prefill": inflights(*[40] * current)}, memory, None, now
        )
        d = p.decisions["prefill"]
        seen.append((d.desired, d.reason))
        current, memory = d.desired, p.memory
    assert seen == [(4, Reason.STEP_LIMITED), (4, Reason.STEP_LIMITED), (6, Reason.STEP_LIMITED)]


def test_fixed_roles_not_planned_nor_remembered() -> None:
    result = plan({}, {"prefill": 9, "decode": 1}, {}, {}, BAND, NOW)
    assert result.decisions == {} and result.memory == {}
    assert not result.ratio_unkeepable


def test_reasons_are_camel_case() -> None:
    for reason in Reason:
        assert reason.value[0].isupper() and " " not in reason.value and "_" not in reason.value
    assert RUNTIME_ROLES == ("prefill", "decode")  # the band's order: prefill, then decode


# --- property --------------------------------------------------------------------------

bounds = st.tuples(st.integers(1, 8), st.integers(0, 8)).map(lambda t: (t[0], t[0] + t[1]))
loads = st.lists(
    st.builds(
        PodLoad,
        name=st.just("p"),
        ready=st.booleans(),
        wedged=st.booleans(),
        inflight=st.floats(0, 50),
        queue_age=st.none() | st.floats(0, 100),
        pages_in_use=st.none() | st.floats(0, 5000),
    ),
    max_size=12,
)
policies = st.builds(
    policy, st.sampled_from([0.0, 60.0, 300.0]), st.integers(0, 4), st.sampled_from([0.0, 60.0])
)
history = st.lists(st.tuples(st.floats(600, NOW), st.integers(0, 16)), max_size=4).map(tuple)
role_setup = st.tuples(
    st.booleans(),  # autoscaled?
    bounds,
    st.integers(0, 20),  # current
    loads,
    policies,
    policies,
    history,
    history.map(lambda h: tuple((t, n - 8) for t, n in h if n != 8)),
    st.floats(0, NOW),
)
bands = st.tuples(st.floats(0, 4), st.floats(0, 2)).map(lambda t: ratio_band(t[0], t[0] + t[1]))


@settings(max_examples=150, deadline=None)
@given(role_setup, role_setup, st.none() | bands)
def test_property_bounds_and_band(prefill, decode, band) -> None:
    roles, current, pods, memory, span = {}, {}, {}, {}, {}
    for role, (scaled, (lo, hi), cur, ld, up, down, recs, changes, started) in zip(
        RUNTIME_ROLES, (prefill, decode), strict=True
    ):
        if scaled:
            roles[role] = role_scaling(lo, hi, load_target(4.0, 5.0, 1000.0), up, down)
            memory[role] = RoleMemory(started, recs, changes)
            span[role] = range(lo, hi + 1)
        else:
            cur = max(cur, 1)
            span[role] = range(cur, cur + 1)
        current[role], pods[role] = cur, ld

    result = plan(roles, current, pods, memory, band, NOW)

    for role, decision in result.decisions.items():
        assert roles[role].min_replicas <= decision.desired <= roles[role].max_replicas
        if decision.saturated:
            assert decision.desired == decision.recommended == roles[role].max_replicas
            assert decision.load is not None and decision.load > 1
    if band is None or not roles:  # no band, or no role it could move
        assert not result.ratio_unkeepable
        return
    p = result.decisions["prefill"].desired if "prefill" in roles else current["prefill"]
    d = result.decisions["decode"].desired if "decode" in roles else current["decode"]
    keepable = any(
        band.min - 1e-9 <= x / y <= band.max + 1e-9 for x in span["prefill"] for y in span["decode"]
    )
    assert result.ratio_unkeepable is not keepable
    if keepable:
        assert band.min - 1e-9 <= p / d <= band.max + 1e-9
    else:
        assert result.ratio_message


# --- the order of the writes --------------------------------------------------------------

WIDE = ratio_band(0.5, 2.0)


@pytest.mark.parametrize(
    ("current", "targets", "band", "steps"),
    [
        # neither whole move keeps the band: prefill goes part way first
        ((1, 1), (3, 3), WIDE, [("prefill", 2), ("decode", 3), ("prefill", 3)]),
        ((1, 1), (8, 8), WIDE, [("prefill", 2), ("decode", 4), ("prefill", 8), ("decode", 8)]),
        # the role whose move keeps the band goes first
        ((2, 1), (2, 4), WIDE, [("decode", 4)]),
        ((1, 2), (4, 2), WIDE, [("prefill", 4)]),
        ((2, 1), (4, 3), WIDE, [("decode", 3), ("prefill", 4)]),
        ((3, 3), (2, 2), WIDE, [("prefill", 2), ("decode", 2)]),
        ((2, 1), (1, 1), WIDE, [("prefill", 1)]),
        # a state outside the band at either end, or no band: each role once, prefill first
        ((1, 4), (3, 3), WIDE, [("prefill", 3), ("decode", 3)]),
        ((1, 1), (1, 3), WIDE, [("decode", 3)]),
        ((1, 1), (3, 3), None, [("prefill", 3), ("decode", 3)]),
        # a band no single pod fits between: the writes still reach the targets
        ((1, 1), (2, 2), ratio_band(1.0, 1.0), [("prefill", 2), ("decode", 2)]),
        ((2, 2), (2, 2), WIDE, []),
    ],
)
def test_writes_keep_the_band_between_them(
    current: tuple[int, int],
    targets: tuple[int, int],
    band: RatioBand | None,
    steps: list[tuple[str, int]],
) -> None:
    now = dict(zip(RUNTIME_ROLES, current, strict=True))
    assert write_order(now, dict(zip(RUNTIME_ROLES, targets, strict=True)), band) == steps


@settings(max_examples=300)
@given(
    st.integers(1, 12),
    st.integers(1, 12),
    st.integers(1, 12),
    st.integers(1, 12),
    st.sampled_from([WIDE, ratio_band(0.25, 1.0), ratio_band(1.0, 3.0), ratio_band(0.5, 1.5)]),
)
def test_every_state_on_the_way_is_inside_a_band_both_ends_are_in(
    p0: int, d0: int, p1: int, d1: int, band: RatioBand
) -> None:
    state = {"prefill": p0, "decode": d0}
    steps = write_order(state, {"prefill": p1, "decode": d1}, band)
    both_in = all(band.min - 1e-9 <= p / d <= band.max + 1e-9 for p, d in ((p0, d0), (p1, d1)))
    for role, count in steps:
        before = state[role]
        state[role] = count
        target = p1 if role == "prefill" else d1
        assert min(before, target) <= count <= max(before, target)  # never past the target
        if both_in:
            assert band.min - 1e-9 <= state["prefill"] / state["decode"] <= band.max + 1e-9, steps
    assert state == {"prefill": p1, "decode": d1}
    assert len(steps) <= 2 * (abs(p1 - p0) + abs(d1 - d0))

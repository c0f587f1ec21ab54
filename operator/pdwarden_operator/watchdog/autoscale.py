"""The per-role autoscaling planner: observed per-pod load -> desired replicas per role.

HPA-like: a load ratio (mean signal per pod / target, the highest over the role's targets)
gives a recommendation, ignored within a tolerance; stabilisation windows (the lowest
recent recommendation for a scale up, the highest for a scale down) and step limits (pods
per period) damp it; a prefill:decode ratio band is then kept across both roles, and
outranks the windows and the steps. Only ready, unwedged pods count: a wedged pod's queue is
not demand. Pure, on the spec's own parts (`resource/autoscaling.py`); the executor (another
module) reads the pods, writes the Deployment's scale, and keeps each role's `RoleMemory`
between rounds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Final

from pdwarden_contract import RUNTIME_ROLES
from pdwarden_operator.resource.autoscaling import AutoscalingSpec, AutoscalingTarget, RatioBand

TOLERANCE: Final = 0.1  # |load/target - 1| within this: no change (as HPA)
EPSILON: Final = 1e-9  # float slack for the tolerance, the ceil/floor of counts and the band
_MANY: Final = 2**62  # "no count is enough" for the band's arithmetic


class Reason(StrEnum):
    """Why a role's desired count is what it is (shown in status and Events)."""

    STEADY = "WithinTolerance"
    LOAD_ABOVE_TARGET = "LoadAboveTarget"
    LOAD_BELOW_TARGET = "LoadBelowTarget"
    NO_SIGNAL = "NoSignal"  # no ready, unwedged pod with a sample: hold the current count
    STABILISING = "Stabilising"  # the window's recommendations hold the change back
    STEP_LIMITED = "StepLimited"  # maxStep within periodSeconds reached
    AT_MAX = "AtMaxReplicas"
    AT_MIN = "AtMinReplicas"
    RATIO_BAND = "RatioBand"  # moved to keep prefill:decode inside the band
    OUT_OF_BOUNDS = "OutOfBounds"  # current outside [min,max] (spec changed): moved inside at once
    HELD = "ScaleInHeld"  # the executor's: a scale-in waits for a pod to start or leave, or for KV


@dataclass(frozen=True)
class PodLoad:
    name: str
    ready: bool
    wedged: bool  # judged wedged (or unobserved) by the watchdog: its queue is not demand
    inflight: float  # rooms in flight on the pod
    queue_age: float | None  # prefill: age in seconds of the oldest inflight room; None: not exported
    pages_in_use: float | None  # decode: KV pages in use; None when not exported
    transferring: float = 0.0  # rooms currently moving KV (the executor never removes such a pod)


@dataclass(frozen=True)
class RoleMemory:
    """What the planner remembers of a role between rounds (the executor keeps it in memory)."""

    started_at: float  # when this memory began (a new leader starts empty)
    # (time, recommended count), pruned to the longer stabilisation window
    recommendations: tuple[tuple[float, int], ...] = ()
    changes: tuple[tuple[float, int], ...] = ()  # (time, delta applied), pruned to the longer period


@dataclass(frozen=True)
class RoleDecision:
    role: str
    current: int
    recommended: int  # the raw, bounded recommendation of this round (before windows/steps/ratio)
    desired: int  # what the executor should set
    reason: Reason
    message: str  # one sentence a person reads, with the figures (load, target, pods)
    saturated: bool  # desired == max_replicas and the unbounded recommendation is above it
    load: float | None  # the load ratio (highest over the role's targets); None: no signal


@dataclass(frozen=True)
class ScalingPlan:
    decisions: dict[str, RoleDecision]  # only roles that autoscale
    memory: dict[str, RoleMemory]  # memory to keep for next round
    ratio_unkeepable: bool  # the band could not be kept within the roles' bounds
    ratio_message: str = ""


@dataclass(frozen=True)
class _Load:
    """The winning target's figures, for the recommendation and the message."""

    ratio: float
    signal: str
    mean: float
    target: float
    unit: str
    sampled: int  # pods averaged over (those with this signal)
    counted: int  # ready, unwedged pods


@dataclass
class _Role:
    """One autoscaled role while the plan is being made."""

    scaling: AutoscalingSpec
    current: int
    recommended: int
    raw: int | None
    load: _Load | None
    desired: int
    reason: Reason
    message: str
    memory: RoleMemory


def fresh(now: float) -> RoleMemory:
    return RoleMemory(started_at=now)


def remember(memory: RoleMemory, now: float, delta: int) -> RoleMemory:
    """Record a change applied at `now` (nothing for a zero delta)."""
    if delta == 0:
        return memory
    return replace(memory, changes=(*memory.changes, (now, delta)))


def recommend(
    scaling: AutoscalingSpec, current: int, pods: Sequence[PodLoad]
) -> tuple[int | None, float | None]:
    """(unbounded recommendation, load ratio) from the pods.

    Only ready, unwedged pods count. For each set target (a non-positive one counts as unset)
    the mean of its signal over the counted pods that export it (inflight; queue_age;
    pages_in_use), divided by the target; the load ratio is the highest of these. As HPA,
    the recommendation is ceil(counted * ratio), `current` when |ratio - 1| <= TOLERANCE,
    and it never goes against the load: a load above target never recommends below
    `current` (pods still starting, or wedged, will take a share) and a load below it never
    recommends above. No counted pod or no target with data: (None, None). A ratio of 0
    recommends 0 (bounding happens later)."""
    load = _measure(scaling.target, pods)
    if load is None:
        return None, None
    return _raw(current, load), load.ratio


def plan(
    roles: Mapping[str, AutoscalingSpec],
    current: Mapping[str, int],
    loads: Mapping[str, Sequence[PodLoad]],
    memory: Mapping[str, RoleMemory],
    ratio: RatioBand | None,
    now: float,
) -> ScalingPlan:
    """Desired replicas for each role in `roles` (those pdwarden scales, each with its spec's
    `autoscaling`).

    `current` holds every runtime role's replicas, fixed roles too (the band needs them);
    a role missing from `memory` starts a fresh one at `now`. See the module docstring.
    """
    work = {role: _plan_role(role, scaling, current, loads, memory, now) for role, scaling in roles.items()}
    unkeepable, ratio_message = _keep_band(work, current, ratio)
    decisions: dict[str, RoleDecision] = {}
    memories: dict[str, RoleMemory] = {}
    for role, w in work.items():
        hi = w.scaling.max_replicas
        decisions[role] = RoleDecision(
            role=role,
            current=w.current,
            recommended=w.recommended,
            desired=w.desired,
            reason=w.reason,
            message=w.message,
            saturated=w.desired == hi and _wants_more(w, hi),
            load=None if w.load is None else w.load.ratio,
        )
        memories[role] = _prune(remember(w.memory, now, w.desired - w.current), w.scaling, now)
    return ScalingPlan(decisions, memories, unkeepable, ratio_message)


def _wants_more(w: _Role, hi: int) -> bool:
    """The load asks for more than max_replicas (not merely a current count above it)."""
    return (
        w.raw is not None and w.raw > hi and w.load is not None and w.load.ratio > 1.0 + TOLERANCE + EPSILON
    )


# --- one role ---------------------------------------------------------------------------


def _plan_role(
    role: str,
    scaling: AutoscalingSpec,
    current: Mapping[str, int],
    loads: Mapping[str, Sequence[PodLoad]],
    memory: Mapping[str, RoleMemory],
    now: float,
) -> _Role:
    cur = current.get(role, 0)
    mem = memory.get(role) or fresh(now)
    lo, hi = scaling.min_replicas, scaling.max_replicas
    load = _measure(scaling.target, loads.get(role, ()))
    raw = None if load is None else _raw(cur, load)
    prefix = f"{role}: {cur} -> "

    if not lo <= cur <= hi:
        desired = _clamp(cur, lo, hi)
        recommended = desired if raw is None else _clamp(raw, lo, hi)
        mem = _record(mem, now, recommended)
        message = f"{prefix}{desired}: {cur} is outside [{lo}, {hi}] (the spec changed)"
        return _Role(scaling, cur, recommended, raw, load, desired, Reason.OUT_OF_BOUNDS, message, mem)

    if raw is None or load is None:
        # Nothing recorded: a stale recommendation must not drive a later change.
        message = f"{role}: holds {cur}: no ready, unwedged pod reports a load signal"
        return _Role(scaling, cur, cur, None, None, cur, Reason.NO_SIGNAL, message, mem)

    recommended = _clamp(raw, lo, hi)
    mem = _record(mem, now, recommended)
    figures = _describe(load)

    stabilised, held_by = _stabilise(scaling, mem, cur, recommended, now)
    desired, limit = _step(scaling, mem, cur, stabilised, now)

    if limit:
        reason, why = Reason.STEP_LIMITED, f"{figures} wants {recommended}, {limit}"
    elif desired == cur and recommended != cur:
        reason, why = Reason.STABILISING, f"{figures} wants {recommended}, but {held_by}"
    elif raw > hi and desired == hi:
        reason, why = Reason.AT_MAX, f"{figures} wants {raw}, capped at maxReplicas {hi}"
    elif raw < lo and desired == lo:
        reason, why = Reason.AT_MIN, f"{figures} wants {raw}, held at minReplicas {lo}"
    elif desired > cur:
        reason, why = Reason.LOAD_ABOVE_TARGET, figures
    elif desired < cur:
        reason, why = Reason.LOAD_BELOW_TARGET, figures
    elif abs(load.ratio - 1.0) <= TOLERANCE + EPSILON:
        reason, why = Reason.STEADY, f"{figures}, within the {TOLERANCE:.0%} tolerance"
    else:
        reason = Reason.STEADY
        why = f"{figures}, which rounds to no change with {load.counted} of {cur} pods counted"
    head = f"{prefix}{desired}" if desired != cur else f"{role}: holds {cur}"
    return _Role(scaling, cur, recommended, raw, load, desired, reason, f"{head}: {why}", mem)


def _measure(target: AutoscalingTarget, pods: Sequence[PodLoad]) -> _Load | None:
    counted = [p for p in pods if p.ready and not p.wedged]
    if not counted:
        return None
    signals: tuple[tuple[str, float | None, list[float | None], str], ...] = (
        ("inflight", target.inflight_per_pod, [p.inflight for p in counted], ""),
        ("oldest-room age", target.queue_age_seconds, [p.queue_age for p in counted], "s"),
        ("KV pages in use", target.kv_pages_in_use, [p.pages_in_use for p in counted], ""),
    )
    best: _Load | None = None
    for signal, goal, samples, unit in signals:
        values = [v for v in samples if v is not None and math.isfinite(v)]
        if goal is None or not math.isfinite(goal) or goal <= 0 or not values:
            continue
        mean = math.fsum(values) / len(values)
        load = _Load(mean / goal, signal, mean, goal, unit, len(values), len(counted))
        if best is None or load.ratio > best.ratio:
            best = load
    return best


def _raw(current: int, load: _Load) -> int:
    if abs(load.ratio - 1.0) <= TOLERANCE + EPSILON:
        return current
    wanted = max(0, math.ceil(load.counted * load.ratio - EPSILON))
    return max(current, wanted) if load.ratio > 1.0 else min(current, wanted)


def _stabilise(
    scaling: AutoscalingSpec, mem: RoleMemory, cur: int, recommended: int, now: float
) -> tuple[int, str]:
    """The count the windows allow, and what held the change back (for the message)."""
    up_window = scaling.scale_up.stabilization_seconds
    down_window = scaling.scale_down.stabilization_seconds
    # Both windows include this round's recommendation, recorded at `now`.
    lowest = min(r for t, r in mem.recommendations if _within(t, now, up_window))
    highest = max(r for t, r in mem.recommendations if _within(t, now, down_window))
    if cur < lowest:
        return lowest, ""
    if cur > highest:
        if now - mem.started_at < down_window:
            # A new leader has not watched the whole window yet.
            age = _num(now - mem.started_at)
            return cur, f"this leader has watched {age}s of the {_num(down_window)}s scale-down window"
        return highest, ""
    if recommended > cur:
        return cur, f"the lowest recommendation in the last {_num(up_window)}s scale-up window is {lowest}"
    return cur, f"the highest recommendation in the last {_num(down_window)}s scale-down window is {highest}"


def _step(
    scaling: AutoscalingSpec, mem: RoleMemory, cur: int, stabilised: int, now: float
) -> tuple[int, str]:
    """The count the step limit allows, and the limit when it cut the change ("" when not)."""
    delta = stabilised - cur
    if delta == 0:
        return cur, ""
    up = delta > 0
    policy = scaling.scale_up if up else scaling.scale_down
    used = sum(
        abs(d) for t, d in mem.changes if d != 0 and (d > 0) == up and _within(t, now, policy.period_seconds)
    )
    budget = max(0, policy.max_step - used)
    if abs(delta) <= budget:
        return stabilised, ""
    direction = "scale-up" if up else "scale-down"
    limit = f"{direction} step limit {policy.max_step} per {_num(policy.period_seconds)}s ({used} used)"
    return cur + (budget if up else -budget), limit


# --- the band -----------------------------------------------------------------------------


def _keep_band(
    work: dict[str, _Role], current: Mapping[str, int], band: RatioBand | None
) -> tuple[bool, str]:
    """Move the autoscaled roles to keep prefill:decode inside the band: raise first, lower
    second; (unkeepable, message)."""
    if band is None or not work or any(role not in current for role in RUNTIME_ROLES):
        return False, ""  # with no role to move, the band is not the planner's to keep
    prefill, decode = RUNTIME_ROLES
    p0 = work[prefill].desired if prefill in work else current[prefill]
    d0 = work[decode].desired if decode in work else current[decode]
    if p0 <= 0 or d0 <= 0:
        return False, ""
    p_lo, p_hi = _bounds(work, prefill, p0)
    d_lo, d_hi = _bounds(work, decode, d0)

    p, d = p0, d0
    if _above(p, d, band.max):
        if decode in work:
            d = max(d, min(d_hi, _fewest_decodes(p, band.max)))
        if _above(p, d, band.max) and prefill in work:
            p = min(p, max(p_lo, _most_prefills(d, band.max)))
    elif _below(p, d, band.min):
        if prefill in work:
            p = max(p, min(p_hi, _fewest_prefills(d, band.min)))
        if _below(p, d, band.min) and decode in work:
            d = min(d, max(d_lo, _most_decodes(p, band.min)))

    unkeepable = False
    if not _inside(p, d, band):
        # Raising then lowering can overshoot a band narrower than one pod's step: take the
        # pair within the bounds that lowers least, then raises least.
        nearest = _nearest(p0, d0, (p_lo, p_hi), (d_lo, d_hi), band)
        if nearest is None:
            unkeepable = True
        else:
            p, d = nearest

    for role, count in ((prefill, p), (decode, d)):
        if role in work and count != work[role].desired:
            _band_move(work[role], role, count, p, d, band)
    if not unkeepable:
        return False, ""
    message = (
        f"prefill:decode {p}:{d} ({p / d:.2f}) is outside the band [{_num(band.min)}, {_num(band.max)}]: "
        f"no counts with prefill {_range(p_lo, p_hi)} and decode {_range(d_lo, d_hi)} fit it"
    )
    return True, message


def _band_move(w: _Role, role: str, count: int, p: int, d: int, band: RatioBand) -> None:
    head = f"{role}: {w.current} -> {count}" if count != w.current else f"{role}: holds {w.current}"
    w.message = (
        f"{head}: keeps prefill:decode at {p}:{d} inside the band [{_num(band.min)}, {_num(band.max)}] "
        f"(the load alone gave {w.desired}, {w.reason})"
    )
    w.desired, w.reason = count, Reason.RATIO_BAND


def _bounds(work: dict[str, _Role], role: str, count: int) -> tuple[int, int]:
    if role not in work:
        return count, count  # fixed: the band cannot move it
    return work[role].scaling.min_replicas, work[role].scaling.max_replicas


def _nearest(
    p0: int, d0: int, p_bounds: tuple[int, int], d_bounds: tuple[int, int], band: RatioBand
) -> tuple[int, int] | None:
    best: tuple[tuple[int, int], tuple[int, int]] | None = None
    for p in range(max(1, p_bounds[0]), p_bounds[1] + 1):
        lo = max(d_bounds[0], _fewest_decodes(p, band.max))
        hi = min(d_bounds[1], _most_decodes(p, band.min))
        if lo > hi:
            continue
        d = _clamp(d0, lo, hi)
        cost = (max(0, p0 - p) + max(0, d0 - d), max(0, p - p0) + max(0, d - d0))
        if best is None or cost < best[0]:
            best = (cost, (p, d))
    return None if best is None else best[1]


# The four below start from the float estimate and settle on the exact answer of `_above` /
# `_below` (a step or two at most), so every count the band picks passes `_inside`.


def _fewest_decodes(p: int, most: float) -> int:
    """The fewest decodes (>= 1) with p/d <= most; a huge count when none can do."""
    if most <= EPSILON:
        return _MANY if p > 0 else 1
    d = max(1, math.ceil(p / (most + EPSILON)))
    while d > 1 and not _above(p, d - 1, most):
        d -= 1
    while _above(p, d, most):
        d += 1
    return d


def _most_decodes(p: int, least: float) -> int:
    """The most decodes with p/d >= least; 0 when none."""
    if least <= EPSILON:
        return _MANY
    d = max(0, math.floor(p / (least - EPSILON)))
    while not _below(p, d + 1, least):
        d += 1
    while d >= 1 and _below(p, d, least):
        d -= 1
    return d


def _most_prefills(d: int, most: float) -> int:
    """The most prefills with p/d <= most."""
    p = max(0, math.floor(d * (most + EPSILON)))
    while not _above(p + 1, d, most):
        p += 1
    while p > 0 and _above(p, d, most):
        p -= 1
    return p


def _fewest_prefills(d: int, least: float) -> int:
    """The fewest prefills with p/d >= least."""
    p = max(0, math.ceil(d * (least - EPSILON)))
    while p > 0 and not _below(p - 1, d, least):
        p -= 1
    while _below(p, d, least):
        p += 1
    return p


def _above(p: int, d: int, most: float) -> bool:
    return p / d > most + EPSILON


def _below(p: int, d: int, least: float) -> bool:
    return p / d < least - EPSILON


def _inside(p: int, d: int, band: RatioBand) -> bool:
    return p > 0 and d > 0 and not _above(p, d, band.max) and not _below(p, d, band.min)


def write_order(
    current: Mapping[str, int], targets: Mapping[str, int], band: RatioBand | None
) -> list[tuple[str, int]]:
    """The writes that take the roles from `current` to `targets`, one Deployment at a time.

    Between two writes the cluster runs what was written, so each state on the way stays inside
    the band where one can: the role whose move keeps it goes first, and where neither does
    (1:1 to 3:3 in [0.5, 2]), one role goes part way first (1:1, 2:1, 2:3, 3:3). Where the band
    cannot be kept on the way (no band, or it holds at neither end), each role is written
    once, in RUNTIME_ROLES order.
    """
    state = {role: current[role] for role in RUNTIME_ROLES if role in current}
    pending = {
        role: targets[role]
        for role in RUNTIME_ROLES
        if role in targets and targets[role] != current.get(role)
    }
    steps: list[tuple[str, int]] = []

    def inside(role: str, count: int) -> bool:
        after = {**state, role: count}
        return band is not None and _inside(after[RUNTIME_ROLES[0]], after[RUNTIME_ROLES[1]], band)

    final = {**state, **pending}
    keeping = (
        band is not None
        and len(state) == len(RUNTIME_ROLES)
        and _inside(state[RUNTIME_ROLES[0]], state[RUNTIME_ROLES[1]], band)
        and _inside(final[RUNTIME_ROLES[0]], final[RUNTIME_ROLES[1]], band)
    )
    while pending and keeping:
        whole = next((role for role in pending if inside(role, pending[role])), None)
        if whole is not None:
            steps.append((whole, pending.pop(whole)))
            state[whole] = steps[-1][1]
            continue
        part: tuple[int, str, int] | None = None  # (distance left, role, count)
        for role, target in pending.items():
            way = (
                range(target - 1, state[role], -1) if target > state[role] else range(target + 1, state[role])
            )
            count = next((c for c in way if inside(role, c)), None)
            if count is not None and (part is None or abs(target - count) < part[0]):
                part = (abs(target - count), role, count)
        if part is None:
            break
        _, role, count = part
        steps.append((role, count))
        state[role] = count
    steps += sorted(pending.items(), key=lambda item: RUNTIME_ROLES.index(item[0]))
    return steps


# --- memory and small helpers ---------------------------------------------------------------


def _within(t: float, now: float, seconds: float) -> bool:
    """Whether a record at `t` is inside the last `seconds` (this instant's always is)."""
    return t >= now or now - t < seconds


def _record(mem: RoleMemory, now: float, recommended: int) -> RoleMemory:
    return replace(mem, recommendations=(*mem.recommendations, (now, recommended)))


def _prune(mem: RoleMemory, scaling: AutoscalingSpec, now: float) -> RoleMemory:
    window = max(scaling.scale_up.stabilization_seconds, scaling.scale_down.stabilization_seconds)
    period = max(scaling.scale_up.period_seconds, scaling.scale_down.period_seconds)
    return replace(
        mem,
        recommendations=tuple(r for r in mem.recommendations if _within(r[0], now, window)),
        changes=tuple(c for c in mem.changes if _within(c[0], now, period)),
    )


def _clamp(value: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, value))


def _describe(load: _Load) -> str:
    per = "" if load.unit else " per pod"
    return (
        f"mean {load.signal} {_num(load.mean)}{load.unit}{per} over {_pods(load.sampled)} "
        f"is {load.ratio:.2f}x the target {_num(load.target)}{load.unit}"
    )


def _pods(n: int) -> str:
    return f"{n} pod" if n == 1 else f"{n} pods"


def _num(x: float) -> str:
    text = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def _range(lo: int, hi: int) -> str:
    return f"fixed at {lo}" if lo == hi else f"in [{lo}, {hi}]"

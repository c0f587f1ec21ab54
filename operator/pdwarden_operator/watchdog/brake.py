"""The fleet brake: operator-wide limits above which no model is remediated.

A fault wider than a pod (an RDMA switch, a bad driver roll-out) wedges many models at
once; restarting their pods only spends every model's budget on pods that wedge again. So
the operator counts, across all models: the models and pods in trouble now, and the
remediations it performed in the last hour. Above a limit it stops acting everywhere
(engaged) until the counts fall back (it releases on its own).

A pod is *in trouble* when it is wedged, or when it has been busy without progress (or held
a room in Transferring) for half of its model's `stuckAfterSeconds`: models hit by the same
fault stall together, and the first one to cross its threshold must already see the others
(each model's count comes from its own latest round, at most a scrape interval old).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from pdwarden_operator.metrics import METRICS, OperatorMetrics

HOUR_S = 3600.0
Key = tuple[str, str]


@dataclass(frozen=True)
class BrakeLimits:
    max_remediations_per_hour: int = 20
    max_wedged_models: int = 3
    max_wedged_pods: int = 10

    def __post_init__(self) -> None:
        for name in ("max_remediations_per_hour", "max_wedged_models", "max_wedged_pods"):
            if getattr(self, name) < 1:
                raise ValueError(f"fleet brake: {name} must be at least 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class BrakeState:
    engaged: bool
    reason: str


def judge(troubled: dict[Key, int], actions_last_hour: int, limits: BrakeLimits) -> BrakeState:
    """The brake from the counts (pure)."""
    models = sum(1 for n in troubled.values() if n > 0)
    pods = sum(troubled.values())
    reasons = []
    if models > limits.max_wedged_models:
        reasons.append(f"{models} models have wedged pods at once (limit {limits.max_wedged_models})")
    if pods > limits.max_wedged_pods:
        reasons.append(f"{pods} pods are wedged at once (limit {limits.max_wedged_pods})")
    if actions_last_hour >= limits.max_remediations_per_hour:
        reasons.append(
            f"{actions_last_hour} remediations in the last hour (limit {limits.max_remediations_per_hour})"
        )
    if reasons:
        return BrakeState(True, "; ".join(reasons) + ": not a pod problem, remediation stopped")
    return BrakeState(
        False, f"{models} model(s), {pods} pod(s) in trouble; {actions_last_hour} remediations/h"
    )


class FleetBrake:
    """The process-wide brake; every model's watchdog reports to it and asks it each round."""

    def __init__(
        self,
        limits: BrakeLimits = BrakeLimits(),
        clock: Callable[[], float] = time.time,
        metrics: OperatorMetrics = METRICS,
    ) -> None:
        self.limits = limits
        self._clock = clock
        self._metrics = metrics
        self._troubled: dict[Key, int] = {}
        self._actions: deque[float] = deque()
        self.state = BrakeState(False, "")
        metrics.brake_engaged.set(0)

    def report(self, key: Key, troubled_pods: int) -> None:
        self._troubled[key] = troubled_pods

    def forget(self, key: Key) -> None:
        self._troubled.pop(key, None)

    def record_action(self) -> None:
        self._actions.append(self._clock())

    def evaluate(self) -> BrakeState:
        now = self._clock()
        while self._actions and now - self._actions[0] >= HOUR_S:
            self._actions.popleft()
        self.state = judge(self._troubled, len(self._actions), self.limits)
        self._metrics.brake_engaged.set(1.0 if self.state.engaged else 0.0)
        return self.state


BRAKE = FleetBrake()


def configure(limits: BrakeLimits) -> None:
    """Set the operator-wide limits (from `pdwarden operator run --brake-*`)."""
    BRAKE.limits = limits

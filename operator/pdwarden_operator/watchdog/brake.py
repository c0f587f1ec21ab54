"""The brakes: limits above which models are not remediated, per namespace and for the fleet.

A fault wider than a pod (an RDMA switch, a bad driver roll-out) wedges many models at
once; restarting their pods only spends every model's budget on pods that wedge again. So
the operator counts the models and pods in trouble now and the remediations performed in the
last hour, and above a limit it stops acting (engaged) until the counts fall back (it releases
on its own).

Tenants share the operator, so one tenant's faulty models must not stop another's
remediation: each namespace has a brake of its own, and a namespace counts toward the fleet
limits at most up to its own limits (which are lower). One author may own a few namespaces,
so a fleet count over its limit holds a namespace's models only while at least
`FleetLimits.min_other_troubled_namespaces` namespaces (3 by default) *besides that one*
contribute to it: the namespace it would stop has trouble of its own whenever it has
something to remediate, so a quorum counting it would let an author's two namespaces stop a
third's remediation. A fault across four namespaces holds all four.

A model whose action is `alert` counts toward no brake: it is never remediated, so it cannot
be part of a remediation storm, and its wedges, which the operator never clears, would hold a
brake for as long as they last.

The counts survive a failover: remediations live in each model's status, and a model's first
round seeds its hour of remediations from there. Until every tracked model has reported once,
the brakes hold (a new leader that acted on the first models it saw would not see the rest).

A pod is *in trouble* when it is wedged, or when it has been busy without progress (or held
a room in Transferring) for half of its model's `stuckAfterSeconds`: models hit by the same
fault stall together, and the first one to cross its threshold must already see the others
(each model's count comes from its own latest round, at most a scrape interval old).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from pdwarden_operator.metrics import OperatorMetrics
from pdwarden_operator.watchdog.outcome import Outcome
from pdwarden_operator.watchdog.state import Remediation

HOUR_S = 3600.0
Key = tuple[str, str]  # (namespace, model)
Scope = Literal["", "fleet", "namespace", "startup"]
# A remediation that reached one of these touched a pod: it counts toward the hour's limit.
_ACTED = frozenset({Outcome.DELETED, Outcome.EVICTED, Outcome.QUARANTINED})


@dataclass(frozen=True)
class BrakeLimits:
    max_remediations_per_hour: int = 20
    max_wedged_models: int = 3
    max_wedged_pods: int = 10

    def __post_init__(self) -> None:
        for name in ("max_remediations_per_hour", "max_wedged_models", "max_wedged_pods"):
            if getattr(self, name) < 1:
                raise ValueError(f"brake: {name} must be at least 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class FleetLimits(BrakeLimits):
    # A fleet count holds a namespace only when this many namespaces besides it contribute to
    # it: one author can own a namespace or two, not every namespace in trouble.
    min_other_troubled_namespaces: int = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.min_other_troubled_namespaces < 2:
            raise ValueError(
                "brake: min_other_troubled_namespaces must be at least 2 (one other namespace "
                f"alone would stop a namespace's remediation), got {self.min_other_troubled_namespaces}"
            )


DEFAULT_FLEET = FleetLimits()
DEFAULT_NAMESPACE = BrakeLimits(max_remediations_per_hour=10, max_wedged_models=2, max_wedged_pods=5)


def check_limits(fleet: FleetLimits, namespace: BrakeLimits) -> None:
    """One namespace alone must never reach the fleet limits, or one tenant stops all others."""
    problems = []
    if namespace.max_remediations_per_hour >= fleet.max_remediations_per_hour:
        problems.append("remediations per hour")
    if namespace.max_wedged_models > fleet.max_wedged_models:
        problems.append("wedged models")
    if namespace.max_wedged_pods > fleet.max_wedged_pods:
        problems.append("wedged pods")
    if problems:
        raise ValueError(
            f"the namespace brake's limits on {', '.join(problems)} must stay below the fleet "
            "brake's: one namespace alone would otherwise stop every namespace's remediation"
        )


@dataclass(frozen=True)
class BrakeState:
    engaged: bool
    reason: str
    scope: Scope = ""


def judge(troubled: dict[Key, int], actions_last_hour: int, limits: BrakeLimits) -> BrakeState:
    """The brake from the counts (pure)."""
    models = sum(1 for n in troubled.values() if n > 0)
    return judge_counts(models, sum(troubled.values()), actions_last_hour, limits)


def judge_counts(models: int, pods: int, actions_last_hour: int, limits: BrakeLimits) -> BrakeState:
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


def judge_all(
    troubled: dict[Key, int],
    actions: dict[Key, int],
    namespace: str,
    fleet: FleetLimits,
    per_namespace: BrakeLimits,
) -> BrakeState:
    """The brake that holds `namespace`'s models (pure): the fleet's, else the namespace's own."""
    counts = _per_namespace(troubled, actions)
    own_counts = counts.get(namespace, [0, 0, 0])
    wide = _fleet_for(_FleetCounts.of(counts, per_namespace), own_counts, fleet)
    if wide.engaged:
        return BrakeState(True, f"fleet brake: {wide.reason}", "fleet")
    own = judge_counts(own_counts[0], own_counts[1], own_counts[2], per_namespace)
    if own.engaged:
        return BrakeState(True, f"namespace {namespace} brake: {own.reason}", "namespace")
    return own


def fleet_holds_any(
    troubled: dict[Key, int], actions: dict[Key, int], fleet: FleetLimits, per_namespace: BrakeLimits
) -> bool:
    """Whether the fleet brake holds the models of any namespace that has reported (pure): what
    the fleet gauge exports, the same whichever namespace was evaluated last."""
    counts = _per_namespace(troubled, actions)
    wide = _FleetCounts.of(counts, per_namespace)
    return any(_fleet_for(wide, c, fleet).engaged for c in counts.values())


def _per_namespace(troubled: dict[Key, int], actions: dict[Key, int]) -> dict[str, list[int]]:
    """(models in trouble, pods in trouble, remediations) per namespace, in one pass."""
    counts: dict[str, list[int]] = {}
    for (ns, _), pods in troubled.items():
        c = counts.setdefault(ns, [0, 0, 0])
        c[0] += pods > 0
        c[1] += pods
    for (ns, _), done in actions.items():
        counts.setdefault(ns, [0, 0, 0])[2] += done
    return counts


@dataclass(frozen=True)
class _FleetCounts:
    totals: tuple[int, ...]  # each count, every namespace's capped at the namespace limits
    contributors: tuple[int, ...]  # how many namespaces contribute to each count
    troubled: int  # namespaces contributing to any

    @classmethod
    def of(cls, counts: dict[str, list[int]], per_namespace: BrakeLimits) -> _FleetCounts:
        caps = (
            per_namespace.max_wedged_models,
            per_namespace.max_wedged_pods,
            per_namespace.max_remediations_per_hour,
        )
        return cls(
            tuple(sum(min(c[i], cap) for c in counts.values()) for i, cap in enumerate(caps)),
            tuple(sum(1 for c in counts.values() if c[i] > 0) for i in range(len(caps))),
            sum(1 for c in counts.values() if any(c)),
        )


def _fleet_for(wide: _FleetCounts, own: list[int], fleet: FleetLimits) -> BrakeState:
    """The fleet brake on a namespace with counts `own`: each fleet count, only while enough
    namespaces besides this one contribute to it."""
    totals = [
        total if contributors - (mine > 0) >= fleet.min_other_troubled_namespaces else 0
        for total, contributors, mine in zip(wide.totals, wide.contributors, own, strict=True)
    ]
    state = judge_counts(totals[0], totals[1], totals[2], fleet)
    if not state.engaged:
        return state
    others = wide.troubled - any(own)
    return BrakeState(True, f"{others} other namespaces in trouble; {state.reason}")


def acted_at(remediations: Iterable[Remediation]) -> list[float]:
    """When the remediations that touched a pod were decided (what a status says)."""
    return [
        r.time
        for r in remediations
        if r.action != "alert" and (r.outcome in _ACTED or any(o in _ACTED for o, _ in r.phases))
    ]


class Brakes:
    """The process-wide brakes; every model's watchdog reports to them and asks them each round."""

    def __init__(
        self,
        fleet: FleetLimits = DEFAULT_FLEET,
        namespace: BrakeLimits = DEFAULT_NAMESPACE,
        clock: Callable[[], float] = time.time,
        metrics: OperatorMetrics | None = None,
    ) -> None:
        """`metrics`: the operator's (a brake built alone, as in a test, gets its own)."""
        check_limits(fleet, namespace)
        metrics = metrics if metrics is not None else OperatorMetrics()
        self.limits = fleet
        self.namespace_limits = namespace
        self._clock = clock
        self._metrics = metrics
        self._troubled: dict[Key, int] = {}
        self._actions: dict[Key, deque[float]] = {}
        self._expected: set[Key] = set()
        self._reported: set[Key] = set()
        self.state = BrakeState(False, "")
        metrics.brake_engaged.set(0)

    def expect(self, key: Key) -> None:
        """A model is tracked: the brakes hold until it has reported once."""
        self._expected.add(key)

    def seed(self, key: Key, remediations: Iterable[Remediation]) -> None:
        """The model's remediations of the last hour, from its status (once: this process's own
        records win)."""
        if key in self._actions:
            return
        now = self._clock()
        self._actions[key] = deque(sorted(t for t in acted_at(remediations) if now - t < HOUR_S))

    def report(self, key: Key, troubled_pods: int, *, remediated: bool) -> None:
        """The model's pods in trouble now; `remediated`: whether its action touches pods (not
        `alert`). A model that is never remediated counts toward no brake."""
        self._troubled[key] = troubled_pods if remediated else 0
        self._reported.add(key)

    def forget(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        self._troubled.pop(key, None)
        self._actions.pop(key, None)
        self._expected.discard(key)
        self._reported.discard(key)
        namespace = key[0]
        known = (*self._troubled, *self._actions, *self._expected, *self._reported)
        if not any(ns == namespace for ns, _ in known):
            # the namespace's last model: its brake series goes with it
            with contextlib.suppress(KeyError):
                self._metrics.namespace_brake_engaged.remove(namespace)

    def record_action(self, key: Key) -> None:
        self._actions.setdefault(key, deque()).append(self._clock())

    def evaluate(self, namespace: str) -> BrakeState:
        """The brake on `namespace`'s models now; exports the fleet brake's state."""
        now = self._clock()
        for times in self._actions.values():
            while times and now - times[0] >= HOUR_S:
                times.popleft()
        waiting = self._expected - self._reported
        fleet = False
        if waiting:
            self.state = BrakeState(
                True,
                f"every model is observed once before any is remediated ({len(waiting)} of "
                f"{len(self._expected)} not yet)",
                "startup",
            )
        else:
            counts = {k: len(v) for k, v in self._actions.items()}
            self.state = judge_all(self._troubled, counts, namespace, self.limits, self.namespace_limits)
            fleet = fleet_holds_any(self._troubled, counts, self.limits, self.namespace_limits)
        self._metrics.brake_engaged.set(1.0 if fleet else 0.0)
        self._metrics.namespace_brake_engaged.labels(namespace).set(
            1.0 if self.state.scope == "namespace" else 0.0
        )
        return self.state

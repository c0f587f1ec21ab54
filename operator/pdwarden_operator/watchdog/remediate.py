"""The watchdog controller of one model: judge the round's observation, plan the ladder, act.

judge: the wedge rule per scraped pod (rule.py), pair-aware blame (blame.py), then each group's
pods folded into one unit (group_health.py) -> the brakes told how troubled the model is and
asked whether to act -> `ladder.plan` (pure) -> the executor performs the plan's actions on
the units they name and announces its notices -> the outcomes folded back into the state. The
state's intent is written by the caller between planning and performing (model_watchdog.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import pdwarden_contract as contract
from pdwarden_operator.kube.client import KubeClient
from pdwarden_operator.metrics import OperatorMetrics
from pdwarden_operator.watchdog import blame, group_health, ladder
from pdwarden_operator.watchdog.brake import Brakes, BrakeState
from pdwarden_operator.watchdog.drain import healthy_requests_done
from pdwarden_operator.watchdog.executor import Executor, ModelIdentity, NotLeading
from pdwarden_operator.watchdog.observe import ModelObservation
from pdwarden_operator.watchdog.outcome import Outcome
from pdwarden_operator.watchdog.rule import judge as judge_pod
from pdwarden_operator.watchdog.state import WatchdogState
from pdwarden_operator.watchdog.verdict import PodView, Verdict, VerdictState

log = logging.getLogger("pdwarden.watchdog")


@dataclass(frozen=True)
class Judgement:
    """The round's verdicts: per pod, and per unit (a group's pods folded into one entry)."""

    pods: Mapping[str, Verdict]  # per pod uid (after blame)
    units: Mapping[str, PodView]  # the ladder's entries, by key
    verdicts: Mapping[str, Verdict]  # per unit key

    def named(self, state: VerdictState) -> list[str]:
        return [self.units[key].name for key, v in self.verdicts.items() if v.state == state]

    def troubled(self) -> int:
        return sum(1 for v in self.verdicts.values() if v.troubled)


def judge(obs: ModelObservation) -> Judgement:
    """Verdicts from the observation alone (pure)."""
    stuck_after = obs.settings.stuck_after_seconds
    verdicts = {uid: judge_pod(obs.histories.get(uid, ()), stuck_after) for uid in obs.scraped}
    views = obs.views
    verdicts = blame.attribute(
        pods=list(views.values()),
        observations={uid: obs.histories[uid] for uid in views if uid in obs.histories},
        verdicts=verdicts,
        stuck_after=stuck_after,
    ).verdicts
    # Multi-node replicas are judged and remediated as groups (group_health.py): from here on a
    # group is one unit, and its pods are acted on together.
    nodes = {role: obs.spec.role(role).nodes_per_replica for role in contract.RUNTIME_ROLES}
    found = group_health.groups_of(obs.paired, obs.model.name, nodes)
    units, unit_verdicts = group_health.fold(views, verdicts, found, obs.now)
    return Judgement(verdicts, units, unit_verdicts)


class WatchdogController:
    """Judges, plans and acts for one model; its state is the status's (`state`, None: read
    it again from the next round's status)."""

    def __init__(
        self,
        model: ModelIdentity,
        kube: KubeClient,
        brakes: Brakes,
        metrics: OperatorMetrics,
        may_act: Callable[[], Awaitable[bool]],
    ) -> None:
        self.model = model
        self.brakes = brakes
        self.metrics = metrics
        self.executor = Executor(model, kube, metrics, may_act)
        self.state: WatchdogState | None = None
        self.brake = BrakeState(False, "")  # as this model last saw it (Events on changes)
        self._verdicts: Mapping[str, Verdict] = {}  # last round's, per pod (log lines on changes)

    @property
    def key(self) -> tuple[str, str]:
        return (self.model.namespace, self.model.name)

    def judge(self, obs: ModelObservation) -> Judgement:
        judged = judge(obs)
        self._log_changes(obs.views, judged.pods)
        self._verdicts = judged.pods
        return judged

    def ask_brakes(self, judged: Judgement, remediated: bool) -> BrakeState:
        """The model's trouble reported; whether the brakes hold this namespace."""
        self.brakes.report(self.key, judged.troubled(), remediated=remediated)
        return self.brakes.evaluate(self.model.namespace)

    def plan(
        self, obs: ModelObservation, judged: Judgement, state: WatchdogState, brake: bool
    ) -> ladder.Plan:
        return ladder.plan(
            verdicts=judged.verdicts,
            pods=list(judged.units.values()),
            state=state,
            settings=obs.settings,
            now=obs.now,
            desired=obs.desired(),
            brake=brake,
            drained=self._drained(obs, state),
        )

    async def perform(self, plan: ladder.Plan, now: float) -> bool:
        """The plan's actions and notices; False when this replica stopped leading (nothing
        more is performed: the state is read again from the status next round)."""
        try:
            results = await self.executor.perform(plan)
        except NotLeading as exc:
            log.warning("%s/%s: %s", self.model.namespace, self.model.name, exc)
            self.state = None
            return False
        for result in results:
            # one count per remediation: a drain counts when it starts (its deletion comes later)
            if result.outcome in (Outcome.EVICTED, Outcome.QUARANTINED) or (
                result.outcome == Outcome.DELETED and result.action.kind == "restart"
            ):
                self.brakes.record_action(self.key)
        self.state = ladder.apply_results(plan.state, results, now)
        return True

    def _drained(self, obs: ModelObservation, state: WatchdogState) -> dict[str, bool]:
        """Per quarantined pod's UID: are its healthy requests done (drain.py)? The quarantine
        time is wall-clock (status); the scrape history is monotonic."""
        out = {}
        for flight in state.in_flight:
            observations = obs.histories.get(flight.uid)
            if flight.quarantined_at is None or observations is None:
                continue
            since = obs.at - (obs.now - flight.quarantined_at)
            out[flight.uid] = healthy_requests_done(observations, since)
        return out

    async def announce_brake(self, brake: BrakeState) -> None:
        """An Event on this model when a brake (the fleet's or its namespace's) engages or releases."""
        if (brake.engaged, brake.scope) == (self.brake.engaged, self.brake.scope):
            self.brake = brake
            return
        held = brake if brake.engaged else self.brake
        which = "NamespaceBrake" if held.scope == "namespace" else "FleetBrake"
        self.brake = brake
        reason = f"{which}Engaged" if brake.engaged else f"{which}Released"
        kind: Literal["Normal", "Warning"] = "Warning" if brake.engaged else "Normal"
        whose = f"namespace {self.model.namespace}'s models" if which == "NamespaceBrake" else "any model"
        message = (
            f"brake engaged, no remediation on {whose}: {brake.reason}"
            if brake.engaged
            else f"brake released: {brake.reason}"
        )
        log.warning("%s/%s: %s: %s", self.model.namespace, self.model.name, reason, message)
        await self.executor.post_model_event(reason, message, kind)

    def _log_changes(self, views: Mapping[str, PodView], verdicts: Mapping[str, Verdict]) -> None:
        for uid, verdict in verdicts.items():
            before = self._verdicts.get(uid)
            if before is None or before.state != verdict.state:
                level = logging.WARNING if verdict.state != VerdictState.OK else logging.INFO
                log.log(
                    level,
                    "%s/%s: %s pod %s is %s: %s",
                    self.model.namespace,
                    self.model.name,
                    views[uid].role,
                    views[uid].name,
                    verdict.state,
                    verdict.reason,
                )

    def update_gauges(self, judged: Judgement, state: WatchdogState) -> None:
        ns, name = self.model.namespace, self.model.name
        for role in contract.RUNTIME_ROLES:
            of_role = [v for key, v in judged.verdicts.items() if judged.units[key].role == role]
            self.metrics.wedged_pods.labels(ns, name, role).set(
                sum(v.state == VerdictState.WEDGED for v in of_role)
            )
            self.metrics.unobserved_pods.labels(ns, name, role).set(
                sum(v.state == VerdictState.UNOBSERVED for v in of_role)
            )
            self.metrics.abandoned_rooms.labels(ns, name, role).set(
                sum(v.figures.get("abandonedRooms", 0.0) for v in of_role)
            )
        self.metrics.budget_exhausted.labels(ns, name).set(1.0 if state.exhausted else 0.0)

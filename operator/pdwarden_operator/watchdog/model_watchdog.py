"""One model's watchdog: its rounds, one per scrape interval, while kopf_handlers.py keeps
its task running. A model with nothing to look at has no rounds until its body changes.

The round is a thin supervisor of two controllers, in a straight line:
1. the spec, parsed once (the round idles while it does not validate or nothing is Ready);
2. observe (observe.py): the model's own runtime pods, which are gone, their scrapes -> one
   frozen `ModelObservation` that both controllers read;
3. the watchdog controller (remediate.py): judge (wedge rule, blame, groups folded into
   units) -> the brakes told and asked -> the ladder's plan (pure) -> what the pods need said
   about them (gone pods published, ranks labelled) and the brake's Event -> the intent
   written (status, compare-and-swap) -> the plan performed, its outcomes folded into the state;
4. the autoscaler controller (scaler.py), a sibling: it reads the observation and the
   watchdog's verdicts per pod, plans and writes the Deployments' counts as planned;
5. report: the status (findings and autoscaling) when it changed, the gauges.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

import pdwarden_contract as contract
from pdwarden_operator.kube import model_status as kube_model_status
from pdwarden_operator.kube import pods as kube_pods
from pdwarden_operator.kube.client import KubeApiError
from pdwarden_operator.metrics import OperatorMetrics
from pdwarden_operator.models import DisaggregatedModelSpec, parse_spec
from pdwarden_operator.resource.status_parts import FleetBrakeStatus
from pdwarden_operator.watchdog import group_health, ladder
from pdwarden_operator.watchdog.context import Key, WatchdogContext
from pdwarden_operator.watchdog.executor import ModelIdentity
from pdwarden_operator.watchdog.latest_body import LatestBody
from pdwarden_operator.watchdog.observe import ModelObservation, Observer
from pdwarden_operator.watchdog.remediate import Judgement, WatchdogController
from pdwarden_operator.watchdog.scaler import ModelScaler
from pdwarden_operator.watchdog.state import (
    WatchdogState,
    round_due,
    state_from_status,
    state_to_status,
    status_write_due,
)
from pdwarden_operator.watchdog.verdict import VerdictState

log = logging.getLogger("pdwarden.watchdog")

FAILED_ROUND_WAIT_S = 10.0  # after a round that raised
FIRST_ROUND_MIN_S, FIRST_ROUND_MAX_S = 1.0, 5.0

__all__ = ["Key", "ModelWatchdog", "first_round_delay", "until_phase"]


def first_round_delay(interval: float | None, rng: random.Random | None = None) -> float:
    """When a watchdog's first round comes. A new model has no pods to scrape yet, and models
    must not scrape (and write status) in lockstep: spread over the whole scrape interval,
    a thousand models' rounds reach the operator-wide scrape budget one after another instead
    of all in the same few seconds (at least FIRST_ROUND_MIN_S, within FIRST_ROUND_MAX_S
    when the interval is shorter)."""
    upper = max(FIRST_ROUND_MAX_S, interval or 0.0)
    return (rng or random).uniform(FIRST_ROUND_MIN_S, upper)


def until_phase(anchor: float, period: float, now: float) -> float:
    """Seconds from `now` to the next of the times `anchor + k * period`: when a watchdog woken
    by its model's change has its next round. Models changed together (a fleet whose pods became
    Ready in the same minute) then keep the phases their first rounds spread, rather than all
    scraping in the same second and queueing for the operator-wide scrape slots."""
    return (anchor - now) % period


def _parsed_spec(body: Mapping[str, Any]) -> DisaggregatedModelSpec | None:
    """The model's spec, validated once per round; None when it does not validate (the
    reconciler reports InvalidSpec; the watchdog stays idle)."""
    try:
        return parse_spec(dict(body.get("spec") or {}))
    except ValidationError:
        return None


class ModelWatchdog:
    """The watchdog of one DisaggregatedModel; state survives restarts through the status."""

    def __init__(
        self,
        namespace: str,
        name: str,
        uid: str,
        metrics: OperatorMetrics | None = None,
        *,
        context: WatchdogContext,
    ) -> None:
        """`context`: what the operator's watchdogs share (a test watching one model alone
        builds one of its own); `metrics` defaults to the context's."""
        self.model = ModelIdentity(namespace, name, uid)
        self.kube = context.kube
        self.metrics = metrics if metrics is not None else context.metrics
        self.brakes = context.brakes
        self.writer = context.writer
        self.observer = Observer(
            self.model, context.kube, context.pods, context.budget, self.metrics, context.children
        )
        self.watchdog = WatchdogController(
            self.model, context.kube, context.brakes, self.metrics, context.leadership.still_leading
        )
        executor = self.watchdog.executor
        self.scaler = ModelScaler(
            self.model,
            context.kube,
            self.metrics,
            executor.post_model_event,
            executor.may_act,
            context.role_loads,
        )
        self._autoscaling: dict[str, Any] | None = None  # the status part of the last round
        self._written: Mapping[str, Any] | None = None  # the last status patch this process wrote
        self._written_at: float | None = None
        self._seeded = False  # the brakes know this model's remediations from its status

    async def run(self, latest: LatestBody) -> None:
        try:
            first = latest.get()
            spec = _parsed_spec(first) if first is not None else None
            await asyncio.sleep(first_round_delay(spec.watchdog.scrape_interval_seconds if spec else None))
            anchor = time.monotonic()  # this watchdog's phase
            while True:
                version, body = latest.version, latest.get()
                if body is None:
                    return
                interval: float | None = FAILED_ROUND_WAIT_S
                started = time.monotonic()
                try:
                    interval = await self.round(body)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # one bad round (API down, ...) must not end the watchdog
                    if isinstance(exc, KubeApiError) and exc.not_found and await self._model_gone():
                        return
                    log.exception("%s/%s: watchdog round failed", self.model.namespace, self.model.name)
                took = time.monotonic() - started
                self.metrics.round_seconds.observe(took)
                if interval is None:
                    await latest.changed_since(version)
                    woken_by = latest.get()
                    spec = _parsed_spec(woken_by) if woken_by is not None else None
                    if spec is not None:  # else gone (the loop ends) or still idle: at once
                        period = spec.watchdog.scrape_interval_seconds
                        await asyncio.sleep(until_phase(anchor, period, time.monotonic()))
                    continue
                if took > interval:
                    self.metrics.rounds_late.inc()
                await asyncio.sleep(max(0.5, interval - took))
        finally:
            await self.observer.close()
            self.metrics.forget(self.model.namespace, self.model.name)

    async def _model_gone(self) -> bool:
        """Whether this watchdog's model is gone (a round's write found nothing)."""
        ns, name = self.model.namespace, self.model.name
        if await kube_model_status.still_exists(self.kube, ns, name, self.model.uid):
            return False
        log.warning("%s/%s: watchdog stopped: the model (uid %s) is gone", ns, name, self.model.uid)
        return True

    async def round(self, body: Mapping[str, Any]) -> float | None:
        """One round; returns the scrape interval to wait, or None when the round had nothing
        to look at, which only a new body of the model can change (the next round waits for
        one: no rounds at all for a parked model between watch events)."""
        spec = self._spec(body)
        if spec is None:
            return None
        interval = spec.watchdog.scrape_interval_seconds
        obs = await self.observer.observe(spec, body)
        judged = self.watchdog.judge(obs)
        if not await self._remediate(obs, judged):
            return interval
        self._autoscaling = await self.scaler.round(obs, judged.pods)
        await self._report(obs, judged)
        return interval

    def _spec(self, body: Mapping[str, Any]) -> DisaggregatedModelSpec | None:
        """The round's spec (its one read), when there is something to look at; the state read
        from the status when this process has none."""
        ns, name = self.model.namespace, self.model.name
        if not self._seeded:
            # the hour of remediations this model's status remembers counts toward the brakes
            # (a new leader starts from there, not from zero)
            self.brakes.seed((ns, name), state_from_status(body.get("status")).remediations)
            self.scaler.seed(body.get("status"))
            self._seeded = True
        spec = _parsed_spec(body)
        if spec is None:
            log.warning("%s/%s: watchdog idle: the spec does not validate", ns, name)
            self.brakes.report((ns, name), 0, remediated=False)
            return None
        if not round_due(body.get("status"), self.observer.seen_any(), contract.RUNTIME_ROLES):
            self.brakes.report((ns, name), 0, remediated=_remediated(spec))
            return None  # no scraper, no pod list: nothing to look at yet
        if self.watchdog.state is None:
            self.watchdog.state = state_from_status(body.get("status"))
        return spec

    async def _remediate(self, obs: ModelObservation, judged: Judgement) -> bool:
        """The watchdog controller's turn: brakes, plan, intent, perform. False when the round
        ends here (the brakes wait for every model's first report, the intent was refused, or
        this replica stopped leading)."""
        ns, name = self.model.namespace, self.model.name
        brake = self.watchdog.ask_brakes(judged, _remediated(obs.spec))
        if brake.scope == "startup":
            log.info("%s/%s: not acting yet: %s", ns, name, brake.reason)
            await self._keep_pods_described(obs)
            return False
        state = self.watchdog.state or WatchdogState()
        plan = self.watchdog.plan(obs, judged, state, brake.engaged)
        await self._keep_pods_described(obs)
        await self.watchdog.announce_brake(brake)
        if any(not a.resumed for a in plan.actions) and not await self._write_intent(obs, judged, plan):
            return False
        return await self.watchdog.perform(plan, obs.now)

    async def _write_intent(self, obs: ModelObservation, judged: Judgement, plan: ladder.Plan) -> bool:
        """Intent first: the budget, cooldown and in-flight entry are durable before any pod is
        touched, written as a compare-and-swap on the resourceVersion this round read: a 409
        means someone else wrote the model since (another replica that leads now)."""
        intent = self._findings(obs, judged, plan.state)
        rv = str((obs.body.get("metadata") or {}).get("resourceVersion") or "") or None
        try:
            await self._write_status(obs, intent, resource_version=rv)
        except KubeApiError as exc:
            if exc.status != 409:
                raise
            log.warning(
                "%s/%s: intent refused (model changed since read): not acting",
                self.model.namespace,
                self.model.name,
            )
            self.watchdog.state = None  # read it again from the status next round
            return False
        return True

    async def _report(self, obs: ModelObservation, judged: Judgement) -> None:
        """The status when it changed (or a heartbeat is due), and the gauges."""
        state = self.watchdog.state or WatchdogState()
        findings = self._findings(obs, judged, state)
        if status_write_due(self._written, self._written_at, findings, obs.now):
            await self._write_status(obs, findings)
        self.watchdog.update_gauges(judged, state)

    async def _keep_pods_described(self, obs: ModelObservation) -> None:
        """What the round learnt about the pods, written where others read it: the gone pods
        published for the decodes holding pages for them, each group pod's rank label. Neither
        is the round's failure: a failed write is logged and done again next round."""
        await self.observer.gone.publish()
        await self._label_ranks(obs)

    async def _label_ranks(self, obs: ModelObservation) -> None:
        """`pdwarden.io/rank` on each group pod (its StatefulSet ordinal), once; a failure is
        logged and tried again next round (the label is for people and selectors: nothing
        here depends on it)."""
        for pod, uid, rank in group_health.unlabelled_ranks(obs.pods):
            try:
                await kube_pods.label_pod(
                    self.kube, self.model.namespace, pod, uid, {contract.LABEL_RANK: rank}
                )
            except KubeApiError as exc:
                log.info(
                    "%s/%s: labelling %s with its rank: %s", self.model.namespace, self.model.name, pod, exc
                )

    async def _write_status(
        self, obs: ModelObservation, findings: Mapping[str, Any], resource_version: str | None = None
    ) -> None:
        await self.writer.findings(obs.body, obs.spec, findings, resource_version=resource_version)
        self._written, self._written_at = findings, obs.now

    def _findings(self, obs: ModelObservation, judged: Judgement, state: WatchdogState) -> dict[str, Any]:
        """The watchdog's part of the status: `watchdog` and `remediations` (and `autoscaling`,
        as the autoscaler last reported it)."""
        settings, brake = obs.settings, self.watchdog.brake
        findings = state_to_status(
            state,
            last_scrape=obs.now,
            wedged_pods=judged.named(VerdictState.WEDGED),
            unobserved_pods=judged.named(VerdictState.UNOBSERVED),
            max_remediations=settings.max_remediations,
            budget_exhausted=state.exhausted and settings.action != "alert",
            # the reason only while engaged: the counts behind it change with every model's round
            fleet_brake=(
                FleetBrakeStatus(engaged=True, scope=brake.scope, reason=brake.reason)
                if brake.engaged
                else FleetBrakeStatus(engaged=False)
            ),
        )
        findings["autoscaling"] = self._autoscaling
        return findings


def _remediated(spec: DisaggregatedModelSpec) -> bool:
    """An alert-only model is never remediated: it counts toward no brake."""
    return spec.watchdog.action != "alert"

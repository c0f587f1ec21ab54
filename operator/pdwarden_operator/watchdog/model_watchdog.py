"""One model's watchdog: its rounds, one per scrape interval, while kopf_handlers.py keeps
its task running. A model with nothing to look at has no rounds until its body changes.

A round observes, plans, then acts. Observe: the model's runtime pods (and which are gone)
-> scrape them -> wedge rule and blame per pod. Plan: the ladder's (pure). Act: the gone pods
published and ranks labelled -> the brake's Event -> persist the intent (status) -> perform
-> the autoscaler -> persist outcomes and conditions -> metrics.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ValidationError

import pdwarden_contract as contract
from pdwarden_operator import render, replicas
from pdwarden_operator.cache import CHILDREN
from pdwarden_operator.kube import apply as kube_apply
from pdwarden_operator.kube import configmaps as kube_configmaps
from pdwarden_operator.kube import model_status as kube_model_status
from pdwarden_operator.kube import pods as kube_pods
from pdwarden_operator.kube.client import KubeApiError
from pdwarden_operator.metrics import METRICS, OperatorMetrics
from pdwarden_operator.models import DisaggregatedModelSpec, FleetBrakeStatus, parse_spec
from pdwarden_operator.status_writer import WRITER
from pdwarden_operator.watchdog import blame, group_health, ladder
from pdwarden_operator.watchdog.brake import BRAKE, BrakeState
from pdwarden_operator.watchdog.drain import healthy_requests_done
from pdwarden_operator.watchdog.executor import Executor, ModelRef, NotLeading
from pdwarden_operator.watchdog.gone_pods import GonePods, from_json, published, seen, to_json
from pdwarden_operator.watchdog.history import Histories, Observation
from pdwarden_operator.watchdog.latest_body import LatestBody
from pdwarden_operator.watchdog.outcome import Outcome
from pdwarden_operator.watchdog.ownership import Owners
from pdwarden_operator.watchdog.pod_cache import POD_CACHE
from pdwarden_operator.watchdog.rule import judge
from pdwarden_operator.watchdog.scaler import ModelScaler, RolePod
from pdwarden_operator.watchdog.scrape import Scraper, Target
from pdwarden_operator.watchdog.state import (
    WatchdogState,
    round_due,
    state_from_status,
    state_to_status,
    status_write_due,
)
from pdwarden_operator.watchdog.targets import metrics_url, peer_addresses, pod_view
from pdwarden_operator.watchdog.verdict import PodView, Verdict, VerdictState

log = logging.getLogger("pdwarden.watchdog")

SCRAPE_CONCURRENCY = 100
FAILED_ROUND_WAIT_S = 10.0  # after a round that raised
FIRST_ROUND_MIN_S, FIRST_ROUND_MAX_S = 1.0, 5.0

Key = tuple[str, str]


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

    def __init__(self, namespace: str, name: str, uid: str, metrics: OperatorMetrics = METRICS) -> None:
        self.model = ModelRef(namespace, name, uid)
        self.metrics = metrics
        self.executor = Executor(self.model, metrics)
        self.scaler = ModelScaler(self.model, metrics, self.executor.post_model_event, self.executor.may_act)
        self._autoscaling: dict[str, Any] | None = None  # the status part of the last round
        self._brake = BrakeState(False, "")  # as this model last saw it (Events on changes)
        self.histories = Histories(keep_seconds=150.0)
        self.scraper: Scraper | None = None
        self.state: WatchdogState | None = None  # loaded from status on the first round
        self.verdicts: dict[str, Verdict] = {}
        self._written: Mapping[str, Any] | None = None  # the last status patch this process wrote
        self._written_at: float | None = None
        self.gone: GonePods | None = None  # read back from its ConfigMap on the first round
        self.owners = Owners(uid, namespace)
        self._strangers: set[str] = set()  # look-alike pods already logged
        self._seeded = False  # the brakes know this model's remediations from its status
        self._gone_unwritten = False
        self._gone_foreign = False  # a ConfigMap of the list's name is not the model's

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
            if self.scraper is not None:
                await self.scraper.close()
            self.metrics.forget_model(self.model.namespace, self.model.name)

    async def _model_gone(self) -> bool:
        """Whether this watchdog's model is gone (a round's write found nothing)."""
        ns, name = self.model.namespace, self.model.name
        if await kube_model_status.still_exists(ns, name, self.model.uid):
            return False
        log.warning("%s/%s: watchdog stopped: the model (uid %s) is gone", ns, name, self.model.uid)
        return True

    async def round(self, body: Mapping[str, Any]) -> float | None:
        """One scrape-judge-act round; returns the scrape interval to wait, or None when the
        round had nothing to look at, which only a new body of the model can change (the next
        round waits for one: no rounds at all for a parked model between watch events)."""
        ns, name = self.model.namespace, self.model.name
        if not self._seeded:
            # the hour of remediations this model's status remembers counts toward the brakes
            # (a new leader starts from there, not from zero)
            BRAKE.seed((ns, name), state_from_status(body.get("status")).remediations)
            self.scaler.seed(body.get("status"))
            self._seeded = True
        spec = _parsed_spec(body)  # the one read of the spec this round
        if spec is None:
            log.warning("%s/%s: watchdog idle: the spec does not validate", ns, name)
            BRAKE.report((ns, name), 0, remediated=False)
            return None
        settings = spec.watchdog
        # an alert-only model is never remediated: it counts toward no brake
        remediated = settings.action != "alert"
        if not round_due(body.get("status"), self._seen_any(), contract.RUNTIME_ROLES):
            BRAKE.report((ns, name), 0, remediated=remediated)
            return None  # no scraper, no pod list: nothing to look at yet
        if self.state is None:
            self.state = state_from_status(body.get("status"))
        if self.scraper is None or self.scraper.timeout_seconds != settings.scrape_timeout_seconds:
            if self.scraper is not None:
                await self.scraper.close()
            self.scraper = Scraper(
                concurrency=SCRAPE_CONCURRENCY, timeout_seconds=settings.scrape_timeout_seconds
            )
        self.histories.set_keep_seconds(settings.stuck_after_seconds + 3 * settings.scrape_interval_seconds)

        # Observe: the pods, which of the model's pods are gone, their metrics, verdicts.
        pod_objs = await self._own_pods(await POD_CACHE.pods(ns, name, kube_pods.list_namespace_runtime_pods))
        await self._observe_gone_pods(pod_objs)
        views = {}
        targets = []
        paired = []
        # a `peer` label may name only the model's own pods (listed, or gone lately)
        peers = peer_addresses(pod_objs, (g.ip for g in self.gone.entries()) if self.gone else ())
        for obj in pod_objs:
            view = pod_view(obj)
            if view is None:
                continue
            views[view.uid] = view
            paired.append((view, obj))
            url = metrics_url(obj)
            if url is not None and (view.ready or self._seen(view.uid)):
                # a pod that has never been Ready nor answered is starting, not unobserved
                targets.append(Target(view.uid, url, peers))
        started = time.perf_counter()
        results = await self.scraper.scrape(targets)
        self.metrics.scrape_duration.labels(ns, name).observe(time.perf_counter() - started)
        at = time.monotonic()
        verdicts: dict[str, Verdict] = {}
        for res in results:
            history = self.histories.add(res.key, Observation(at, res.sample, res.error))
            verdicts[res.key] = judge(history.observations(), settings.stuck_after_seconds)
            if res.error is not None:
                self.metrics.scrape_errors.labels(ns, name, views[res.key].role).inc()
        self.histories.retain(views)
        attribution = blame.attribute(
            pods=list(views.values()),
            observations={
                uid: h.observations() for uid in views if (h := self.histories.get(uid)) is not None
            },
            verdicts=verdicts,
            stuck_after=settings.stuck_after_seconds,
        )
        verdicts = attribution.verdicts
        self._log_changes(views, verdicts)
        self.verdicts = verdicts

        now = time.time()
        desired = {role: self._replicas(spec, role) for role in contract.RUNTIME_ROLES}
        role_pods = self._role_pods(spec, paired, verdicts)
        # Multi-node replicas are judged and remediated as groups (group_health.py): from here on a
        # group is one entry, and its pods are acted on together.
        nodes = {role: spec.role(role).nodes_per_replica for role in contract.RUNTIME_ROLES}
        found = group_health.groups_of(paired, name, nodes)
        views, verdicts = group_health.fold(views, verdicts, found, now)
        self.executor.groups = group_health.members(found)
        self.executor.group_names = frozenset(found)
        BRAKE.report((ns, name), sum(1 for v in verdicts.values() if v.troubled), remediated=remediated)
        brake = BRAKE.evaluate(ns)
        if brake.scope == "startup":
            log.info("%s/%s: not acting yet: %s", ns, name, brake.reason)
            await self._keep_pods_described(pod_objs)
            return settings.scrape_interval_seconds
        # Plan (pure), then act: what the pods need said about them, the brake's Event, the
        # intent, the plan's actions, the autoscaler, the status.
        plan = ladder.plan(
            verdicts=verdicts,
            pods=list(views.values()),
            state=self.state,
            settings=settings,
            now=now,
            desired=desired,
            brake=brake.engaged,
            drained=self._drained(self.state, now, at),
        )
        wedged = [views[uid].name for uid, v in verdicts.items() if v.state == VerdictState.WEDGED]
        unobserved = [views[uid].name for uid, v in verdicts.items() if v.state == VerdictState.UNOBSERVED]
        await self._keep_pods_described(pod_objs)
        await self._announce_brake(brake)

        if any(not a.resumed for a in plan.actions):
            # Intent first: the budget, cooldown and in-flight entry are durable before any pod
            # is touched, written as a compare-and-swap on the resourceVersion this round read:
            # a 409 means someone else wrote the model since (another replica that leads now).
            intent = self._findings(spec, plan.state, now, wedged, unobserved)
            rv = str((body.get("metadata") or {}).get("resourceVersion") or "") or None
            try:
                await self._write_status(body, spec, intent, now, resource_version=rv)
            except KubeApiError as exc:
                if exc.status != 409:
                    raise
                log.warning("%s/%s: intent refused (model changed since read): not acting", ns, name)
                self.state = None  # read it again from the status next round
                return settings.scrape_interval_seconds
        try:
            results_done = await self.executor.perform(plan)
        except NotLeading as exc:
            log.warning("%s/%s: %s", ns, name, exc)
            self.state = None
            return settings.scrape_interval_seconds
        for result in results_done:
            # one count per remediation: a drain counts when it starts (its deletion comes later)
            if result.outcome in (Outcome.EVICTED, Outcome.QUARANTINED) or (
                result.outcome == Outcome.DELETED and result.action.kind == "restart"
            ):
                BRAKE.record_action((ns, name))
        self.state = ladder.apply_results(plan.state, results_done, now)
        self._autoscaling = await self.scaler.round(spec, role_pods, now)
        findings = self._findings(spec, self.state, now, wedged, unobserved)
        if status_write_due(self._written, self._written_at, findings, now):
            await self._write_status(body, spec, findings, now)
        self._update_gauges(views, verdicts, self.state)
        return settings.scrape_interval_seconds

    def _replicas(self, spec: DisaggregatedModelSpec, role: str) -> int:
        """The role's count: the spec's, or an autoscaled role's as the watch holds its Deployment."""
        key = (self.model.namespace, self.model.name)
        deployment = CHILDREN.child(key, "Deployment", render.child_name(self.model.name, role))
        return replicas.in_effect(spec.role(role), replicas.deployed(deployment))

    def _role_pods(
        self,
        spec: DisaggregatedModelSpec,
        paired: list[tuple[PodView, dict[str, Any]]],
        verdicts: Mapping[str, Verdict],
    ) -> dict[str, list[RolePod]]:
        """The autoscaled roles' pods (quarantined ones are out of their Deployment), each with
        its verdict and last sample."""
        out: dict[str, list[RolePod]] = {role: [] for role in spec.autoscaled_roles}
        for view, obj in paired:
            if view.role not in out or view.quarantined:
                continue
            history = self.histories.get(view.uid)
            observations = history.observations() if history is not None else []
            sample = observations[-1].sample if observations else None
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            out[view.role].append(RolePod(view, verdicts.get(view.uid), sample, annotations))
        return out

    async def _own_pods(self, listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The listed pods the model controls (ownership.py); look-alikes are logged once and
        never scraped, judged or touched."""
        await self.owners.learn(listed, kube_apply.get)
        own = [p for p in listed if self.owners.ours(p)]
        if len(own) < len(listed):
            for pod in listed:
                meta = pod.get("metadata") or {}
                uid = str(meta.get("uid"))
                if not self.owners.ours(pod) and uid not in self._strangers and len(self._strangers) < 1024:
                    self._strangers.add(uid)
                    log.warning(
                        "%s/%s: pod %s is labelled as this model's but is not controlled by it: ignored",
                        self.model.namespace,
                        self.model.name,
                        meta.get("name"),
                    )
        return own

    async def _observe_gone_pods(self, pod_objs: list[dict[str, Any]]) -> None:
        """Which of the model's runtime pods are gone (gone_pods.py): the published list read
        once, a pod missing from the listing confirmed gone by the API server. A failure is
        logged and tried again next round."""
        ns, name = self.model.namespace, self.model.name
        try:
            if self.gone is None:
                _, document = await self._published()
                self.gone = GonePods(from_json(document))
            listed = [s for obj in pod_objs if (s := seen(obj)) is not None]
            confirmed = [
                p.uid for p in self.gone.missing(listed) if await kube_configmaps.pod_gone(ns, p.name, p.uid)
            ]
            self._gone_unwritten |= self.gone.observe(listed, confirmed, time.time())
        except Exception as exc:  # never the round's failure: judging and remediating go on
            log.warning("%s/%s: reading the gone runtime pods: %s", ns, name, exc)

    async def _keep_pods_described(self, pod_objs: list[dict[str, Any]]) -> None:
        """What the round learnt about the pods, written where others read it: the gone pods
        published for the decodes holding pages for them, each group pod's rank label. Neither
        is the round's failure: a failed write is logged and done again next round."""
        await self._publish_gone_pods()
        await self._label_ranks(pod_objs)

    async def _publish_gone_pods(self) -> None:
        ns, name = self.model.namespace, self.model.name
        if self.gone is None or not self._gone_unwritten:
            return
        try:
            ours, _ = await self._published()
            if not ours:  # written once the name is free (the list stays unwritten until then)
                return
            owner = render.Owner(name=name, namespace=ns, uid=self.model.uid)
            await kube_configmaps.write(render.gone_pods_configmap(owner, to_json(self.gone.entries())))
            self._gone_unwritten = False
        except Exception as exc:
            log.warning("%s/%s: publishing the gone runtime pods: %s", ns, name, exc)

    async def _published(self) -> tuple[bool, str | None]:
        """`gone_pods.published` of the model's ConfigMap as the API server holds it; a foreign
        one is logged when first found."""
        ns, name = self.model.namespace, self.model.name
        cm_name = render.gone_pods_name(name)
        ours, document = published(await kube_configmaps.read(ns, cm_name), self.model.uid)
        if not ours and not self._gone_foreign:
            log.warning(
                "%s/%s: ConfigMap %s exists and is not this model's: its gone pods are neither read "
                "from it nor written to it",
                ns,
                name,
                cm_name,
            )
        self._gone_foreign = not ours
        return ours, document

    async def _label_ranks(self, pod_objs: list[dict[str, Any]]) -> None:
        """`pdwarden.io/rank` on each group pod (its StatefulSet ordinal), once; a failure is
        logged and tried again next round (the label is for people and selectors: nothing
        here depends on it)."""
        for pod, uid, rank in group_health.unlabelled_ranks(pod_objs):
            try:
                await kube_pods.label_pod(self.model.namespace, pod, uid, {contract.LABEL_RANK: rank})
            except KubeApiError as exc:
                log.info(
                    "%s/%s: labelling %s with its rank: %s", self.model.namespace, self.model.name, pod, exc
                )

    async def _write_status(
        self,
        body: Mapping[str, Any],
        spec: DisaggregatedModelSpec,
        findings: Mapping[str, Any],
        now: float,
        resource_version: str | None = None,
    ) -> None:
        await WRITER.findings(body, spec, findings, resource_version=resource_version)
        self._written, self._written_at = findings, now

    def _drained(self, state: WatchdogState, now: float, at: float) -> dict[str, bool]:
        """Per quarantined pod's UID: are its healthy requests done (drain.py)? The quarantine
        time is wall-clock (status); the scrape history is monotonic."""
        out = {}
        for flight in state.in_flight:
            history = self.histories.get(flight.uid)
            if flight.quarantined_at is None or history is None:
                continue
            since = at - (now - flight.quarantined_at)
            out[flight.uid] = healthy_requests_done(history.observations(), since)
        return out

    def _seen_any(self) -> bool:
        return any(self._seen(uid) for uid in self.histories.pod_uids())

    def _seen(self, uid: str) -> bool:
        history = self.histories.get(uid)
        return history is not None and any(o.sample is not None for o in history.observations())

    def _findings(
        self,
        spec: DisaggregatedModelSpec,
        state: WatchdogState,
        now: float,
        wedged: list[str],
        unobserved: list[str],
    ) -> dict[str, Any]:
        """The watchdog's part of the status: `watchdog` and `remediations`."""
        findings = state_to_status(
            state,
            last_scrape=now,
            wedged_pods=wedged,
            unobserved_pods=unobserved,
            max_remediations=spec.watchdog.max_remediations,
            budget_exhausted=state.exhausted and spec.watchdog.action != "alert",
            # the reason only while engaged: the counts behind it change with every model's round
            fleet_brake=(
                FleetBrakeStatus(engaged=True, scope=self._brake.scope, reason=self._brake.reason)
                if self._brake.engaged
                else FleetBrakeStatus(engaged=False)
            ),
        )
        findings["autoscaling"] = self._autoscaling
        return findings

    async def _announce_brake(self, brake: BrakeState) -> None:
        """An Event on this model when a brake (the fleet's or its namespace's) engages or releases."""
        if (brake.engaged, brake.scope) == (self._brake.engaged, self._brake.scope):
            self._brake = brake
            return
        held = brake if brake.engaged else self._brake
        which = "NamespaceBrake" if held.scope == "namespace" else "FleetBrake"
        self._brake = brake
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
            before = self.verdicts.get(uid)
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

    def _update_gauges(
        self, views: Mapping[str, PodView], verdicts: Mapping[str, Verdict], state: WatchdogState
    ) -> None:
        ns, name = self.model.namespace, self.model.name
        for role in contract.RUNTIME_ROLES:
            of_role = [v for uid, v in verdicts.items() if views[uid].role == role]
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

"""The autoscaler controller: one model's scaling round, a sibling of the watchdog controller.

It reads the round's observation (the Deployments' counts, each pod's last sample) and the
watchdog's verdicts per pod -> plans, purely: `autoscale.plan`, then `aim` per role (what this
round writes: the plan's count, or for a scale-in one pod fewer and the pod that goes first) ->
acts on the aims as planned: a scale-up sets the Deployment's count; a scale-in first marks
the least loaded pod as the one its ReplicaSet removes (pod deletion cost), then lowers the
count by one, and the pod's own termination drain finishes what it holds -> settles each role
from what was written (`RoleAim.settled`: the count and the memory of changes). A scale-in
waits while a pod of the role is starting or leaving (the ReplicaSet would remove that one, or
two would leave at once), and never removes a pod whose rooms are moving KV. Every count is written as a
compare-and-swap on the Deployment's resourceVersion: a concurrent change (a spec edit, a
person's `kubectl scale`) wins and the next round decides again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from pdwarden_contract import RUNTIME_ROLES
from pdwarden_operator import replicas
from pdwarden_operator.kube import scale as kube_scale
from pdwarden_operator.kube.client import KubeApiError, KubeClient
from pdwarden_operator.metrics import OperatorMetrics
from pdwarden_operator.models import DisaggregatedModelSpec
from pdwarden_operator.render.meta import child_name
from pdwarden_operator.resource.autoscaling import AutoscalingSpec, RatioBand
from pdwarden_operator.resource.status_parts import RoleAutoscalingStatus
from pdwarden_operator.timestamps import to_rfc3339
from pdwarden_operator.watchdog import autoscale
from pdwarden_operator.watchdog.executor import ModelIdentity
from pdwarden_operator.watchdog.observe import ModelObservation
from pdwarden_operator.watchdog.parse import PodSample
from pdwarden_operator.watchdog.role_load import RoleLoads, summarise
from pdwarden_operator.watchdog.verdict import PodView, Verdict, VerdictState

log = logging.getLogger("pdwarden.autoscale")

EventPoster = Callable[[str, str, Literal["Normal", "Warning"]], Awaitable[None]]
EXTERNAL_REASON = "ExternalDriver"


@dataclass(frozen=True)
class RolePod:
    """A pod of an autoscaled role as the scaler sees it."""

    view: PodView
    verdict: Verdict | None
    sample: PodSample | None
    annotations: Mapping[str, str]


def driven_roles(spec: DisaggregatedModelSpec) -> dict[str, AutoscalingSpec]:
    """The roles pdwarden scales itself (driver pdwarden), each with its `autoscaling`: what
    the planner takes."""
    return {
        role: a
        for role in spec.autoscaled_roles
        if (a := spec.role(role).autoscaling) is not None and a.driver == "pdwarden"
    }


def pod_load(pod: RolePod) -> autoscale.PodLoad:
    """A pod's load: its last sample; a pod without one (never scraped, or its last scrape
    failed) counts as not ready, and a troubled one's queue is not demand."""
    s = pod.sample
    troubled = pod.verdict is not None and pod.verdict.state != VerdictState.OK
    return autoscale.PodLoad(
        name=pod.view.name,
        ready=pod.view.ready and not pod.view.terminating and s is not None,
        wedged=troubled,
        inflight=s.inflight if s else 0.0,
        queue_age=s.oldest_age if s else None,
        pages_in_use=s.pages_in_use if s else None,
        transferring=(s.transferring or 0.0) if s else 0.0,
    )


def scale_in_victim(pods: Sequence[RolePod]) -> tuple[RolePod | None, str]:
    """The pod a scale-in removes, or None and why the scale-in waits."""
    leaving = [p.view.name for p in pods if p.view.terminating or not p.view.ready]
    if leaving:
        return None, f"pods starting or leaving: {', '.join(sorted(leaving))}"
    candidates = [
        p for p in pods if p.sample is not None and (p.verdict is None or p.verdict.state == VerdictState.OK)
    ]
    if not candidates:
        return None, "no healthy pod with a recent scrape to remove"
    victim = min(candidates, key=_removal_order)
    if victim.sample is not None and (victim.sample.transferring or 0.0) > 0:
        return None, f"every pod is moving KV (least loaded: {victim.view.name})"
    return victim, ""


def _removal_order(pod: RolePod) -> tuple[float, float, str]:
    sample = pod.sample
    return (
        (sample.transferring or 0.0, sample.inflight, pod.view.name) if sample else (0.0, 0.0, pod.view.name)
    )


def role_pods(obs: ModelObservation, verdicts: Mapping[str, Verdict]) -> dict[str, list[RolePod]]:
    """The autoscaled roles' pods (quarantined ones are out of their Deployment), each with
    its verdict and last sample."""
    out: dict[str, list[RolePod]] = {role: [] for role in obs.spec.autoscaled_roles}
    for view, obj in obs.paired:
        if view.role not in out or view.quarantined:
            continue
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        out[view.role].append(RolePod(view, verdicts.get(view.uid), obs.last_sample(view.uid), annotations))
    return out


@dataclass(frozen=True)
class RoleAim:
    """What this round does for a role pdwarden scales: the count it writes (the plan's, one pod
    fewer for a scale-in, or none while a scale-in waits: the decision then says why), the pod a
    scale-in removes first, and the role's memory before this round's change (the change it
    records is the one written)."""

    decision: autoscale.RoleDecision
    victim: RolePod | None
    pods: Sequence[RolePod]
    memory: autoscale.RoleMemory

    @property
    def writes(self) -> bool:
        return self.decision.desired != self.decision.current

    def settled(self, written: int | None, now: float) -> tuple[autoscale.RoleDecision, autoscale.RoleMemory]:
        """The decision and memory as the writes left them: an unwritten count (held, refused,
        not leading) stays where it is, and the step limits count what was written."""
        desired = self.decision.current if written is None else written
        decision = replace(self.decision, desired=desired)
        return decision, autoscale.remember(self.memory, now, desired - decision.current)


def aim(
    role: str,
    decision: autoscale.RoleDecision,
    memory: autoscale.RoleMemory,
    pods: Sequence[RolePod],
    now: float,
) -> RoleAim:
    """The role's aim from the plan's decision (pure): a scale-in removes one pod at a time,
    its victim chosen (each drains before the next goes), and waits while it cannot choose."""
    before = replace(memory, changes=tuple(c for c in memory.changes if c[0] != now))
    if decision.desired >= decision.current:
        return RoleAim(decision, None, (), before)
    victim, why = scale_in_victim(pods)
    if victim is None:
        held = f"{role}: scale-in to {decision.desired} waits: {why}"
        waiting = replace(decision, desired=decision.current, reason=autoscale.Reason.HELD, message=held)
        return RoleAim(waiting, None, (), before)
    desired = decision.current - 1
    message = (
        decision.message + f"; removing {victim.view.name}" + (" first" if desired > decision.desired else "")
    )
    return RoleAim(replace(decision, desired=desired, message=message), victim, pods, before)


@dataclass(frozen=True)
class ScalePlan:
    """A round's scaling, planned: the planner's plan and each pdwarden-scaled role's aim."""

    plan: autoscale.ScalingPlan
    aims: Mapping[str, RoleAim]
    band: RatioBand | None


def plan_scaling(
    spec: DisaggregatedModelSpec,
    pods: Mapping[str, Sequence[RolePod]],
    loads: Mapping[str, Sequence[autoscale.PodLoad]],
    current: Mapping[str, int],
    memory: Mapping[str, autoscale.RoleMemory],
    now: float,
) -> ScalePlan:
    """The planner's decisions for the roles pdwarden scales, and their aims (pure)."""
    driven = driven_roles(spec)
    band = spec.prefill_decode_ratio
    plan = autoscale.plan(
        roles=driven,
        current=current,
        loads={role: loads[role] for role in driven},
        memory=memory,
        ratio=band,
        now=now,
    )
    aims = {
        role: aim(role, decision, plan.memory[role], pods.get(role, ()), now)
        for role, decision in plan.decisions.items()
    }
    return ScalePlan(plan, aims, band)


class ModelScaler:
    """The autoscaler of one DisaggregatedModel; its windows live in memory (a new leader
    starts empty, and a fresh memory never scales in until a scale-down window has passed)."""

    def __init__(
        self,
        model: ModelIdentity,
        kube: KubeClient,
        metrics: OperatorMetrics,
        post_event: EventPoster,
        may_act: Callable[[], Awaitable[bool]],
        loads: RoleLoads,
    ) -> None:
        self.model = model
        self.kube = kube
        self.metrics = metrics
        self.post_event = post_event
        self.may_act = may_act
        self.loads = loads  # for the cluster's autoscalers (the external metrics API)
        self.memory: dict[str, autoscale.RoleMemory] = {}
        self.last_scale: dict[str, str] = {}  # role -> RFC 3339 time of pdwarden's last change
        self._saturated: set[str] = set()
        self._unkeepable = False
        self._roles: tuple[str, ...] = ()

    def _deployment(self, role: str) -> str:
        return child_name(self.model.name, role)

    async def _scale(self, obs: ModelObservation, role: str) -> kube_scale.Scale:
        """The role's count: the watch's copy, else one read."""
        cached = obs.deployments.get(role)
        if cached is not None and replicas.deployed(cached) is not None:
            return kube_scale.Scale.of(dict(cached))
        return await kube_scale.read(self.kube, self.model.namespace, self._deployment(role))

    def seed(self, status: Mapping[str, Any] | None) -> None:
        """Last scale times from the status this process found (for status continuity)."""
        part = (status or {}).get("autoscaling") if isinstance(status, Mapping) else None
        for role in RUNTIME_ROLES:
            stamp = ((part or {}).get(role) or {}).get("lastScaleTime") if isinstance(part, Mapping) else None
            if isinstance(stamp, str) and role not in self.last_scale:
                self.last_scale[role] = stamp

    def _forget_dropped(self, roles: tuple[str, ...]) -> None:
        dropped = tuple(r for r in self._roles if r not in roles)
        if dropped:
            self.metrics.forget_autoscaling(self.model.namespace, self.model.name, dropped)
            self.loads.forget(self.model.namespace, self.model.name, dropped)
            for role in dropped:
                self.memory.pop(role, None)
        self._roles = roles

    async def round(self, obs: ModelObservation, verdicts: Mapping[str, Verdict]) -> dict[str, Any] | None:
        """Plan and act for the autoscaled roles; returns the status's `autoscaling` (None: no
        role autoscales). `verdicts`: the watchdog's, per pod (a troubled pod's queue is no demand)."""
        spec, now = obs.spec, obs.now
        roles = spec.autoscaled_roles
        self._forget_dropped(roles)
        if not roles:
            return None
        pods = role_pods(obs, verdicts)
        loads = {role: [pod_load(p) for p in pods.get(role, ())] for role in roles}
        for role in roles:
            self.loads.record(self.model.namespace, self.model.name, role, summarise(loads[role], now))
        scales = {role: await self._scale(obs, role) for role in RUNTIME_ROLES}
        current = {role: s.replicas for role, s in scales.items()}
        scaling = plan_scaling(spec, pods, loads, current, self.memory, now)
        written = await self._write(scaling.aims, scales, scaling.band)
        out: dict[str, Any] = {}
        memory: dict[str, autoscale.RoleMemory] = {}
        for role in roles:
            role_aim = scaling.aims.get(role)
            if role_aim is None:  # driver external: the count is the other autoscaler's
                out[role] = self._external(spec, role, current[role])
            else:
                decision, memory[role] = role_aim.settled(written.get(role), now)
                out[role] = await self._settle(spec, role, decision, role in written, now)
            self.metrics.autoscale_replicas.labels(self.model.namespace, self.model.name, role).set(
                current[role]
            )
        self.memory = memory
        if scaling.band is not None:
            out["ratioKept"] = not scaling.plan.ratio_unkeepable
            if scaling.plan.ratio_unkeepable:
                out["ratioMessage"] = scaling.plan.ratio_message[:1024]
            await self._report_band(scaling.plan)
        return out

    def _external(self, spec: DisaggregatedModelSpec, role: str, replicas_now: int) -> dict[str, Any]:
        autoscaling = spec.role(role).autoscaling
        assert autoscaling is not None
        return RoleAutoscalingStatus(
            replicas=replicas_now,
            desired_replicas=replicas_now,
            recommended_replicas=None,
            min_replicas=autoscaling.min_replicas,
            max_replicas=autoscaling.max_replicas,
            reason=EXTERNAL_REASON,
            message=f"{role}: {replicas_now} replicas, set by an autoscaler of the cluster",
            saturated=False,
            last_scale_time=self.last_scale.get(role),
        ).model_dump(by_alias=True, exclude_none=True)

    async def _settle(
        self,
        spec: DisaggregatedModelSpec,
        role: str,
        decision: autoscale.RoleDecision,
        wrote: bool,
        now: float,
    ) -> dict[str, Any]:
        """A scaled role's status once its writes are done (announced when its count was written)."""
        autoscaling = spec.role(role).autoscaling
        assert autoscaling is not None
        if wrote:
            self.last_scale[role] = to_rfc3339(now)
            await self._announce(role, decision)
        status = RoleAutoscalingStatus(
            replicas=decision.current,
            desired_replicas=decision.desired,
            recommended_replicas=decision.recommended,
            min_replicas=autoscaling.min_replicas,
            max_replicas=autoscaling.max_replicas,
            reason=str(decision.reason),
            message=decision.message[:1024],
            saturated=decision.saturated,
            last_scale_time=self.last_scale.get(role),
        )
        await self._report(role, decision)
        return status.model_dump(by_alias=True, exclude_none=True)

    async def _write(
        self,
        aims: Mapping[str, RoleAim],
        scales: dict[str, kube_scale.Scale],
        band: RatioBand | None,
    ) -> dict[str, int]:
        """Write the aimed counts, one Deployment at a time in an order that keeps the band
        between the writes (autoscale.write_order); returns the last count written per role. A
        refused write (a 409: someone else changed the count) ends the round's writes: the next
        round decides again from what is there."""
        targets = {role: a.decision.desired for role, a in aims.items() if a.writes}
        if not targets or not await self.may_act():
            return {}
        current = {role: scale.replicas for role, scale in scales.items()}
        ns, written = self.model.namespace, {}
        for role, count in autoscale.write_order(current, targets, band):
            role_aim = aims[role]
            try:
                if role_aim.victim is not None:
                    await self._mark(role_aim.victim, role_aim.pods)
                scales[role] = await kube_scale.write(
                    self.kube, ns, self._deployment(role), count, scales[role].resource_version
                )
            except KubeApiError as exc:
                log.info(
                    "%s/%s: scaling %s to %d: %s (next round decides again)",
                    ns,
                    self.model.name,
                    role,
                    count,
                    exc,
                )
                break
            written[role] = count
        return written

    async def _announce(self, role: str, decision: autoscale.RoleDecision) -> None:
        """A written count's metric, log line and Event."""
        up = decision.desired > decision.current
        self.metrics.autoscale_decisions.labels(
            self.model.namespace, self.model.name, role, "up" if up else "down", str(decision.reason)
        ).inc()
        log.info("%s/%s: %s", self.model.namespace, self.model.name, decision.message)
        await self.post_event("ScaledUp" if up else "ScaledDown", decision.message, "Normal")

    async def _mark(self, victim: RolePod, pods: Sequence[RolePod]) -> None:
        """The victim is the pod the ReplicaSet removes first; no other pod keeps an older mark."""
        ns = self.model.namespace
        for pod in pods:
            if (
                pod is not victim
                and pod.annotations.get(kube_scale.POD_DELETION_COST) == kube_scale.REMOVE_FIRST_COST
            ):
                await kube_scale.mark(self.kube, ns, pod.view.name, pod.view.uid, None)
        await kube_scale.mark(self.kube, ns, victim.view.name, victim.view.uid, kube_scale.REMOVE_FIRST_COST)

    async def _report(self, role: str, decision: autoscale.RoleDecision) -> None:
        ns, name = self.model.namespace, self.model.name
        self.metrics.autoscale_recommended.labels(ns, name, role).set(decision.recommended)
        self.metrics.autoscale_saturated.labels(ns, name, role).set(1.0 if decision.saturated else 0.0)
        if decision.saturated and role not in self._saturated:
            await self.post_event("AutoscaleSaturated", decision.message, "Warning")
        (self._saturated.add if decision.saturated else self._saturated.discard)(role)

    async def _report_band(self, plan: autoscale.ScalingPlan) -> None:
        self.metrics.ratio_unkeepable.labels(self.model.namespace, self.model.name).set(
            1.0 if plan.ratio_unkeepable else 0.0
        )
        if plan.ratio_unkeepable and not self._unkeepable:
            await self.post_event("RatioBandUnkeepable", plan.ratio_message, "Warning")
        self._unkeepable = plan.ratio_unkeepable

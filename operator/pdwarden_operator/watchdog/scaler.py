"""The autoscaler's executor: one model's scaling round after the watchdog has judged its pods.

observe (the Deployments' counts, each pod's last sample and verdict) -> `autoscale.plan`
(pure) -> act: a scale-up sets the Deployment's count; a scale-in first marks the least loaded
pod as the one its ReplicaSet removes (pod deletion cost), then lowers the count by one, and
the pod's own termination drain finishes what it holds. A scale-in waits while a pod of the
role is starting or leaving (the ReplicaSet would remove that one, or two would leave at
once), and never removes a pod whose rooms are moving KV. Every count is written as a
compare-and-swap on the Deployment's resourceVersion: a concurrent change (a spec edit, a
person's `kubectl scale`) wins and the next round decides again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from pdwarden_operator import replicas
from pdwarden_operator.cache import CHILDREN
from pdwarden_operator.kube import scale as kube_scale
from pdwarden_operator.kube.client import KubeApiError
from pdwarden_operator.metrics import OperatorMetrics
from pdwarden_operator.models import (
    AutoscalingSpec,
    DisaggregatedModelSpec,
    RoleAutoscalingStatus,
    ScalePolicy,
)
from pdwarden_operator.render import child_name
from pdwarden_operator.timestamps import to_rfc3339
from pdwarden_operator.watchdog import autoscale
from pdwarden_operator.watchdog.executor import ModelRef
from pdwarden_operator.watchdog.parse import PodSample
from pdwarden_operator.watchdog.role_load import ROLE_LOADS, summarise
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


@dataclass(frozen=True)
class _Aim:
    decision: autoscale.RoleDecision  # desired: what this round writes (the plan's, or one pod fewer)
    victim: RolePod | None  # a scale-in's pod, marked to go first before the count drops
    pods: Sequence[RolePod] = ()

    @property
    def writes(self) -> bool:
        return self.decision.desired != self.decision.current


def scaling_of(spec: AutoscalingSpec) -> autoscale.RoleScaling:
    """The planner's view of a role's `autoscaling`."""

    def policy(p: ScalePolicy) -> autoscale.Policy:
        return autoscale.Policy(float(p.stabilization_seconds), p.max_step, float(p.period_seconds))

    t = spec.target
    return autoscale.RoleScaling(
        min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas,
        target=autoscale.Target(t.inflight_per_pod, t.queue_age_seconds, t.kv_pages_in_use),
        scale_up=policy(spec.scale_up),
        scale_down=policy(spec.scale_down),
    )


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


class ModelScaler:
    """The autoscaler of one DisaggregatedModel; its windows live in memory (a new leader
    starts empty, and a fresh memory never scales in until a scale-down window has passed)."""

    def __init__(
        self,
        model: ModelRef,
        metrics: OperatorMetrics,
        post_event: EventPoster,
        may_act: Callable[[], Awaitable[bool]],
    ) -> None:
        self.model = model
        self.metrics = metrics
        self.post_event = post_event
        self.may_act = may_act
        self.memory: dict[str, autoscale.RoleMemory] = {}
        self.last_scale: dict[str, str] = {}  # role -> RFC 3339 time of pdwarden's last change
        self._saturated: set[str] = set()
        self._unkeepable = False
        self._roles: tuple[str, ...] = ()

    def _deployment(self, role: str) -> str:
        return child_name(self.model.name, role)

    async def _scale(self, role: str) -> kube_scale.Scale:
        """The role's count: the watch's copy, else one read."""
        cached = CHILDREN.child((self.model.namespace, self.model.name), "Deployment", self._deployment(role))
        if cached is not None and replicas.deployed(cached) is not None:
            return kube_scale.Scale.of(cached)
        return await kube_scale.read(self.model.namespace, self._deployment(role))

    def seed(self, status: Mapping[str, Any] | None) -> None:
        """Last scale times from the status this process found (for status continuity)."""
        part = (status or {}).get("autoscaling") if isinstance(status, Mapping) else None
        for role in ("prefill", "decode"):
            stamp = ((part or {}).get(role) or {}).get("lastScaleTime") if isinstance(part, Mapping) else None
            if isinstance(stamp, str) and role not in self.last_scale:
                self.last_scale[role] = stamp

    async def round(
        self, spec: DisaggregatedModelSpec, pods: Mapping[str, Sequence[RolePod]], now: float
    ) -> dict[str, Any] | None:
        """Plan and act for the autoscaled roles; returns the status's `autoscaling` (None: no
        role autoscales)."""
        roles = spec.autoscaled_roles
        dropped = tuple(r for r in self._roles if r not in roles)
        if dropped:
            self.metrics.forget_autoscaling(self.model.namespace, self.model.name, dropped)
            ROLE_LOADS.forget(self.model.namespace, self.model.name, dropped)
            for role in dropped:
                self.memory.pop(role, None)
        self._roles = roles
        if not roles:
            return None
        loads = {role: [pod_load(p) for p in pods.get(role, ())] for role in roles}
        for role in roles:  # for the cluster's autoscalers (the external metrics API)
            ROLE_LOADS.record(self.model.namespace, self.model.name, role, summarise(loads[role], now))
        scales = {role: await self._scale(role) for role in ("prefill", "decode")}
        current = {role: s.replicas for role, s in scales.items()}
        driven = {
            role: scaling_of(a)
            for role in roles
            if (a := spec.role(role).autoscaling) is not None and a.driver == "pdwarden"
        }
        band = spec.prefill_decode_ratio
        ratio = autoscale.RatioBand(band.min, band.max) if band else None
        plan = autoscale.plan(
            roles=driven,
            current=current,
            loads={role: loads[role] for role in driven},
            memory=self.memory,
            ratio=ratio,
            now=now,
        )
        memory = dict(plan.memory)
        aims = {
            role: self._aim(role, decision, pods.get(role, ())) for role, decision in plan.decisions.items()
        }
        written = await self._write(aims, scales, ratio)
        out: dict[str, Any] = {}
        for role in roles:
            autoscaling = spec.role(role).autoscaling
            assert autoscaling is not None
            aim = aims.get(role)
            if aim is None:  # driver external: the count is the other autoscaler's
                status = RoleAutoscalingStatus(
                    replicas=current[role],
                    desired_replicas=current[role],
                    recommended_replicas=None,
                    min_replicas=autoscaling.min_replicas,
                    max_replicas=autoscaling.max_replicas,
                    reason=EXTERNAL_REASON,
                    message=f"{role}: {current[role]} replicas, set by an autoscaler of the cluster",
                    saturated=False,
                    last_scale_time=self.last_scale.get(role),
                )
            else:
                decision = aim.decision
                count = written.get(role)
                # unwritten (held, refused, not leading): the count stays where it is
                decision = replace(decision, desired=decision.current if count is None else count)
                # the step limits count what was written (a held, refused or cut change differs
                # from what the plan recorded)
                mem = memory[role]
                kept = replace(mem, changes=tuple(c for c in mem.changes if c[0] != now))
                memory[role] = autoscale.remember(kept, now, decision.desired - decision.current)
                if count is not None:
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
            out[role] = status.model_dump(by_alias=True, exclude_none=True)
            self.metrics.autoscale_replicas.labels(self.model.namespace, self.model.name, role).set(
                current[role]
            )
        self.memory = memory
        if band is not None:
            out["ratioKept"] = not plan.ratio_unkeepable
            if plan.ratio_unkeepable:
                out["ratioMessage"] = plan.ratio_message[:1024]
            await self._report_band(plan)
        return out

    def _aim(self, role: str, decision: autoscale.RoleDecision, pods: Sequence[RolePod]) -> _Aim:
        """What this round writes for the role: the plan's count, or for a scale-in one pod
        fewer, its victim chosen (each drains before the next goes), or nothing while a
        scale-in must wait (the decision then says why)."""
        if decision.desired >= decision.current:
            return _Aim(decision, None)
        victim, why = scale_in_victim(pods)
        if victim is None:
            held = f"{role}: scale-in to {decision.desired} waits: {why}"
            return _Aim(
                replace(decision, desired=decision.current, reason=autoscale.Reason.HELD, message=held),
                None,
            )
        desired = decision.current - 1
        message = (
            decision.message
            + f"; removing {victim.view.name}"
            + (" first" if desired > decision.desired else "")
        )
        return _Aim(replace(decision, desired=desired, message=message), victim, pods)

    async def _write(
        self, aims: Mapping[str, _Aim], scales: dict[str, kube_scale.Scale], band: autoscale.RatioBand | None
    ) -> dict[str, int]:
        """Write the aimed counts, one Deployment at a time in an order that keeps the band
        between the writes (autoscale.write_order); returns the last count written per role. A
        refused write (a 409: someone else changed the count) ends the round's writes: the next
        round decides again from what is there."""
        targets = {role: aim.decision.desired for role, aim in aims.items() if aim.writes}
        if not targets or not await self.may_act():
            return {}
        current = {role: scale.replicas for role, scale in scales.items()}
        ns, written = self.model.namespace, {}
        for role, count in autoscale.write_order(current, targets, band):
            aim = aims[role]
            try:
                if aim.victim is not None:
                    await self._mark(aim.victim, aim.pods)
                scales[role] = await kube_scale.write(
                    ns, self._deployment(role), count, scales[role].resource_version
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
                await kube_scale.mark(ns, pod.view.name, pod.view.uid, None)
        await kube_scale.mark(ns, victim.view.name, victim.view.uid, kube_scale.REMOVE_FIRST_COST)

    async def _report(self, role: str, decision: autoscale.RoleDecision) -> None:
        ns, name = self.model.namespace, self.model.name
        self.metrics.autoscale_recommended.labels(ns, name, role).set(decision.recommended)
        self.metrics.autoscale_saturated.labels(ns, name, role).set(1.0 if decision.saturated else 0.0)
        if decision.saturated and role not in self._saturated:
            await self.post_event("AutoscaleSaturated", decision.message, "Warning")
        (self._saturated.add if decision.saturated else self._saturated.discard)(role)

    async def _report_band(self, plan: autoscale.Plan) -> None:
        self.metrics.ratio_unkeepable.labels(self.model.namespace, self.model.name).set(
            1.0 if plan.ratio_unkeepable else 0.0
        )
        if plan.ratio_unkeepable and not self._unkeepable:
            await self.post_event("RatioBandUnkeepable", plan.ratio_message, "Warning")
        self._unkeepable = plan.ratio_unkeepable

"""DisaggregatedModel status from what was observed: pure functions, no API calls.

`compose` is the one function that turns both inputs (the reconciler's observation of the
Deployments, the watchdog's findings) into phase and conditions; `status_writer.StatusWriter`
calls it for every write, whichever of the two triggered it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pdwarden_contract import ROLES
from pdwarden_operator import replicas
from pdwarden_operator.models import DisaggregatedModelSpec
from pdwarden_operator.resource.status_parts import CONDITION_TYPES, ConditionType
from pdwarden_operator.timestamps import format_time


@dataclass(frozen=True)
class Workload:
    """One Deployment as observed (or its absence)."""

    present: bool = False
    spec_replicas: int = 0  # .spec.replicas of the Deployment
    replicas: int = 0  # .status.replicas: non-terminated pods
    ready: int = 0
    updated: int = 0
    up_to_date: bool = False  # the Deployment controller has seen the latest template
    stalled: bool = False  # the Deployment controller gave up (ProgressDeadlineExceeded)
    # Multi-node replicas (observe_groups): the counts above are groups; these are pods.
    grouped: bool = False
    ready_pods: int = 0
    pods_per_group: int = 1


@dataclass(frozen=True)
class Observed:
    """Everything status is computed from, besides the spec and the watchdog's part."""

    generation: int
    workloads: Mapping[str, Workload] = field(default_factory=dict)
    error_reason: str | None = None  # e.g. InvalidSpec, ApplyFailed
    error_message: str | None = None
    previous_conditions: tuple[Mapping[str, Any], ...] = ()
    blocked: Mapping[str, str] = field(default_factory=dict)  # role -> why its pods cannot run
    worker_key: Mapping[str, Any] | None = None  # status.workerKey (worker_key_secret.progress)

    def workload(self, role: str) -> Workload:
        return self.workloads.get(role, Workload())


def observe_deployment(obj: Mapping[str, Any] | None) -> Workload:
    """A Workload from a Deployment body (None: the Deployment does not exist)."""
    if obj is None:
        return Workload()
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    st = obj.get("status") or {}
    stalled = any(
        c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded"
        for c in st.get("conditions") or []
    )
    return Workload(
        present=True,
        spec_replicas=int(spec.get("replicas", 1)),
        replicas=int(st.get("replicas") or 0),
        ready=int(st.get("readyReplicas") or 0),
        updated=int(st.get("updatedReplicas") or 0),
        up_to_date=int(st.get("observedGeneration") or 0) >= int(meta.get("generation") or 0),
        stalled=stalled,
    )


def _group_ready(st: Mapping[str, Any], nodes: int, generation: int) -> bool:
    return (
        int(st.get("readyReplicas") or 0) >= nodes
        and int(st.get("updatedReplicas") or 0) >= nodes
        and int(st.get("observedGeneration") or 0) >= generation
    )


def observe_groups(objs: Iterable[Mapping[str, Any]], nodes: int, want: int) -> Workload:
    """A grouped role from its groups' StatefulSets: a group counts as ready only when every
    one of its `nodes` pods is ready and up to date (a group with a missing or unready rank
    serves nothing)."""
    present = ready = updated = replicas = ready_pods = 0
    up_to_date = True
    for obj in objs:
        meta, st = obj.get("metadata") or {}, obj.get("status") or {}
        generation = int(meta.get("generation") or 0)
        present += 1
        replicas += int(st.get("replicas") or 0) > 0
        ready_pods += int(st.get("readyReplicas") or 0)
        ok = _group_ready(st, nodes, generation)
        ready += ok
        updated += ok or int(st.get("updatedReplicas") or 0) >= nodes
        up_to_date = up_to_date and int(st.get("observedGeneration") or 0) >= generation
    return Workload(
        present=present > 0 or want == 0,
        spec_replicas=present,
        replicas=replicas,
        ready=ready,
        updated=updated,
        up_to_date=up_to_date,
        grouped=True,
        ready_pods=ready_pods,
        pods_per_group=nodes,
    )


def desired_replicas(spec: DisaggregatedModelSpec, role: str, observed: Observed) -> int:
    """The role's count: the spec's, or an autoscaled role's as its Deployment holds it."""
    w = observed.workload(role)
    return replicas.desired(spec, role, w.spec_replicas if w.present else None)


def _settled(w: Workload, want: int) -> bool:
    return (
        w.present
        and w.up_to_date
        and w.spec_replicas == want
        and w.updated >= want
        and w.ready >= want
        and w.replicas == want
    )


def _find(conditions: Iterable[Mapping[str, Any]], ctype: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == ctype), None)


def _roles_summary(spec: DisaggregatedModelSpec, observed: Observed) -> str:
    parts = []
    for role in ROLES:
        w = observed.workload(role)
        want = desired_replicas(spec, role, observed)
        parts.append(f"{role} {w.ready}/{want} ready" if w.present else f"{role} not created")
    return ", ".join(parts)


def _wedged_pods(watchdog: Mapping[str, Any] | None) -> list[str]:
    return [str(p) for p in (watchdog or {}).get("wedgedPods") or []]


def _budget_exhausted(spec: DisaggregatedModelSpec, watchdog: Mapping[str, Any] | None) -> bool:
    if not watchdog:
        return False
    if watchdog.get("budgetExhausted") is not None:
        return bool(watchdog["budgetExhausted"])
    used = int(((watchdog.get("budget") or {}).get("used")) or 0)
    return bool(_wedged_pods(watchdog)) and used >= spec.watchdog.max_remediations


# A condition's (status, reason, message), judged from the facts below.
_Judgement = tuple[str, str, str]


@dataclass(frozen=True)
class _ConditionFacts:
    """What the conditions are judged from, computed once per status."""

    spec: DisaggregatedModelSpec
    observed: Observed
    watchdog: Mapping[str, Any] | None
    unsettled: tuple[str, ...]  # roles whose Deployment does not match the spec yet
    missing: tuple[str, ...]  # roles with no Deployment
    stalled: tuple[str, ...]  # unsettled roles whose Deployment controller gave up
    summary: str
    wedged: tuple[str, ...]  # the watchdog's wedged pods

    @property
    def error(self) -> str | None:
        return self.observed.error_reason


def _condition_facts(
    spec: DisaggregatedModelSpec, observed: Observed, watchdog: Mapping[str, Any] | None
) -> _ConditionFacts:
    unsettled = tuple(
        r for r in ROLES if not _settled(observed.workload(r), desired_replicas(spec, r, observed))
    )
    return _ConditionFacts(
        spec=spec,
        observed=observed,
        watchdog=watchdog,
        unsettled=unsettled,
        missing=tuple(r for r in ROLES if not observed.workload(r).present),
        stalled=tuple(r for r in ROLES if observed.workload(r).stalled and r in unsettled),
        summary=_roles_summary(spec, observed),
        wedged=tuple(_wedged_pods(watchdog)),
    )


def _ready_condition(f: _ConditionFacts) -> _Judgement:
    if f.error:
        return ("False", f.error, f.observed.error_message or f.error)
    if f.unsettled and f.observed.blocked:
        why = "; ".join(f"{role}: {msg}" for role, msg in sorted(f.observed.blocked.items()))
        return ("False", "PodsBlocked", f"Waiting: {f.summary}. {why}")
    if f.unsettled:
        reason = "ChildrenMissing" if f.missing else "ReplicasNotReady"
        return ("False", reason, f"Waiting: {f.summary}.")
    return ("True", "AllReplicasReady", f"All replicas ready: {f.summary}.")


def _progressing_condition(f: _ConditionFacts) -> _Judgement:
    if f.error:
        return ("False", f.error, "Not rolling out until the error is fixed.")
    if f.missing:
        return ("True", "CreatingChildren", f"Creating {', '.join(f.missing)}: {f.summary}.")
    if f.unsettled:
        return ("True", "RollingOut", f"Rolling out {', '.join(f.unsettled)}: {f.summary}.")
    return ("False", "RolloutComplete", f"Every role matches the spec: {f.summary}.")


def _degraded_condition(f: _ConditionFacts) -> _Judgement:
    watchdog = f.spec.watchdog
    if f.error:
        return ("True", f.error, f.observed.error_message or f.error)
    if _budget_exhausted(f.spec, f.watchdog):
        return (
            "True",
            "RemediationBudgetExhausted",
            f"{len(f.wedged)} wedged pod(s) and the remediation budget "
            f"({watchdog.max_remediations} per {watchdog.budget_window_seconds}s) is spent; "
            f"a person must look: {', '.join(f.wedged)}.",
        )
    if f.wedged and watchdog.action == "alert":
        return (
            "True",
            "WedgedPods",
            f"Wedged pod(s) and watchdog.action is alert (no automatic remediation): {', '.join(f.wedged)}.",
        )
    if f.stalled:
        return (
            "True",
            "RolloutStalled",
            f"The Deployment controller reports no progress for {', '.join(f.stalled)}: {f.summary}.",
        )
    return ("False", "AsExpected", "No errors, no wedged pods beyond what the watchdog handles.")


def _wedged_condition(f: _ConditionFacts) -> _Judgement:
    if f.wedged:
        return (
            "True",
            "InflightQueueStuck",
            f"{len(f.wedged)} pod(s) hold KV transfers with no progress for at least "
            f"{f.spec.watchdog.stuck_after_seconds}s: {', '.join(f.wedged)}.",
        )
    if f.watchdog and f.watchdog.get("lastScrape"):
        return ("False", "NoWedgedPods", "Every scraped pod finishes its KV transfers.")
    return ("Unknown", "NotScrapedYet", "The watchdog has not scraped the pods yet.")


def _fleet_brake_condition(f: _ConditionFacts) -> _Judgement:
    """Whether the fleet's or the namespace's brake held this model's remediation (watchdog/brake.py)."""
    brake = (f.watchdog or {}).get("fleetBrake") or {}
    if brake.get("engaged") and brake.get("scope") == "namespace":
        return (
            "True",
            "NamespaceBrakeEngaged",
            f"No remediation on this namespace's models: {brake.get('reason', '')}.",
        )
    if brake.get("engaged"):
        return ("True", "FleetBrakeEngaged", f"No remediation on any model: {brake.get('reason', '')}.")
    return ("False", "NotEngaged", "The operator-wide limits allow remediation.")


_JUDGES: Mapping[ConditionType, Callable[[_ConditionFacts], _Judgement]] = {
    "Ready": _ready_condition,
    "Progressing": _progressing_condition,
    "Degraded": _degraded_condition,
    "Wedged": _wedged_condition,
    "FleetBrake": _fleet_brake_condition,
}


def compute_conditions(
    spec: DisaggregatedModelSpec,
    observed: Observed,
    watchdog: Mapping[str, Any] | None,
    *,
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """Ready, Progressing, Degraded, Wedged and FleetBrake, keeping lastTransitionTime when unchanged."""
    facts = _condition_facts(spec, observed, watchdog)
    rows = [(ctype, *_JUDGES[ctype](facts)) for ctype in CONDITION_TYPES]
    return _conditions(rows, observed, now)


def _conditions(
    rows: Iterable[tuple[str, str, str, str]], observed: Observed, now: datetime | None
) -> list[dict[str, Any]]:
    """Conditions from (type, status, reason, message) rows; lastTransitionTime moves only when
    a condition's status changed since `observed.previous_conditions`."""
    stamp = _rfc3339(now or datetime.now(UTC))
    out = []
    for ctype, cstatus, reason, message in rows:
        before = _find(observed.previous_conditions, ctype)
        changed = before is None or before.get("status") != cstatus
        out.append(
            {
                "type": ctype,
                "status": cstatus,
                "reason": reason,
                "message": message,
                "lastTransitionTime": stamp if changed else before.get("lastTransitionTime", stamp),  # type: ignore[union-attr]
                "observedGeneration": observed.generation,
            }
        )
    return out


def compute_phase(conditions: Iterable[Mapping[str, Any]], observed: Observed) -> str:
    conds = {c["type"]: c["status"] for c in conditions}
    if conds.get("Degraded") == "True":
        return "Degraded"
    if conds.get("Ready") == "True":
        return "Ready"
    if not any(observed.workload(r).present for r in ROLES):
        return "Pending"
    return "Progressing"


def compute_status(
    spec: DisaggregatedModelSpec,
    observed: Observed,
    watchdog: Mapping[str, Any] | None,
    *,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The part of .status the reconciler owns (the watchdog owns .watchdog and .remediations)."""
    conditions = compute_conditions(spec, observed, watchdog, now=now)
    status: dict[str, Any] = {
        "observedGeneration": observed.generation,
        "phase": compute_phase(conditions, observed),
        "conditions": conditions,
    }
    if observed.worker_key is not None:
        status["workerKey"] = dict(observed.worker_key)
    for role in ROLES:
        want = desired_replicas(spec, role, observed)
        w = observed.workload(role)
        status[role] = {"replicas": want, "readyReplicas": w.ready, "summary": f"{w.ready}/{want}"}
        if w.grouped:
            pods = want * w.pods_per_group
            status[role].update(
                summary=f"{w.ready}/{want} groups, {w.ready_pods}/{pods} pods",
                groups=want,
                readyGroups=w.ready,
                readyPods=w.ready_pods,
            )
    return status


def compose(
    spec: DisaggregatedModelSpec,
    observed: Observed | None,
    findings: Mapping[str, Any] | None,
    known: Mapping[str, Any],
    *,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The status from both inputs: the watchdog's findings (its keys as given), and, once the
    reconciler has observed the model, phase, conditions and replica counts computed from the
    observation AND the findings (the stored ones from `known` until this process has its own).
    lastTransitionTime is kept from `known` for conditions whose status did not change."""
    out: dict[str, Any] = dict(findings or {})
    if observed is None:
        return out
    watchdog = out.get("watchdog", known.get("watchdog"))
    previous = replace(observed, previous_conditions=tuple(known.get("conditions") or ()))
    out.update(compute_status(spec, previous, watchdog, now=now))
    return out


def invalid_spec_status(message: str, observed: Observed, *, now: datetime | None = None) -> dict[str, Any]:
    """Status for a spec the operator cannot use (no spec model to compute from)."""
    rows = [
        (ctype, cstatus, "InvalidSpec", message)
        for ctype, cstatus in (("Ready", "False"), ("Progressing", "False"), ("Degraded", "True"))
    ]
    conditions = _conditions(rows, observed, now)
    return {"observedGeneration": observed.generation, "phase": "Degraded", "conditions": conditions}


def status_changed(current: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether writing `new` would change anything in `current` (keys `new` owns only)."""
    current = current or {}
    return any(current.get(k) != v for k, v in new.items())


def _rfc3339(t: datetime) -> str:
    return format_time(t)

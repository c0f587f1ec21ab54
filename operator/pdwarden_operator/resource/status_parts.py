"""The parts of the DisaggregatedModel's status: conditions, replica counts, the watchdog's
findings and memory, the autoscaler's view, the worker key's state."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import ConfigDict, Field

from pdwarden_operator.resource.rules import Part
from pdwarden_operator.resource.watchdog import WatchdogAction

# status.watchdog.remediations keeps the latest this many (watchdog/state.py drops older ones)
MAX_REMEDIATIONS_KEPT = 20
Phase = Literal["Pending", "Progressing", "Ready", "Degraded"]
ConditionType = Literal["Ready", "Progressing", "Degraded", "Wedged", "FleetBrake"]
CONDITION_TYPES: tuple[ConditionType, ...] = get_args(ConditionType)  # in the order status writes them


class Condition(Part):
    """A standard Kubernetes condition."""

    type: ConditionType = Field(description="Ready, Progressing, Degraded, Wedged or FleetBrake.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="One CamelCase word for machines.", max_length=128)
    message: str = Field(description="What a person needs to know.", max_length=32768)
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int = Field(description="The .metadata.generation this condition describes.")


class ReplicaStatus(Part):
    """Replica counts of one workload."""

    replicas: int = Field(0, description="Desired replicas (pods, or groups of nodesPerReplica pods).")
    ready_replicas: int = Field(0, description="Ready replicas (a group is ready when all its pods are).")
    summary: str = Field(
        "0/0",
        description="readyReplicas/replicas for kubectl get; with groups also the ready pods "
        "(`1/2 groups, 3/4 pods`).",
    )
    groups: int | None = Field(None, description="Desired groups (roles with nodesPerReplica > 1).")
    ready_groups: int | None = Field(None, description="Groups whose every pod is ready.")
    ready_pods: int | None = Field(None, description="Ready pods of the role's groups.")


class RoleAutoscalingStatus(Part):
    """One autoscaled role as the last scaling round saw it."""

    replicas: int = Field(description="The Deployment's replicas when the round ran.")
    desired_replicas: int = Field(description="What the round set (or, driver external, found).")
    recommended_replicas: int | None = Field(
        None, description="What the load alone asks for, within the bounds (before windows, steps, band)."
    )
    min_replicas: int = Field(description="spec's minReplicas.")
    max_replicas: int = Field(description="spec's maxReplicas.")
    reason: str = Field(description="Why desiredReplicas is what it is: one CamelCase word.", max_length=64)
    message: str = Field(description="The figures behind the reason.", max_length=1024)
    saturated: bool = Field(False, description="At maxReplicas and the load asks for more.")
    last_scale_time: str | None = Field(None, description="When pdwarden last changed the count (RFC 3339).")


def _is_none(value: Any) -> bool:
    return value is None


def _null_clears(description: str) -> Any:
    """A status field written as null when unset: the status is a JSON merge patch, whose null
    removes a value stored before (and a null inside a list entry is kept as null)."""
    return Field(None, description=description, json_schema_extra={"nullable": True})


def _absent_when_unset(description: str) -> Any:
    return Field(None, description=description, exclude_if=_is_none)


class _StatusPart(Part):
    """A part of the status the watchdog writes and reads back. Reading is tolerant of fields
    another version wrote (ignored); writing goes through these models, so nothing undeclared
    is written (the API server would prune it)."""

    model_config = ConfigDict(extra="ignore")


class BudgetStatus(_StatusPart):
    """The remediation budget: maxRemediations per window."""

    window_start: str | None = _null_clears("When the current window began (RFC 3339); null: none open.")
    used: int = Field(default=0, ge=0, description="Remediations charged to the window.")
    limit: int = Field(default=0, ge=0, description="spec.watchdog.maxRemediations.")
    exhausted: bool = Field(default=False, description="The window's budget is spent.")


class InFlightStatus(_StatusPart):
    """A remediation decided (its intent written first) and not yet known to be finished."""

    pod: str = Field(description="The pod acted on.")
    uid: str = Field(default="", description="That pod's UID (a pod of the same name later is another pod).")
    role: str = Field(description="prefill or decode.")
    action: WatchdogAction = Field(description="alert, restart, evict or drain.")
    started_at: str = Field(description="When the remediation was decided (RFC 3339).")
    remediation_id: int = Field(description="The status.remediations entry it updates.")
    reason: str = Field(default="", description="Why the pod was judged wedged.")
    attempts: int = Field(default=0, ge=0, description="Calls made so far (0: only the intent written).")
    last_outcome: str = Field(default="pending", description="The last call's outcome.")
    not_before: str | None = _null_clears("A 429's Retry-After: not tried again before then (RFC 3339).")
    quarantined_at: str | None = _absent_when_unset(
        "Drain: when the pod left its Deployment's selector (RFC 3339)."
    )


class FleetBrakeStatus(_StatusPart):
    """Whether a brake (the fleet's, or the model's namespace's) holds this model's remediations."""

    engaged: bool = Field(description="A brake holds every remediation of this model.")
    scope: str | None = _absent_when_unset("fleet or namespace (while engaged).")
    reason: str | None = _absent_when_unset("The counts that engaged it (while engaged).")


class WatchdogStatus(_StatusPart):
    """What the watchdog found and must remember across restarts."""

    last_scrape: str | None = _null_clears(
        "The last round (RFC 3339): written when a finding changes, alone at most once a minute."
    )
    wedged_pods: list[str] = Field(default_factory=list, description="Pods judged wedged now.")
    unobserved_pods: list[str] = Field(
        default_factory=list, description="Pods whose /metrics could not be scraped or parsed."
    )
    budget: BudgetStatus = Field(default_factory=BudgetStatus, description="The remediation budget.")
    budget_exhausted: bool | None = _absent_when_unset(
        "The budget is spent and the action is not alert (remediation held until the window ends)."
    )
    cooldown_until: dict[str, str] = Field(
        default_factory=dict, description="Per role, no new remediation before this time (RFC 3339)."
    )
    next_id: int = Field(default=1, ge=1, description="The id the next status.remediations entry gets.")
    in_flight: list[InFlightStatus] = Field(
        default_factory=list, description="Remediations decided and not finished (a restart resumes them)."
    )
    fleet_brake: FleetBrakeStatus | None = _absent_when_unset(
        "The brakes as this model's last round saw them."
    )


class RemediationPhase(_StatusPart):
    """One phase a drain went through."""

    phase: str = Field(description="The outcome the phase reached.")
    time: str = Field(description="When (RFC 3339).")


class RemediationStatus(_StatusPart):
    """One watchdog decision; `id` is stable for the entry's lifetime."""

    id: int = Field(description="Stable while the entry is kept.")
    pod: str = Field(description="The pod judged wedged.")
    role: str = Field(description="prefill or decode.")
    reason: str = Field(description="Why it was judged wedged.")
    action: str = Field(description="What the watchdog did, or would do (alert).")
    time: str = Field(description="When it was decided (RFC 3339).")
    outcome: str = Field(
        description="Where it stands: pending, deleted, evicted, quarantined, skipped-..., error."
    )
    phases: list[RemediationPhase] | None = _absent_when_unset("A drain's phases, each with its time.")


class AutoscalingStatus(Part):
    """The autoscaler's view: desired against current per role, and why."""

    prefill: RoleAutoscalingStatus | None = Field(None, description="Prefill, when it autoscales.")
    decode: RoleAutoscalingStatus | None = Field(None, description="Decode, when it autoscales.")
    ratio_kept: bool | None = Field(
        None, description="Whether prefill:decode is inside spec.prefillDecodeRatio (absent without a band)."
    )
    ratio_message: str | None = Field(None, description="Why the band cannot be kept.", max_length=1024)


class WorkerKeyStatus(Part):
    """Where the model's worker key stands."""

    state: Literal["Off", "On", "SwitchingOn", "SwitchingOff", "Rotating"] = Field(
        description="Off, On, or on the way: SwitchingOn, SwitchingOff, Rotating (one roll at a time)."
    )
    rotation: int | None = Field(None, description="The rotation of the key the router presents.")
    message: str | None = Field(
        None, description="On the way: who uses which key now, and what it waits for.", max_length=4096
    )

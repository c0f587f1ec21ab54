"""The DisaggregatedModel resource as pydantic models: the single source of the CRD schema
(`pdwarden crd`). This module is the resource's root: its spec (the rules across its parts),
its status, the rules on its metadata, and `parse_spec`; each part is a module of
`pdwarden_operator.resource` (`resource/rules.py`: how a rule is written once, for the API
server and for the operator). Every field has a description (it becomes `kubectl explain`
text), sensible defaults and bounds.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

import pdwarden_contract as contract
from pdwarden_operator.resource.autoscaling import RatioBand
from pdwarden_operator.resource.roles import RoleSpec
from pdwarden_operator.resource.router import RouterSpec
from pdwarden_operator.resource.rules import Part, Rule, cel
from pdwarden_operator.resource.status_parts import (
    MAX_REMEDIATIONS_KEPT,
    AutoscalingStatus,
    Condition,
    Phase,
    RemediationStatus,
    ReplicaStatus,
    WatchdogStatus,
    WorkerKeyStatus,
)
from pdwarden_operator.resource.tenancy import NetworkPolicySpec, WorkerKeySpec
from pdwarden_operator.resource.transfer import TransferSpec
from pdwarden_operator.resource.watchdog import WatchdogSpec
from pdwarden_operator.resource.weights import ModelRef

DEFAULT_IMAGE = "ghcr.io/pdwarden/pdwarden-runtime:0.1.0"
# Children are named `<name>-prefill` etc. and the name is a label value and a Service
# name, so it must be a DNS-1035 label short enough for the suffixes.
MAX_NAME_LENGTH = 40
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


def _nested(model: type[Part], description: str) -> Any:
    """A nested object field that defaults to the object with every field at its default.

    The schema's `default:` spells those defaults out, because the API server checks a default
    against the object's CEL rules before nested defaults would fill it in.
    """
    values = model.model_validate({}).model_dump(by_alias=True, exclude_none=True)
    return Field(
        default_factory=lambda: model.model_validate({}),
        description=description,
        json_schema_extra={"default": {k: v for k, v in values.items() if v != []}},
    )


# The remediation ladder's order, as the API server and the operator both word it.
LADDER_MESSAGE = (
    "watchdog.stuckAfterSeconds must exceed transfer.inflightDeadlineSeconds: the runtime's own "
    "deadline fails a stuck room first, the operator acts only when that self-heal did not"
)


KV_PAGES_PREFILL_MESSAGE = (
    "prefill.autoscaling.target.kvPagesInUse: KV pages in use are decode's signal; prefill "
    "scales on inflightPerPod or queueAgeSeconds"
)
QUEUE_AGE_DECODE_MESSAGE = (
    "decode.autoscaling.target.queueAgeSeconds: queue age is prefill's signal; decode scales on "
    "inflightPerPod or kvPagesInUse"
)
RATIO_WITHOUT_AUTOSCALING_MESSAGE = "prefillDecodeRatio needs autoscaling on prefill or decode"


class DisaggregatedModelSpec(Part):
    """Desired state: one model served by prefill and decode pods behind SGLang's router (smg)."""

    RULES = (
        Rule(
            "self.prefill.replicas == 0 || self.decode.replicas == 0 || self.router.replicas > 0",
            "router.replicas must be at least 1 when prefill and decode have replicas",
            lambda s: s.prefill.replicas == 0 or s.decode.replicas == 0 or s.router.replicas > 0,
            ".router.replicas",
        ),
        Rule(
            "self.watchdog.stuckAfterSeconds > self.transfer.inflightDeadlineSeconds",
            LADDER_MESSAGE,
            lambda s: s.watchdog.stuck_after_seconds > s.transfer.inflight_deadline_seconds,
            ".watchdog.stuckAfterSeconds",
        ),
        Rule(
            "!has(self.prefill.autoscaling) || !has(self.prefill.autoscaling.target) "
            "|| !has(self.prefill.autoscaling.target.kvPagesInUse)",
            KV_PAGES_PREFILL_MESSAGE,
            lambda s: s.prefill.autoscaling is None or s.prefill.autoscaling.target.kv_pages_in_use is None,
            ".prefill.autoscaling.target.kvPagesInUse",
        ),
        Rule(
            "!has(self.decode.autoscaling) || !has(self.decode.autoscaling.target) "
            "|| !has(self.decode.autoscaling.target.queueAgeSeconds)",
            QUEUE_AGE_DECODE_MESSAGE,
            lambda s: s.decode.autoscaling is None or s.decode.autoscaling.target.queue_age_seconds is None,
            ".decode.autoscaling.target.queueAgeSeconds",
        ),
        Rule(
            "!has(self.prefillDecodeRatio) || has(self.prefill.autoscaling) || has(self.decode.autoscaling)",
            RATIO_WITHOUT_AUTOSCALING_MESSAGE,
            lambda s: s.prefill_decode_ratio is None or bool(s.autoscaled_roles),
            ".prefillDecodeRatio",
        ),
    )

    model: ModelRef = Field(description="The model to serve.")
    image: str = Field(
        DEFAULT_IMAGE,
        description="Container image of the runtime pods (SGLang with pdwarden installed).",
        min_length=1,
        max_length=512,
    )
    engine: contract.Engine = Field(
        "sglang",
        description="sglang serves the model; synthetic is a CPU stand-in with the same HTTP and "
        "metrics surface (demos and tests).",
    )
    transfer: TransferSpec = _nested(TransferSpec, "KV transfer backend and self-heal deadlines.")
    prefill: RoleSpec = _nested(RoleSpec, "Prefill pods.")
    decode: RoleSpec = _nested(RoleSpec, "Decode pods.")
    router: RouterSpec = _nested(RouterSpec, "The router in front.")
    watchdog: WatchdogSpec = _nested(WatchdogSpec, "Wedge detection and remediation.")
    network_policy: NetworkPolicySpec = _nested(NetworkPolicySpec, "An optional NetworkPolicy.")
    worker_key: WorkerKeySpec = _nested(WorkerKeySpec, "The key between the router and the workers.")
    prefill_decode_ratio: RatioBand | None = Field(
        None,
        description="Prefill pods per decode pod to keep while autoscaling: when one role scales, "
        "the other follows as far as its bounds allow (status and an Event say when it cannot).",
    )

    @property
    def autoscaled_roles(self) -> tuple[str, ...]:
        """The runtime roles with `autoscaling` set."""
        return tuple(r for r in contract.RUNTIME_ROLES if self.role(r).autoscaling is not None)

    def role(self, role: str) -> RoleSpec:
        if role == contract.ROLE_PREFILL:
            return self.prefill
        if role == contract.ROLE_DECODE:
            return self.decode
        raise ValueError(f"unknown runtime role {role!r}")


class DisaggregatedModelStatus(Part):
    """Observed state, written by the operator."""

    model_config = ConfigDict(extra="allow")

    observed_generation: int | None = Field(None, description="The .metadata.generation last reconciled.")
    phase: Phase | None = Field(None, description="Pending, Progressing, Ready or Degraded.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Progressing, Degraded, Wedged and FleetBrake.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    prefill: ReplicaStatus | None = Field(None, description="Prefill replicas (pods, or groups).")
    decode: ReplicaStatus | None = Field(None, description="Decode replicas (pods, or groups).")
    router: ReplicaStatus | None = Field(None, description="Router Deployment replicas.")
    watchdog: WatchdogStatus | None = Field(
        None, description="The watchdog's findings and state. Absent until a runtime pod is Ready."
    )
    autoscaling: AutoscalingStatus | None = Field(
        None, description="Autoscaled roles: desired against current replicas, and why."
    )
    worker_key: WorkerKeyStatus | None = Field(
        None, description="The worker key: on, off, or moving (switched on or off, rotated)."
    )
    remediations: list[RemediationStatus] | None = Field(
        None, description="The last remediations, oldest first.", max_length=MAX_REMEDIATIONS_KEPT
    )


# Root-level rules (they may read metadata.name).
ROOT_RULES = [
    cel(
        f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
        f"metadata.name must be at most {MAX_NAME_LENGTH} characters (children append -prefill etc.)",
    ),
    cel(
        f"self.metadata.name.matches('{NAME_PATTERN}')",
        "metadata.name must be a DNS-1035 label (lowercase letters, digits, '-', starting with a letter)",
    ),
]


def parse_spec(spec: dict[str, Any]) -> DisaggregatedModelSpec:
    """Validate a resource's spec (raises pydantic.ValidationError with field paths)."""
    return DisaggregatedModelSpec.model_validate(spec)

"""How pdwarden scales a role on its pods' load: bounds, the target load per pod, how fast each
direction may go, and the prefill:decode band kept while scaling."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pdwarden_operator.resource.rules import Part, Rule


class ScalePolicy(Part):
    """How fast one direction of scaling may go."""

    stabilization_seconds: int = Field(
        description="Look-back window: scaling up takes the lowest recommendation of the window, "
        "scaling down the highest, so a brief spike or lull moves nothing.",
        ge=0,
        le=3600,
    )
    max_step: int = Field(description="Pods added (or removed) at most per periodSeconds.", ge=1, le=64)
    period_seconds: int = Field(description="The period maxStep counts over.", ge=1, le=3600)


class AutoscalingTarget(Part):
    """The load one pod should carry; the role scales so that the mean over its ready, unwedged
    pods meets every target set (the highest ratio decides). A wedged pod's queue is not demand:
    the watchdog remediates it."""

    RULES = (
        Rule(
            "has(self.inflightPerPod) || has(self.queueAgeSeconds) || has(self.kvPagesInUse)",
            "set at least one of inflightPerPod, queueAgeSeconds and kvPagesInUse",
            lambda t: any(
                x is not None for x in (t.inflight_per_pod, t.queue_age_seconds, t.kv_pages_in_use)
            ),
        ),
    )

    inflight_per_pod: float | None = Field(
        None,
        description="Requests in flight per pod (rooms between arrival and the end of their KV "
        "transfer): the load of either role.",
        gt=0,
        le=100000,
    )
    queue_age_seconds: float | None = Field(
        None,
        description="Prefill only: age of each pod's oldest request in flight, in seconds (how long "
        "a new request waits for prefill).",
        gt=0,
        le=3600,
    )
    kv_pages_in_use: float | None = Field(
        None,
        description="Decode only: KV-cache pages in use per pod (the runtime's pdwarden_kv_pages_in_use).",
        gt=0,
        le=1e9,
    )


def _policy(stabilization: int, step: int, period: int, description: str) -> Any:
    values: dict[str, Any] = {"stabilizationSeconds": stabilization, "maxStep": step, "periodSeconds": period}
    return Field(
        default_factory=lambda: ScalePolicy.model_validate(values),
        description=f"{description} Default: " + ", ".join(f"{k} {v}" for k, v in values.items()) + ".",
        json_schema_extra={"default": values},
    )


class AutoscalingSpec(Part):
    """pdwarden scales the role between minReplicas and maxReplicas on its pods' load (or lets an
    autoscaler of yours drive the role's Deployment through its scale subresource)."""

    RULES = (
        Rule(
            "self.minReplicas <= self.maxReplicas",
            "minReplicas must not exceed maxReplicas",
            lambda a: a.min_replicas <= a.max_replicas,
            ".minReplicas",
        ),
    )

    min_replicas: int = Field(1, description="Fewest pods.", ge=1, le=512)
    max_replicas: int = Field(description="Most pods.", ge=1, le=512)
    driver: Literal["pdwarden", "external"] = Field(
        "pdwarden",
        description="pdwarden: the operator scales on `target`. external: an autoscaler of yours "
        "(HorizontalPodAutoscaler, KEDA) sets the Deployment's scale; pdwarden keeps it within "
        "[minReplicas, maxReplicas] and never reverts it.",
    )
    target: AutoscalingTarget = Field(
        default_factory=lambda: AutoscalingTarget.model_validate({"inflightPerPod": 8}),
        description="The load per pod to scale for. Default: {inflightPerPod: 8}.",
        json_schema_extra={"default": {"inflightPerPod": 8}},
    )
    scale_up: ScalePolicy = _policy(30, 2, 60, "How fast pods are added.")
    scale_down: ScalePolicy = _policy(300, 1, 120, "How fast pods are removed (each drains first).")


class RatioBand(Part):
    """Prefill pods per decode pod, kept inside [min, max] whenever replicas change."""

    RULES = (Rule("self.min <= self.max", "min must not exceed max", lambda b: b.min <= b.max, ".min"),)

    min: float = Field(description="Fewest prefill pods per decode pod, e.g. 0.5.", gt=0, le=64)
    max: float = Field(description="Most prefill pods per decode pod, e.g. 2.", gt=0, le=64)

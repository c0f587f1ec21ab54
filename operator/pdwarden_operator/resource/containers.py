"""What a role's container gets besides its command: CPU and memory, extra environment, and
the user's pod template fragment (the merge and the fields pdwarden owns: podtemplate.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, Field, WithJsonSchema

from pdwarden_operator import podtemplate
from pdwarden_operator.resource.rules import Part, ResourceMap, Rule

GPU_RESOURCE = "nvidia.com/gpu"
# Env vars the operator sets itself on runtime pods; a user may not override them.
RESERVED_ENV = podtemplate.RESERVED_ENV


def _no_gpus_in(part: str) -> Callable[[Any], bool]:
    return lambda resources: GPU_RESOURCE not in (getattr(resources, part) or {})


class ResourceRequirements(Part):
    """CPU and memory for each pod of a role. GPUs are set with the role's `gpus` field."""

    RULES = tuple(
        Rule(
            f"!has(self.{part}) || !('{GPU_RESOURCE}' in self.{part})",
            f"do not set {GPU_RESOURCE} here: use the role's `gpus` field",
            _no_gpus_in(part),
            f".{part}",
        )
        for part in ("requests", "limits")
    )

    requests: ResourceMap | None = Field(
        None, description="Minimum resources per pod, e.g. {cpu: 4, memory: 32Gi}."
    )
    limits: ResourceMap | None = Field(None, description="Maximum resources per pod, e.g. {memory: 64Gi}.")


class EnvVar(Part):
    """An environment variable for the role's container."""

    RULES = (
        Rule(
            "has(self.value) != has(self.valueFrom)",
            "exactly one of value and valueFrom must be set",
            lambda e: (e.value is None) != (e.value_from is None),
        ),
        Rule(
            "!(self.name in " + str(list(RESERVED_ENV)).replace("'", '"') + ")",
            "this variable is set by pdwarden and cannot be overridden",
            lambda e: e.name not in RESERVED_ENV,
            ".name",
        ),
    )

    name: str = Field(
        description="Variable name.",
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$",
    )
    value: str | None = Field(None, description="Literal value.", max_length=32768)
    value_from: dict[str, Any] | None = Field(
        None,
        description="Source of the value, as in a Pod's env[].valueFrom "
        "(secretKeyRef, configMapKeyRef, fieldRef).",
    )


def _no_owned_fields(main: str) -> Any:
    def check(value: dict[str, Any]) -> dict[str, Any]:
        problems = podtemplate.owned_violations(value, main)
        if problems:
            raise ValueError("; ".join(problems))
        return value

    return AfterValidator(check)


# A PodTemplateSpec fragment (see podtemplate.py: the merge and the fields pdwarden owns).
RuntimePodTemplate = Annotated[
    dict[str, Any],
    _no_owned_fields(podtemplate.RUNTIME_CONTAINER),
    WithJsonSchema(podtemplate.schema(podtemplate.RUNTIME_CONTAINER)),
]
RouterPodTemplate = Annotated[
    dict[str, Any],
    _no_owned_fields(podtemplate.ROUTER_CONTAINER),
    WithJsonSchema(podtemplate.schema(podtemplate.ROUTER_CONTAINER)),
]

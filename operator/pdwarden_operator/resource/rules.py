"""How a field and a rule of the resource are written once for two readers: the API server
(the CRD's schema, CEL in `x-kubernetes-validations`, enforced at `kubectl apply`) and the
operator (the same check on the parsed model, enforced again when it reads a body, so an object
stored under an older CRD still fails, with the message the API server would give).

Field names are camelCase on the wire (aliases) and snake_case in Python.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One `x-kubernetes-validations` entry."""
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def _rules(*entries: dict[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(entries)}


@dataclass(frozen=True)
class Rule:
    """A rule across a model's fields, once: `cel` for the API server (over the object as the
    wire has it), `holds` for the operator (over the parsed model), one message for both."""

    cel: str
    message: str
    holds: Callable[[Any], bool]
    field_path: str | None = None  # where the API server reports a break, e.g. ".minReplicas"


def _schema_rules(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """A model's `RULES` in its schema, as x-kubernetes-validations."""
    rules: tuple[Rule, ...] = getattr(model, "RULES", ())
    if rules:
        schema["x-kubernetes-validations"] = [cel(r.cel, r.message, r.field_path) for r in rules]


class Part(BaseModel):
    """A part of the resource: camelCase on the wire, no field it does not declare, immutable,
    and its `RULES` hold once parsed."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        json_schema_extra=_schema_rules,
    )
    RULES: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _rules_hold(self) -> Self:
        broken = [rule.message for rule in self.RULES if not rule.holds(self)]
        if broken:
            raise ValueError("; ".join(broken))
        return self


# Kubernetes quantity syntax (resource.Quantity): a number and an SI, binary or exponent suffix.
_QUANTITY = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$")


def _check_quantity(value: int | str) -> int | str:
    if isinstance(value, str) and not _QUANTITY.match(value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 500m, 4Gi, 2)")
    return value


# A Kubernetes quantity ("500m", "4Gi", 2): an int-or-string in the schema.
Quantity = Annotated[
    int | str,
    AfterValidator(_check_quantity),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "description": "A Kubernetes quantity, e.g. 500m, 4Gi or 2.",
        }
    ),
]

# For a lone Quantity field (the schema's int-or-string accepts any string).
QUANTITY_RULE = _rules(cel("isQuantity(string(self))", "must be a Kubernetes quantity (e.g. 16Gi)"))

ResourceMap = Annotated[
    dict[str, Quantity],
    Field(
        max_length=8,  # bounds the CEL cost of the quantity rule
        json_schema_extra=_rules(
            cel("self.all(k, isQuantity(string(self[k])))", "every value must be a Kubernetes quantity"),
        ),
    ),
]

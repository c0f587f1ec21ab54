"""What a reconcile pass reads before it decides anything (`Observation`, built by `observe.py`,
read by the pure `planner.py`). Data only: no I/O, nothing from `pdwarden_operator.kube`."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from pdwarden_operator.models import DisaggregatedModelSpec
from pdwarden_operator.render.meta import Obj, Owner


@dataclass(frozen=True)
class Observation:
    """What a pass reads before it decides anything; the planner only reads it."""

    body: Mapping[str, Any]
    spec: DisaggregatedModelSpec
    # the model as its children see it: who uses its worker key, the autoscaled roles' counts
    owner: Owner
    children: Mapping[tuple[str, str], Obj]  # what the watches hold (ours for sure)
    settled_before: Hashable | None  # the last pass's `PassResult.settled`
    # the status writer's last observation says the API server refused this generation's children
    refused_before: bool


def generation(body: Mapping[str, Any]) -> int:
    """The model's `metadata.generation` (0 before the API server set one)."""
    return int(body["metadata"].get("generation") or 0)

"""A reconcile pass's decision, pure (no I/O, nothing from `pdwarden_operator.kube`: a unit test
reads this module's imports): from an `Observation` to a `PassPlan`, by rendering the children
and comparing them with what the watches hold, unless nothing anyone edits moved since the
render last matched."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from pdwarden_operator import plan
from pdwarden_operator.reconcile.observation import Observation, generation
from pdwarden_operator.render.children import render_children
from pdwarden_operator.render.meta import Obj, Owner


@dataclass(frozen=True)
class PassPlan:
    """What a pass is to do, from its observation alone (`plan_pass`)."""

    settled: Hashable  # the observation's `plan.settled_key`
    desired: tuple[Obj, ...] | None  # the render; None: the settled key matched, nothing rendered
    apply: tuple[Obj, ...]  # missing, changed by hand, or rendered differently (`plan.to_apply`)
    delete: tuple[Obj, ...]  # of an optional kind the spec no longer asks for (`plan.to_delete`)


def plan_pass(obs: Observation) -> PassPlan:
    """Render and compare, unless nothing anyone edits moved since render last matched."""
    settled = plan.settled_key(render_inputs(obs.body, obs.owner), obs.children)
    if settled == obs.settled_before:
        return PassPlan(settled, None, (), ())
    desired = plan.stamped(render_children(obs.owner, obs.spec))
    return PassPlan(
        settled,
        tuple(desired),
        tuple(plan.to_apply(desired, obs.children)),
        tuple(plan.to_delete(desired, obs.children)),
    )


def render_inputs(body: Mapping[str, Any], owner: Owner) -> Hashable:
    """What of the model its children render from, besides the children themselves."""
    return (
        owner.uid,
        generation(body),
        tuple(sorted(owner.annotations.items())),
        repr(owner.worker_key),
        tuple(sorted(owner.deployed.items())),
    )

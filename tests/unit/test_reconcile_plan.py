"""reconcile's planner (`plan_pass`), pure: from a frozen observation of a model and the children
the watches hold to what a pass applies and deletes, table by table."""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Any

import pytest

from pdwarden_operator import plan
from pdwarden_operator.models import parse_spec
from pdwarden_operator.reconcile.observation import Observation
from pdwarden_operator.reconcile.planner import plan_pass
from pdwarden_operator.render.children import child_key, render_children
from pdwarden_operator.render.meta import Owner
from pdwarden_operator.worker_key_secret import KeyUse

pytestmark = pytest.mark.unit

Obj = dict[str, Any]
Children = dict[tuple[str, str], Obj]
UID = "6f1c2d3e-0000-4000-8000-000000000001"
SPEC: dict[str, Any] = {"model": {"path": "m"}}
BODY: Obj = {"metadata": {"namespace": "ns1", "name": "m1", "uid": UID, "generation": 1}, "spec": SPEC}
OWNER = replace(Owner.from_body(BODY), worker_key=KeyUse.final("m1-worker-key-x7k2p"))


def _observation(children: Children, settled_before: Hashable | None = None, body: Obj = BODY) -> Observation:
    return Observation(body, parse_spec(SPEC), OWNER, children, settled_before, refused_before=False)


def _cluster() -> Children:
    """The children as a pass that applied the render left them."""
    return {child_key(o): o for o in plan.stamped(render_children(OWNER, parse_spec(SPEC)))}


def _with(children: Children, key: tuple[str, str], edit: Callable[[Obj], None]) -> Children:
    out = copy.deepcopy(children)
    edit(out[key])
    return out


def _leftover(kind: str, api_version: str) -> Children:
    """The render's children and one more of `kind`, the model's, that the spec no longer asks for."""
    extra = copy.deepcopy(next(o for o in _cluster().values() if o["kind"] == "Service"))
    extra.update(apiVersion=api_version, kind=kind)
    extra["metadata"]["name"] = "m1-dropped"
    return {**_cluster(), (kind, "m1-dropped"): extra}


def _scale_prefill(obj: Obj) -> None:
    obj["spec"]["replicas"] = 7


ALL = sorted(_cluster())
PREFILL = ("Deployment", "m1-prefill")

# (observed children, settled_before, body) -> (rendered?, children applied, children deleted)
CASES: dict[str, tuple[Children, bool, Obj, bool, list[tuple[str, str]], list[tuple[str, str]]]] = {
    "new model: everything applied": ({}, False, BODY, True, ALL, []),
    "in sync: nothing to do": (_cluster(), False, BODY, True, [], []),
    "settled: not even rendered": (_cluster(), True, BODY, False, [], []),
    "changed by hand: that child alone": (
        _with(_cluster(), PREFILL, _scale_prefill),
        False,
        BODY,
        True,
        [PREFILL],
        [],
    ),
    "dropped by the spec, an optional kind: deleted": (
        _leftover("Service", "v1"),
        False,
        BODY,
        True,
        [],
        [("Service", "m1-dropped")],
    ),
    "dropped by the spec, a kind always rendered: left": (
        _leftover("ServiceAccount", "v1"),
        False,
        BODY,
        True,
        [],
        [],
    ),
    "settled before, a new generation since: rendered again": (
        _cluster(),
        True,
        {**BODY, "metadata": {**BODY["metadata"], "generation": 2}},
        True,
        [],
        [],
    ),
}


@pytest.mark.parametrize(
    ("children", "was_settled", "body", "rendered", "applied", "deleted"), CASES.values(), ids=CASES.keys()
)
def test_the_planner_applies_what_differs_and_deletes_what_the_spec_dropped(
    children: Children,
    was_settled: bool,
    body: Obj,
    rendered: bool,
    applied: list[tuple[str, str]],
    deleted: list[tuple[str, str]],
) -> None:
    # the settled key a pass over these children at generation 1 left behind
    settled_before = plan_pass(_observation(children)).settled if was_settled else None
    decided = plan_pass(_observation(children, settled_before, body))
    assert (decided.desired is not None) is rendered
    assert sorted(child_key(o) for o in decided.apply) == applied
    assert sorted(child_key(o) for o in decided.delete) == deleted
    assert decided == plan_pass(_observation(children, settled_before, body)), "pure: the same plan again"


def test_a_settled_plan_names_the_children_it_depends_on() -> None:
    """The settled key moves with any child anyone edits, so an edit is never skipped."""
    before = plan_pass(_observation(_cluster())).settled
    edited = _with(_cluster(), PREFILL, lambda o: o["metadata"].setdefault("labels", {}).update(x="y"))
    assert plan_pass(_observation(edited)).settled != before

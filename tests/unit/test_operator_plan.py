"""Drift detection: which rendered children differ from what the cluster holds."""

from __future__ import annotations

import copy

import pytest

import pdwarden_contract as contract
from pdwarden_operator.models import parse_spec
from pdwarden_operator.plan import (
    apply_waves,
    covers,
    rendered_digest,
    settled_key,
    stamped,
    to_apply,
)
from pdwarden_operator.render.children import child_key, render_children
from pdwarden_operator.render.kinds import POD_MAKING_KINDS
from pdwarden_operator.render.meta import Owner

pytestmark = pytest.mark.unit


def _children() -> list[dict]:
    owner = Owner(name="m", namespace="ns", uid="u1")
    return render_children(owner, parse_spec({"model": {"path": "p"}, "engine": "synthetic"}))


def _as_server_returns(obj: dict) -> dict:
    """What the API server hands back: our fields plus defaults and bookkeeping."""
    out = copy.deepcopy(obj)
    out["metadata"]["uid"] = "x"
    out["metadata"]["resourceVersion"] = "12"
    if obj["kind"] == "Deployment":
        out["spec"]["strategy"] = {"type": "RollingUpdate"}
        c = out["spec"]["template"]["spec"]["containers"][0]
        c["terminationMessagePath"] = "/dev/termination-log"
        c["readinessProbe"]["httpGet"]["scheme"] = "HTTP"
        c["env"][0]["valueFrom"]["fieldRef"]["apiVersion"] = "v1"
        out["status"] = {"replicas": 1}
    return out


def test_nothing_to_apply_when_the_cluster_matches() -> None:
    desired = _children()
    observed = {child_key(o): _as_server_returns(o) for o in desired}
    assert to_apply(desired, observed) == []


def _render(**spec: object) -> list[dict]:
    owner = Owner(name="m", namespace="ns", uid="u1")
    parsed = parse_spec({"model": {"path": "p"}, "engine": "synthetic", **spec})
    return stamped(render_children(owner, parsed))


def test_a_field_the_spec_no_longer_renders_is_applied_away() -> None:
    # `covers` alone cannot see a removal: the cluster still holds every value now rendered
    before = _render(prefill={"args": ["--one"]}, decode={"env": [{"name": "A", "value": "1"}]})
    after = _render(prefill={"args": ["--one"]})
    observed = {child_key(o): _as_server_returns(o) for o in before}
    decode = {k: v for k, v in after[1].items() if k != "metadata"}
    assert covers(observed[("Deployment", "m-decode")], decode)
    assert [child_key(o) for o in to_apply(after, observed)] == [("Deployment", "m-decode")]
    assert to_apply(before, observed) == []


def test_the_digest_ignores_itself_and_the_count_and_nothing_else() -> None:
    (child,) = [o for o in _render() if child_key(o) == ("Deployment", "m-prefill")]
    assert child["metadata"]["annotations"][contract.ANNOTATION_RENDERED_DIGEST] == rendered_digest(child)
    scaled = {**child, "spec": {**child["spec"], "replicas": 9}}
    assert rendered_digest(scaled) == rendered_digest(child)  # an autoscaled count moves on its own
    labelled = {**child, "metadata": {**child["metadata"], "labels": {"x": "y"}}}
    assert rendered_digest(labelled) != rendered_digest(child)
    assert stamped([child]) == [child]  # stamping twice changes nothing


def test_missing_child_is_applied() -> None:
    desired = _children()
    observed = {child_key(o): _as_server_returns(o) for o in desired}
    del observed[("Service", "m-router")]
    assert [child_key(o) for o in to_apply(desired, observed)] == [("Service", "m-router")]


def test_hand_edited_child_is_applied() -> None:
    desired = _children()
    observed = {child_key(o): _as_server_returns(o) for o in desired}
    observed[("Deployment", "m-decode")]["spec"]["replicas"] = 7
    observed[("Deployment", "m-prefill")]["spec"]["template"]["spec"]["containers"][0]["command"][-1] = "999"
    assert sorted(child_key(o) for o in to_apply(desired, observed)) == [
        ("Deployment", "m-decode"),
        ("Deployment", "m-prefill"),
    ]


def test_extra_named_items_owned_by_others_are_not_drift() -> None:
    desired = {"env": [{"name": "A", "value": "1"}]}
    assert covers({"env": [{"name": "B", "value": "2"}, {"name": "A", "value": "1"}]}, desired)
    assert not covers({"env": [{"name": "A", "value": "2"}]}, desired)
    assert not covers({"args": ["a", "b", "c"]}, {"args": ["a", "b"]}), "plain lists compare exactly"


@pytest.mark.parametrize("nodes", [1, 2])
def test_what_pods_depend_on_is_applied_before_what_makes_pods(nodes: int) -> None:
    owner = Owner(name="m", namespace="ns", uid="u1")
    spec = parse_spec(
        {
            "model": {"path": "p"},
            "engine": "synthetic",
            "prefill": {"nodesPerReplica": nodes, "tensorParallel": nodes, "gpus": 1},
        }
    )
    children = render_children(owner, spec)
    first, then = apply_waves(children)
    assert sorted(map(child_key, first + then)) == sorted(map(child_key, children))  # nothing lost
    assert then and {o["kind"] for o in then} <= POD_MAKING_KINDS
    assert not {o["kind"] for o in first} & POD_MAKING_KINDS
    accounts = {o["metadata"]["name"] for o in first if o["kind"] == "ServiceAccount"}
    for maker in then:
        # every pod's ServiceAccount exists before the pod is made (else the pod is refused)
        assert maker["spec"]["template"]["spec"]["serviceAccountName"] in accounts, child_key(maker)
    assert any(o["kind"] == "NetworkPolicy" for o in first)


def _settled(observed: dict) -> object:
    return settled_key(("uid", 1), observed)


def test_a_status_update_leaves_the_settled_key_and_an_edit_moves_it() -> None:
    observed = {child_key(o): _as_server_returns(o) for o in _children()}
    for obj in observed.values():
        obj["metadata"]["generation"] = 1
    before = _settled(observed)
    status = copy.deepcopy(observed)
    status[("Deployment", "m-decode")]["metadata"]["resourceVersion"] = "13"
    status[("Deployment", "m-decode")]["status"] = {"replicas": 2, "readyReplicas": 2}
    assert _settled(status) == before  # a controller's status write: nothing of ours moved
    revision = copy.deepcopy(observed)
    revision[("Deployment", "m-decode")]["metadata"].setdefault("annotations", {})[
        "deployment.kubernetes.io/revision"
    ] = "1"
    assert _settled(revision) == before  # nor its revision, which no render sets
    spec_edit = copy.deepcopy(observed)
    spec_edit[("Deployment", "m-decode")]["metadata"]["generation"] = 2
    label_edit = copy.deepcopy(observed)
    label_edit[("Deployment", "m-decode")]["metadata"]["labels"]["extra"] = "x"
    gone = copy.deepcopy(observed)
    del gone[("Service", "m-router")]
    for changed in (spec_edit, label_edit, gone):
        assert _settled(changed) != before
    assert settled_key(("uid", 2), observed) != before  # the model's own inputs count

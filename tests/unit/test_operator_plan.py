"""Drift detection: which rendered children differ from what the cluster holds."""

from __future__ import annotations

import copy

import pytest

from pdwarden_operator.models import parse_spec
from pdwarden_operator.plan import POD_MAKERS, apply_waves, covers, to_apply
from pdwarden_operator.render import Owner, child_key, render_children

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
    assert then and {o["kind"] for o in then} <= POD_MAKERS
    assert not {o["kind"] for o in first} & POD_MAKERS
    accounts = {o["metadata"]["name"] for o in first if o["kind"] == "ServiceAccount"}
    for maker in then:
        # every pod's ServiceAccount exists before the pod is made (else the pod is refused)
        assert maker["spec"]["template"]["spec"]["serviceAccountName"] in accounts, child_key(maker)
    assert any(o["kind"] == "NetworkPolicy" for o in first)

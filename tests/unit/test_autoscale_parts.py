"""Autoscaling's pure parts besides the planner: the count a role renders (`replicas`), the
spec's rules, the pod a scale-in removes, a pod's load from its scrape, the runtime's pages
in use through the parser, and the status heartbeat."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

import pdwarden_contract as contract
from pdwarden_operator import replicas
from pdwarden_operator.models import parse_spec
from pdwarden_operator.render.children import render_children
from pdwarden_operator.render.meta import Owner
from pdwarden_operator.status import Observed, Workload, compose
from pdwarden_operator.watchdog.parse import PodSample, parse_metrics
from pdwarden_operator.watchdog.scaler import RolePod, driven_roles, pod_load, scale_in_victim
from pdwarden_operator.watchdog.state import status_write_due
from pdwarden_operator.watchdog.verdict import PodView, Verdict
from pdwarden_runtime.kvpoll import KVPoll
from tests.support.runtime_metrics import runtime

pytestmark = pytest.mark.unit


def spec(**roles: Any) -> Any:
    body: dict[str, Any] = {"model": {"path": "synthetic/tiny"}, "engine": "synthetic", **roles}
    return parse_spec(body)


AUTOSCALED = {"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}}


@pytest.mark.parametrize(
    ("role", "deployed", "expect"),
    [
        ({"replicas": 3}, None, 3),
        ({"replicas": 3}, 7, 3),  # a fixed role: the spec wins over a hand-scaled Deployment
        (AUTOSCALED, None, 2),  # the first count is the spec's
        (AUTOSCALED, 3, 3),  # then the Deployment's
        (AUTOSCALED, 9, 4),  # within the bounds
        (AUTOSCALED, 0, 1),
        ({"replicas": 9, "autoscaling": {"minReplicas": 2, "maxReplicas": 5}}, None, 5),
    ],
)
def test_the_count_in_effect(role: dict[str, Any], deployed: int | None, expect: int) -> None:
    assert replicas.in_effect(spec(prefill=role).prefill, deployed) == expect


def test_a_deployments_count_is_read_only_when_it_is_an_integer() -> None:
    assert replicas.deployed({"spec": {"replicas": 3}}) == 3
    assert replicas.deployed({"spec": {"replicas": True}}) is None
    assert replicas.deployed({"spec": {}}) is None
    assert replicas.deployed(None) is None


def test_the_rendered_deployment_carries_the_deployed_count() -> None:
    s = spec(prefill=AUTOSCALED, decode={"replicas": 1})
    owner = Owner(name="m", namespace="ns", uid="u", deployed={"prefill": 3, "decode": 5})
    counts = {
        o["metadata"]["name"]: o["spec"]["replicas"]
        for o in render_children(owner, s)
        if o["kind"] == "Deployment"
    }
    assert counts == {"m-prefill": 3, "m-decode": 1, "m-router": 1}


def test_status_counts_an_autoscaled_role_as_its_deployment_holds_it() -> None:
    s = spec(prefill=AUTOSCALED)
    w = Workload(present=True, spec_replicas=3, replicas=3, ready=3, updated=3, up_to_date=True)
    status = compose(s, Observed(1, workloads={"prefill": w}), None, {})
    assert status["prefill"]["replicas"] == 3 and status["prefill"]["summary"] == "3/3"


@pytest.mark.parametrize(
    ("roles", "field"),
    [
        ({"prefill": {"autoscaling": {"minReplicas": 3, "maxReplicas": 2}}}, "minReplicas must not exceed"),
        (
            {"decode": {"nodesPerReplica": 2, "tensorParallel": 2, "autoscaling": {"maxReplicas": 2}}},
            "single-pod replicas",
        ),
        ({"prefill": {"autoscaling": {"maxReplicas": 2, "target": {"kvPagesInUse": 9}}}}, "decode's signal"),
        (
            {"decode": {"autoscaling": {"maxReplicas": 2, "target": {"queueAgeSeconds": 9}}}},
            "prefill's signal",
        ),
        ({"prefill": {"autoscaling": {"maxReplicas": 2, "target": {}}}}, "at least one of"),
        ({"prefillDecodeRatio": {"min": 1, "max": 2}}, "needs autoscaling"),
        ({"prefill": AUTOSCALED, "prefillDecodeRatio": {"min": 2, "max": 1}}, "min must not exceed max"),
        ({"prefill": {"autoscaling": {"maxReplicas": 2, "scaleUp": {"maxStep": 0}}}}, "scaleUp"),
    ],
)
def test_the_spec_refuses_autoscaling_it_cannot_do(roles: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        spec(**roles)
    assert field in str(info.value)


def test_the_planner_sees_the_specs_policies() -> None:
    s = spec(
        prefill={
            "autoscaling": {
                "maxReplicas": 6,
                "scaleDown": {"stabilizationSeconds": 5, "maxStep": 2, "periodSeconds": 7},
            }
        }
    )
    assert s.prefill.autoscaling is not None
    scaling = driven_roles(s)["prefill"]
    assert (scaling.min_replicas, scaling.max_replicas, scaling.target.inflight_per_pod) == (1, 6, 8.0)
    assert (scaling.scale_down.stabilization_seconds, scaling.scale_down.max_step) == (5.0, 2)
    assert scaling.scale_up.stabilization_seconds == 30.0  # the default
    assert s.autoscaled_roles == ("prefill",)


def role_pod(
    name: str,
    inflight: float = 0.0,
    transferring: float | None = 0.0,
    *,
    ready: bool = True,
    terminating: bool = False,
    state: str = "ok",
    sample: bool = True,
) -> RolePod:
    view = PodView(name=name, uid=f"uid-{name}", role="prefill", ready=ready, terminating=terminating)
    s = PodSample(
        inflight=inflight, oldest_age=1.5, transfers=0.0, pages_in_use=12.0, transferring=transferring
    )
    return RolePod(view, Verdict(state, ""), s if sample else None, {})  # type: ignore[arg-type]


def test_a_scale_in_removes_the_least_loaded_pod() -> None:
    victim, why = scale_in_victim([role_pod("a", 5), role_pod("b", 1), role_pod("c", 3)])
    assert victim is not None and victim.view.name == "b" and why == ""


def test_a_scale_in_prefers_a_pod_moving_no_kv_and_waits_when_all_are() -> None:
    victim, _ = scale_in_victim([role_pod("a", 1, transferring=1), role_pod("b", 4, transferring=0)])
    assert victim is not None and victim.view.name == "b"
    none, why = scale_in_victim([role_pod("a", 1, transferring=1), role_pod("b", 4, transferring=2)])
    assert none is None and "moving KV" in why


@pytest.mark.parametrize(
    "odd",
    [
        role_pod("x", ready=False),  # starting: the ReplicaSet would remove it instead
        role_pod("x", terminating=True),  # the previous scale-in's pod still drains
    ],
)
def test_a_scale_in_waits_while_a_pod_starts_or_leaves(odd: RolePod) -> None:
    victim, why = scale_in_victim([role_pod("a"), odd])
    assert victim is None and "x" in why


def test_a_scale_in_never_removes_a_troubled_or_unscraped_pod() -> None:
    victim, _ = scale_in_victim(
        [role_pod("a", 0, state="wedged"), role_pod("b", 0, sample=False), role_pod("c", 9)]
    )
    assert victim is not None and victim.view.name == "c"
    none, why = scale_in_victim([role_pod("a", 0, state="unobserved")])
    assert none is None and "no healthy pod" in why


def test_a_pods_load_is_its_last_sample_and_a_troubled_pods_is_no_demand() -> None:
    load = pod_load(role_pod("a", 6, transferring=2))
    assert (load.ready, load.wedged, load.inflight, load.queue_age, load.pages_in_use, load.transferring) == (
        True,
        False,
        6,
        1.5,
        12.0,
        2,
    )
    assert pod_load(role_pod("a", 6, state="wedged")).wedged
    assert not pod_load(role_pod("a", sample=False)).ready


def test_the_runtime_exports_pages_in_use_and_rooms_moving_kv() -> None:
    _, table, _, metrics = runtime(contract.ROLE_DECODE)
    assert parse_metrics(metrics.exposition()[0]).pages_in_use is None  # the engine says nothing
    used = [40]
    metrics._state._pages_in_use = lambda: used[0]  # the synthetic engine's pool count
    table.open(1, KVPoll.Bootstrapping)
    table.update(1, KVPoll.Transferring)
    table.open(2, KVPoll.Bootstrapping)
    sample = parse_metrics(metrics.exposition()[0])
    assert (sample.pages_in_use, sample.transferring, sample.inflight) == (40, 1, 2)


def test_an_autoscaled_roles_changing_figures_wait_for_the_heartbeat() -> None:
    part: dict[str, Any] = {
        "prefill": {"replicas": 2, "desiredReplicas": 2, "reason": "WithinTolerance", "message": "load 1.01x"}
    }
    written = {"watchdog": {"lastScrape": "t1"}, "autoscaling": part}
    figures = {
        "autoscaling": {"prefill": {**part["prefill"], "message": "load 1.04x"}},
        "watchdog": {"lastScrape": "t2"},
    }
    assert not status_write_due(written, 100.0, figures, 110.0)
    moved = {
        "autoscaling": {"prefill": {**part["prefill"], "desiredReplicas": 3}},
        "watchdog": {"lastScrape": "t2"},
    }
    assert status_write_due(written, 100.0, moved, 110.0)
    assert status_write_due(written, 100.0, figures, 161.0)


def test_a_role_that_stops_autoscaling_renders_the_specs_count_again() -> None:
    s = spec(prefill=AUTOSCALED)
    fixed = s.prefill.model_copy(update={"autoscaling": None})
    assert replicas.in_effect(fixed, 4) == 2

"""Autoscaling on the local cluster: a load ramp through the router scales both roles out and
back in with no failed request and the prefill:decode band kept; an external autoscaler sets a
role's count through the Deployment's scale subresource, and pdwarden keeps it within the
bounds and never reverts it (a spec change included)."""

from __future__ import annotations

from typing import Any

import pytest

import pdwarden_contract as contract
from pdwarden_bench import autoscale
from pdwarden_localcluster.waits import wait_for
from pdwarden_operator.render.meta import child_name
from pdwarden_testkit.cluster_env import API_TRANSIENT, Env

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_load_ramp_scales_both_roles_out_and_in_and_loses_no_request(env: Env) -> None:
    figures = autoscale.scenario(env, clients=9, max_replicas=3)
    assert figures["plateau_replicas"] == {"prefill": 3, "decode": 3}, figures
    assert not figures["scaled_at_low_load"], figures  # one client is below the target
    assert figures["requests_failed"] == 0, figures
    assert figures["requests_failed_during_scale_in"] == 0, figures
    assert figures["ratio_out_of_band_seconds"] == 0, figures
    assert figures["requests_ok"] > 100, figures
    assert {"ScaledUp", "ScaledDown"} <= set(figures["events"]), figures
    last = figures["last_status"]
    assert last["prefill"]["replicas"] == 1 and last["ratioKept"] is True, last


def _scale_path(env: Env, deployment: str) -> str:
    return f"/apis/apps/v1/namespaces/{env.namespace}/deployments/{deployment}/scale"


def _set_scale(env: Env, deployment: str, replicas: int) -> None:
    """What a HorizontalPodAutoscaler does: the scale subresource."""
    env.call(
        "PATCH",
        _scale_path(env, deployment),
        {"spec": {"replicas": replicas}},
        content_type="application/merge-patch+json",
    )


def _count(env: Env, deployment: str) -> int:
    return int(env.call("GET", _scale_path(env, deployment))["spec"]["replicas"])


def _decode_status(env: Env, name: str) -> dict[str, Any]:
    return ((env.dm(name).get("status") or {}).get("autoscaling") or {}).get("decode") or {}


def test_an_external_autoscaler_drives_a_role_within_its_bounds(env: Env) -> None:
    name = "external"
    body = autoscale.autoscaled_model(env.namespace, name, max_replicas=3)
    body["spec"]["prefill"] = {"replicas": 1}
    body["spec"]["decode"] = {
        "replicas": 1,
        "autoscaling": {"minReplicas": 1, "maxReplicas": 3, "driver": "external"},
    }
    del body["spec"]["prefillDecodeRatio"]
    env.start_operator()
    env.create_model(body)
    decode = child_name(name, contract.ROLE_DECODE)
    wait_for(
        lambda: all(len(env.live_ready_pods(name, r)) == 1 for r in contract.RUNTIME_ROLES),
        240,
        "one ready prefill and decode pod",
        1.0,
        API_TRANSIENT,
    )
    _set_scale(env, decode, 2)
    wait_for(
        lambda: len(env.live_ready_pods(name, contract.ROLE_DECODE)) == 2,
        180,
        "the second decode pod",
        1.0,
        API_TRANSIENT,
    )
    wait_for(
        lambda: _decode_status(env, name).get("replicas") == 2,
        60,
        "status.autoscaling.decode to show the external count",
        1.0,
        API_TRANSIENT,
    )
    status = _decode_status(env, name)
    assert status["reason"] == "ExternalDriver" and status["maxReplicas"] == 3, status
    assert _count(env, decode) == 2  # never reverted to the spec's replicas

    # a spec change reconciles every child: the count stays the external autoscaler's
    group = f"/apis/{contract.API_GROUP}/{contract.API_VERSION}"
    path = f"{group}/namespaces/{env.namespace}/{contract.PLURAL}/{name}"
    env.call(
        "PATCH",
        path,
        {"spec": {"watchdog": {"scrapeIntervalSeconds": 3}}},
        content_type="application/merge-patch+json",
    )
    wait_for(
        lambda: (
            (env.dm(name).get("status") or {}).get("observedGeneration")
            == env.dm(name)["metadata"]["generation"]
        ),
        60,
        "the spec change reconciled",
        1.0,
        API_TRANSIENT,
    )
    assert _count(env, decode) == 2

    # above maxReplicas: brought back within the bounds
    _set_scale(env, decode, 5)
    wait_for(lambda: _count(env, decode) == 3, 60, "the count back at maxReplicas", 1.0, API_TRANSIENT)

"""The model's worker key switched on, rotated and switched off under load: no request refused.

A model that ran without the key (an upgrade from a release without it, or
`workerKey.enabled: false`) gets it with clients sending requests through its router's Service
all along: the router's pods present the key first, the workers require it (taking side-channel
messages without a proof for one roll), and every pod ends up on the Secret the operator
created. Rotated (`workerKey.rotation` raised), the workers accept the new key, the router
presents it, the workers sign with it, and the old one goes. Switched off again, the workers
drop it first. Every request answers 200 throughout.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import pytest

import pdwarden_contract as contract
from pdwarden_localcluster.waits import wait_for
from pdwarden_operator import worker_key_secret
from pdwarden_testkit.cluster_env import (
    API_TRANSIENT,
    Answers,
    Env,
    http_json,
    router_clients,
    synthetic_model,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NAME = "keyed"
CLIENTS = 3


def clients(url: str) -> contextlib.AbstractContextManager[Answers]:
    body = {"text": "worker key", "model": NAME, "sampling_params": {"max_new_tokens": 2}}
    return router_clients(url, body, CLIENTS)


def _workloads(env: Env) -> list[dict[str, Any]]:
    path = f"/apis/apps/v1/namespaces/{env.namespace}/deployments?labelSelector={contract.LABEL_MODEL}={NAME}"
    return [
        {**item, "kind": "Deployment"} for item in env.call("GET", path)["items"]
    ]  # a list's items name no kind


def _on(env: Env, rotation: int | None) -> bool:
    """Every Deployment of the model on one key of this `rotation`, nothing in between (None:
    on no key), and each rolled out."""
    workloads = _workloads(env)
    seen = worker_key_secret.observed(workloads, NAME)
    if len(workloads) != 3 or not seen.settled or len(seen.uses) != 1:
        return False
    [use] = seen.uses
    if rotation is None:
        return not use.secrets
    return (
        use.sign is not None
        and use == worker_key_secret.KeyUse.final(use.sign)
        and (worker_key_secret.rotation_of(use.sign, NAME) == rotation)
    )


def _patch(env: Env, worker_key: dict[str, Any]) -> None:
    env.call(
        "PATCH",
        f"/apis/{contract.API_GROUP}/{contract.API_VERSION}/namespaces/{env.namespace}/{contract.PLURAL}/{NAME}",
        {"spec": {"workerKey": worker_key}},
        content_type="application/merge-patch+json",
    )


def test_the_worker_key_switched_on_rotated_and_off_under_load_refuses_no_request(env: Env) -> None:
    env.start_operator()
    model = synthetic_model(
        env.namespace,
        NAME,
        replicas=1,
        transfer={"inflightDeadlineSeconds": 30, "transferDeadlineSeconds": 20},
        watchdog={"stuckAfterSeconds": 60, "scrapeIntervalSeconds": 5, "action": "alert"},
    )
    model["spec"]["workerKey"] = {"enabled": False}  # as a release without the key ran it
    env.create_model(model)
    wait_for(lambda: _on(env, None), 240, "the model's three Deployments rolled out", 1.0, API_TRANSIENT)
    svc = env.call("GET", f"/api/v1/namespaces/{env.namespace}/services/{NAME}-router")
    url = f"http://{svc['spec']['clusterIP']}:{contract.ROUTER_HTTP_PORT}{contract.GENERATE_PATH}"
    wait_for(
        lambda: http_json(url, {"text": "w", "model": NAME})[0] == 200,
        120,
        "an answer through the router",
        1.0,
    )

    with clients(url) as answers:
        _patch(env, {"enabled": True})
        wait_for(lambda: _on(env, 0), 300, "every Deployment on the key, rolled out", 2.0, API_TRANSIENT)
        on = answers.ok
        _patch(env, {"rotation": 1})
        wait_for(lambda: _on(env, 1), 400, "every Deployment on the new key, rolled out", 2.0, API_TRANSIENT)
        wait_for(
            lambda: (env.dm(NAME).get("status") or {}).get("workerKey") == {"state": "On", "rotation": 1},
            60,
            "status to say the rotated key is on",
            1.0,
            API_TRANSIENT,
        )
        rotated = answers.ok
        _patch(env, {"enabled": False})
        wait_for(lambda: _on(env, None), 300, "no Deployment on a key, rolled out", 2.0, API_TRANSIENT)
        time.sleep(3)
    assert answers.failed == [], json.dumps(answers.failed[:20], indent=1)
    assert 20 < on < rotated < answers.ok, (on, rotated, answers.ok)
    # the keys the pods had: two Secrets (the first and the rotated one), owned by the model
    secrets = env.call(
        "GET", f"/api/v1/namespaces/{env.namespace}/secrets?labelSelector={contract.LABEL_MODEL}={NAME}"
    )
    rotations = sorted(
        worker_key_secret.rotation_of(s["metadata"]["name"], NAME) or 0 for s in secrets["items"]
    )
    assert rotations == [0, 1], [s["metadata"]["name"] for s in secrets["items"]]

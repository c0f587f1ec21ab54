"""The model's worker key switched on and off under load: no request refused.

A model that ran without the key (an upgrade from a release without it, or
`workerKey.enabled: false`) gets it with clients sending requests through its router's Service
all along: the router's pods present the key first, the workers require it only once every
router pod does, and every pod ends up on the Secret the operator created. Switched off again,
the workers stop requiring it first. Every request answers 200 throughout.
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
    return list(env.call("GET", path)["items"])


def _keyed(env: Env, on: bool) -> bool:
    """Every Deployment of the model mounts the key (`on`) or none does, and each has rolled out."""
    workloads = _workloads(env)
    mounts = [
        worker_key_secret.mounted_by(w["spec"]["template"]["spec"], NAME) is not None for w in workloads
    ]
    return (
        len(workloads) == 3
        and all(m is on for m in mounts)
        and all(map(worker_key_secret.rolled_out, workloads))
    )


def _patch(env: Env, enabled: bool) -> None:
    env.call(
        "PATCH",
        f"/apis/{contract.API_GROUP}/{contract.API_VERSION}/namespaces/{env.namespace}/{contract.PLURAL}/{NAME}",
        {"spec": {"workerKey": {"enabled": enabled}}},
        content_type="application/merge-patch+json",
    )


def test_switching_the_worker_key_on_and_off_under_load_refuses_no_request(env: Env) -> None:
    env.start_operator()
    model = synthetic_model(
        env.namespace,
        NAME,
        replicas=1,
        transfer={"inflightDeadlineSeconds": 30, "transferDeadlineSeconds": 20},
        watchdog={"stuckAfterSeconds": 60, "scrapeIntervalSeconds": 5, "action": "alert"},
    )
    env.create_model(model)  # without the key (the host plays the router in other scenarios)
    wait_for(lambda: _keyed(env, False), 240, "the model's three Deployments rolled out", 1.0, API_TRANSIENT)
    svc = env.call("GET", f"/api/v1/namespaces/{env.namespace}/services/{NAME}-router")
    url = f"http://{svc['spec']['clusterIP']}:{contract.ROUTER_HTTP_PORT}{contract.GENERATE_PATH}"
    wait_for(
        lambda: http_json(url, {"text": "w", "model": NAME})[0] == 200,
        120,
        "an answer through the router",
        1.0,
    )

    with clients(url) as answers:
        _patch(env, True)
        wait_for(
            lambda: _keyed(env, True), 300, "every Deployment on the key, rolled out", 2.0, API_TRANSIENT
        )
        on = answers.ok
        time.sleep(5)
        _patch(env, False)
        wait_for(lambda: _keyed(env, False), 300, "no Deployment on the key, rolled out", 2.0, API_TRANSIENT)
        time.sleep(5)
    assert answers.failed == [], json.dumps(answers.failed[:20], indent=1)
    assert on > 20 and answers.ok > on, (on, answers.ok)
    # the key the pods had was one Secret, owned by the model
    secrets = env.call(
        "GET", f"/api/v1/namespaces/{env.namespace}/secrets?labelSelector={contract.LABEL_MODEL}={NAME}"
    )
    names = [s["metadata"]["name"] for s in secrets["items"]]
    assert len(names) == 1 and names[0].startswith(f"{NAME}-worker-key-"), names

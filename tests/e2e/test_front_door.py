"""The model's front door on the local cluster, as its clients and its author reach it.

One synthetic model with the defaults a user gets (worker key, NetworkPolicies), two router
pods, and a sidecar in the router pods. Through the router's Service, a client holding no key
reaches the serving routes and nothing else (smg's control plane answers 403); the sidecar
finds no API token (the router's is its own container's); and a router pod deleted under load
fails no request.
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any

import pytest

import pdwarden_contract as contract
from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.cluster_env import API_TRANSIENT, Env, http_json, router_clients, synthetic_body
from pdwarden_testkit.runtime_procs import CONTROL_PLANE_REQUESTS, http_status

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NAME = "door"
SIDECAR = "side"
# The sidecar says whether it holds an API token, and what the API server lets it list.
SIDECAR_SCRIPT = """
import os, ssl, sys, time, urllib.request
path = "/var/run/secrets/kubernetes.io/serviceaccount/token"
if not os.path.exists(path):
    print("SIDECAR no token", flush=True)
else:
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
    req = urllib.request.Request(f"https://{host}:{port}/api/v1/namespaces/{os.environ['NS']}/pods")
    req.add_header("Authorization", "Bearer " + open(path).read().strip())
    try:
        urllib.request.urlopen(req, context=ssl._create_unverified_context(), timeout=10)
        print("SIDECAR listed pods", flush=True)
    except Exception as err:
        print(f"SIDECAR refused {err}", flush=True)
time.sleep(3600)
"""


def _model(namespace: str) -> dict[str, Any]:
    sidecar = {
        "name": SIDECAR,
        "image": "python:3.11-slim",
        "command": ["python", "-c", SIDECAR_SCRIPT],
        "env": [{"name": "NS", "value": namespace}],
    }
    return synthetic_body(
        namespace,
        NAME,
        {
            "prefill": {"replicas": 1},
            "decode": {"replicas": 1},
            "router": {"replicas": 2, "podTemplate": {"spec": {"containers": [sidecar]}}},
            "transfer": {"inflightDeadlineSeconds": 30, "transferDeadlineSeconds": 20},
            "watchdog": {"stuckAfterSeconds": 60, "scrapeIntervalSeconds": 5, "action": "alert"},
        },
    )


def _router_url(env: Env) -> str:
    svc = env.call("GET", f"/api/v1/namespaces/{env.namespace}/services/{NAME}-router")
    return f"http://{svc['spec']['clusterIP']}:{contract.ROUTER_HTTP_PORT}"


def _reported(env: Env, log_path: str) -> bool:
    return "SIDECAR" in env.api.text(log_path)


def _routers_ready(env: Env, n: int) -> bool:
    return len(env.live_ready_pods(NAME, contract.ROLE_ROUTER)) == n


def test_the_front_door_serves_clients_only_and_a_router_pod_stops_without_failing_a_request(
    env: Env,
) -> None:
    env.start_operator()
    env.create_model(_model(env.namespace))
    body = {"text": "through the front door", "model": NAME, "sampling_params": {"max_new_tokens": 2}}
    wait_for(lambda: _routers_ready(env, 2), 300, "two Ready router pods", 2.0, API_TRANSIENT)
    url = _router_url(env)
    wait_for(lambda: http_json(f"{url}{contract.GENERATE_PATH}", body)[0] == 200, 120, "an answer", 1.0)

    # a client without a key: served routes answer, smg's control plane and admin routes do not
    assert http_json(f"{url}/v1/models")[0] == 200
    # smg under Kubernetes discovery routes by model: a /generate naming none reaches the model
    # (the gate names it), an unknown model is OpenAI's 404
    unnamed = {k: v for k, v in body.items() if k != "model"}
    by_model = [http_json(f"{url}{contract.GENERATE_PATH}", b) for b in (unnamed, {**body, "model": "no"})]
    assert [a[0] for a in by_model] == [200, 404], by_model
    refused = {(m, p): http_status(m, f"{url}{p}", b) for m, p, b in CONTROL_PLANE_REQUESTS}
    assert set(refused.values()) == {403}, refused

    # the router's sidecar holds no API token; the router itself discovers the workers with its own
    for pod in env.pods(NAME, contract.ROLE_ROUTER):
        name = pod["metadata"]["name"]
        path = f"/api/v1/namespaces/{env.namespace}/pods/{name}/log?container={SIDECAR}"
        wait_for(functools.partial(_reported, env, path), 60, f"{name}'s sidecar to report", 1.0)
        assert "SIDECAR no token" in env.api.text(path), env.api.text(path)

    # one router pod deleted under load: every request answered
    with router_clients(f"{url}{contract.GENERATE_PATH}", body, clients=4) as answers:
        time.sleep(3)
        before = answers.ok
        victim = env.pods(NAME, contract.ROLE_ROUTER)[0]["metadata"]["name"]
        env.call("DELETE", f"/api/v1/namespaces/{env.namespace}/pods/{victim}")
        wait_for(
            lambda: victim not in [p["metadata"]["name"] for p in env.pods(NAME, contract.ROLE_ROUTER)],
            60,
            f"{victim} to be gone",
            0.5,
            API_TRANSIENT,
        )
        wait_for(lambda: _routers_ready(env, 2), 300, "a second Ready router pod again", 2.0, API_TRANSIENT)
        time.sleep(3)
    assert answers.failed == [], json.dumps(answers.failed[:20], indent=1)
    assert before > 0 and answers.ok > before, (before, answers.ok)

"""A cluster shared by tenants, with a real API server's RBAC, impersonation and Pod Security:
granting the CRD gives a model author no power they did not have, and nothing in a namespace
(a same-named object, a look-alike pod) makes the operator act on what is not its model's.

The operator here runs with the default pod policy (nothing allowed) except `nodeName` in one
trusted namespace.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import pdwarden_contract as contract
from pdwarden_localcluster.cluster import ports
from pdwarden_localcluster.waits import pod_ready, wait_for
from pdwarden_testkit.cluster_env import wait_rounds
from pdwarden_testkit.kubectl import Kubectl
from pdwarden_testkit.operator_process import OperatorProcess
from tests.support.kube_objects import http_server_script

from ._operator_helpers import condition, new_namespace, operator_module_fixtures

pytestmark = pytest.mark.e2e

NS_PREFIX = "pdwe-tn-"
TRUSTED = f"{NS_PREFIX}trusted-{uuid.uuid4().hex[:6]}"  # nodeName is allowed here, and only here
AUTHOR = "alice"


kubectl, operator, _ = operator_module_fixtures(
    NS_PREFIX, metrics=True, allow=(), extra_args=("--allow", f"{TRUSTED}/nodeName")
)


def _author_rbac(namespace: str) -> list[dict[str, Any]]:
    """`alice` may manage DisaggregatedModels and read pods in `namespace`; `powerful` may read
    its Secrets."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "model-author"},
        "rules": [
            {
                "apiGroups": ["pdwarden.io"],
                "resources": ["disaggregatedmodels"],
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
            },
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        ],
    }
    secrets = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "secret-reader"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}],
    }

    def binding(name: str, subject: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{**subject, "namespace": namespace} if subject["kind"] != "User" else subject],
        }

    return [
        role,
        secrets,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "powerful"}},
        binding("model-author", {"kind": "User", "name": AUTHOR, "apiGroup": "rbac.authorization.k8s.io"}),
        binding("secret-reader", {"kind": "ServiceAccount", "name": "powerful"}),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "db-password"},
            "stringData": {"password": "hunter2"},
        },
    ]


def _tenant(kubectl: Kubectl, namespace: str) -> str:
    kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    for obj in _author_rbac(namespace):
        kubectl.apply(obj, namespace)
    return namespace


@pytest.fixture
def tenant(kubectl: Kubectl, operator: OperatorProcess) -> Iterator[str]:
    for ns in new_namespace(kubectl, NS_PREFIX):
        yield _tenant(kubectl, ns)


def _host_peer() -> dict[str, Any]:
    """The operator of these tests runs on the host, outside the cluster: its scrapes come from
    the host's address, which the models' NetworkPolicies let in to the metrics port only."""
    return {"ipBlock": {"cidr": f"{ports().net.host_addr}/32"}}


def _model(name: str, replicas: int = 0, **roles: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"path": "synthetic/tiny"},
        "engine": "synthetic",
        "prefill": {"replicas": replicas},
        "decode": {"replicas": replicas},
        "router": {"replicas": 1 if replicas else 0},
        "networkPolicy": {"metricsFrom": [_host_peer()]},
        # a short threshold: a stranger's stuck rooms would be blamed within the test's window
        "transfer": {"inflightDeadlineSeconds": 20, "transferDeadlineSeconds": 10},
        "watchdog": {"stuckAfterSeconds": 30, "scrapeIntervalSeconds": 5, "action": "restart"},
    }
    for role, extra in roles.items():
        spec[role] = {**spec[role], **extra}
    return {
        "apiVersion": "pdwarden.io/v1alpha1",
        "kind": "DisaggregatedModel",
        "metadata": {"name": name},
        "spec": spec,
    }


def _as_author(kubectl: Kubectl, obj: dict[str, Any], namespace: str) -> None:
    kubectl("apply", "-f", "-", "-n", namespace, "--as", AUTHOR, stdin=json.dumps(obj))


def _degraded(kubectl: Kubectl, name: str, namespace: str) -> dict[str, Any] | None:
    found = condition(kubectl.get("disaggregatedmodel", name, namespace), "Degraded")
    return found if found.get("status") == "True" else None


def _children(kubectl: Kubectl, name: str, namespace: str) -> list[str]:
    sel = f"pdwarden.io/model={name}"
    return [
        f"{o['kind']}/{o['metadata']['name']}"
        for kind in ("deployments", "serviceaccounts", "networkpolicies")
        for o in kubectl.items(kind, namespace, sel)
    ]


ESCALATION = {
    "prefill": {
        "podTemplate": {
            "spec": {
                "serviceAccountName": "powerful",
                "automountServiceAccountToken": True,
                "volumes": [{"name": "creds", "secret": {"secretName": "db-password"}}],
            }
        }
    },
    "decode": {
        "podTemplate": {
            "spec": {
                "nodeName": "pdwarden-node-0",
                "containers": [
                    {
                        "name": "spy",
                        "image": "python:3.11-slim",
                        "command": ["python", "-c", "import time; time.sleep(3600)"],
                        "envFrom": [{"secretRef": {"name": "db-password"}}],
                        "securityContext": {"capabilities": {"add": ["NET_RAW"]}},
                    }
                ],
            }
        }
    },
}
REFUSED_FIELDS = (
    "spec.prefill.podTemplate.spec.serviceAccountName",
    "spec.prefill.podTemplate.spec.automountServiceAccountToken",
    "spec.prefill.podTemplate.spec.volumes[0].secret.secretName",
    "spec.decode.podTemplate.spec.nodeName",
    "spec.decode.podTemplate.spec.containers[0].envFrom[0].secretRef.name",
    "spec.decode.podTemplate.spec.containers[0].securityContext.capabilities.add",
)


def test_a_model_author_cannot_run_pods_as_another_account_or_read_other_secrets(
    kubectl: Kubectl, tenant: str
) -> None:
    can = kubectl("auth", "can-i", "create", "pods", "-n", tenant, "--as", AUTHOR, check=False)
    assert can.stdout.strip() == "no", "the author may not create pods themselves"
    _as_author(kubectl, _model("esc", replicas=1, **ESCALATION), tenant)  # the API server accepts it
    degraded = wait_for(lambda: _degraded(kubectl, "esc", tenant), 120, "the model refused")
    for field in REFUSED_FIELDS:
        assert field in degraded["message"], (field, degraded["message"])
    assert "pod policy" in degraded["message"]
    assert _children(kubectl, "esc", tenant) == [], "nothing is applied for a refused model"
    pods = kubectl.items("pods", tenant)
    assert not [p for p in pods if p["spec"].get("serviceAccountName") == "powerful"]


def test_what_the_installation_allows_in_a_namespace_is_allowed_there_only(
    kubectl: Kubectl, operator: OperatorProcess, tenant: str
) -> None:
    placed = _model("placed", decode={"podTemplate": {"spec": {"nodeName": "pdwarden-node-0"}}})
    kubectl("create", "namespace", TRUSTED)
    try:
        kubectl.apply(placed, TRUSTED)
        deployment = wait_for(lambda: kubectl.get("deployment", "placed-decode", TRUSTED), 120, "the decode")
        assert deployment["spec"]["template"]["spec"]["nodeName"] == "pdwarden-node-0"
        kubectl.apply(placed, tenant)
        degraded = wait_for(lambda: _degraded(kubectl, "placed", tenant), 120, "the model refused")
        assert "spec.decode.podTemplate.spec.nodeName" in degraded["message"]
        assert "nodeName" in degraded["message"]
    finally:
        kubectl("delete", "namespace", TRUSTED, "--wait=false", check=False)


def test_a_same_named_foreign_object_is_reported_not_rewritten(kubectl: Kubectl, tenant: str) -> None:
    theirs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "web-router", "labels": {"team": "b"}},
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "web-runtime"},
            "spec": {"podSelector": {"matchLabels": {"app": "theirs"}}, "policyTypes": ["Ingress"]},
        },
        # the name of the watchdog's list of gone pods, which the runtime pods mount: a list
        # forged there would free pages a live prefill may still write
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"web-{contract.GONE_PODS_SUFFIX}"},
            "data": {contract.GONE_PODS_KEY: json.dumps({"gone": []})},
        },
    ]
    for obj in theirs:
        kubectl.apply(obj, tenant)
    before = {o["kind"]: kubectl.get(o["kind"].lower(), o["metadata"]["name"], tenant) for o in theirs}
    _as_author(kubectl, _model("web"), tenant)
    degraded = wait_for(lambda: _degraded(kubectl, "web", tenant), 120, "the model reported")
    assert degraded["reason"] == "NameTaken", degraded
    assert "ServiceAccount web-router" in degraded["message"]
    assert "NetworkPolicy web-runtime" in degraded["message"]
    assert f"ConfigMap web-{contract.GONE_PODS_SUFFIX}" in degraded["message"]
    for kind, old in before.items():
        assert old is not None
        now = kubectl.get(kind.lower(), old["metadata"]["name"], tenant)
        assert now is not None and now["metadata"]["resourceVersion"] == old["metadata"]["resourceVersion"]
        assert not now["metadata"].get("ownerReferences"), "never made ours"
    assert kubectl.get("deployment", "web-prefill", tenant) is None, "nothing applied"
    # once the names are free, the model gets its children (the periodic resync retries)
    for obj in theirs:
        kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "-n", tenant)
    wait_for(lambda: kubectl.get("deployment", "web-prefill", tenant), 120, "the model's children")


# serves garbage where a runtime serves its metrics
LOOK_ALIKE = http_server_script(9400, "b'not metrics at all\\n'")
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}
RESTRICTED_POD = {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}}


def _look_alike(model: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "look-alike",
            "labels": {"pdwarden.io/model": model, "pdwarden.io/role": "prefill"},
        },
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "securityContext": RESTRICTED_POD,
            "containers": [
                {
                    "name": "runtime",
                    "image": "python:3.11-slim",
                    "command": ["python", "-c", LOOK_ALIKE],
                    "ports": [{"name": "metrics", "containerPort": 9400}],
                    "readinessProbe": {"tcpSocket": {"port": 9400}, "periodSeconds": 1},
                    "securityContext": RESTRICTED_CONTAINER,
                }
            ],
        },
    }


def _ready_pod(kubectl: Kubectl, name: str, namespace: str) -> dict[str, Any] | None:
    pod = kubectl.get("pod", name, namespace)
    return pod if pod and pod_ready(pod) else None


def _serving(kubectl: Kubectl, name: str, namespace: str) -> list[dict[str, Any]] | None:
    pods = kubectl.items("pods", namespace, f"pdwarden.io/model={name}")
    ready = [p for p in pods if pod_ready(p) and p["metadata"]["name"] != "look-alike"]
    return ready if len(ready) == 3 else None


def test_runtime_pods_run_as_the_models_own_account_and_a_look_alike_is_never_judged(
    kubectl: Kubectl, operator: OperatorProcess, tenant: str
) -> None:
    _as_author(kubectl, _model("own", replicas=1), tenant)
    pods = wait_for(lambda: _serving(kubectl, "own", tenant), 240, "the model's three pods Ready")
    for pod in pods:
        role = _role(pod)
        account = "own-router" if role == "router" else "own-runtime"
        assert pod["spec"]["serviceAccountName"] == account, pod["metadata"]["name"]
        if role != "router":
            projected = [v for v in pod["spec"].get("volumes") or [] if "projected" in v]
            assert projected == [], "no ServiceAccount token in a runtime pod"
    kubectl.apply(_look_alike("own"), tenant)
    stranger = wait_for(lambda: _ready_pod(kubectl, "look-alike", tenant), 120, "the look-alike Ready")
    wait_rounds(operator, "own", 4)
    after = kubectl.get("pod", "look-alike", tenant)
    assert after is not None and after["metadata"]["uid"] == stranger["metadata"]["uid"], "never deleted"
    watchdog = (kubectl.get("disaggregatedmodel", "own", tenant) or {}).get("status", {}).get(
        "watchdog"
    ) or {}
    assert "look-alike" not in json.dumps(watchdog), watchdog
    log = operator.log_path.read_text() if operator.log_path else ""
    assert "pod look-alike is labelled as this model's but is not controlled by it" in log


# PD requests the way a router sends them, to both decode pods, naming the healthy prefill as
# the peer with rooms that never complete; prints what each attempt came to
STRANGER = (
    "import json, random, sys, time, urllib.request\n"
    "prefill, decodes = sys.argv[1], sys.argv[2:]\n"
    "end = time.time() + 75\n"
    "while time.time() < end:\n"
    "    for decode in decodes:\n"
    "        body = {'text': 'x', 'bootstrap_host': prefill, 'bootstrap_port': 8998,\n"
    "                'bootstrap_room': random.getrandbits(62)}\n"
    "        req = urllib.request.Request(f'http://{decode}:30000/generate', json.dumps(body).encode(),\n"
    "                                     {'Content-Type': 'application/json'})\n"
    "        try:\n"
    "            urllib.request.urlopen(req, timeout=2).read()\n"
    "            print('ANSWERED', flush=True)\n"
    "        except OSError as exc:\n"
    "            print('REFUSED', type(exc).__name__, getattr(exc, 'code', ''), flush=True)\n"
    "    time.sleep(2)\n"
    "print('DONE', flush=True)\n"
    "time.sleep(3600)\n"
)


# Each default alone keeps the stranger out: the NetworkPolicy (packets dropped), and on a
# cluster that enforces none, the model's worker key (401). One model of each, side by side in
# one namespace: each has only its own defence, so neither is kept out by the other's.
DEFENCES = {
    "network-policy": {"workerKey": {"enabled": False}},
    "worker-key": {"networkPolicy": {"enabled": False}},
}


def _stranger(defence: str, prefill: str, decodes: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"stranger-{defence}", "labels": {"app": "stranger"}},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "restartPolicy": "Never",
            "securityContext": RESTRICTED_POD,
            "containers": [
                {
                    "name": "client",
                    "image": "python:3.11-slim",
                    "command": ["python", "-c", STRANGER, prefill, *decodes],
                    "securityContext": RESTRICTED_CONTAINER,
                }
            ],
        },
    }


def test_a_stranger_cannot_reach_the_workers_nor_get_a_healthy_pod_blamed(
    kubectl: Kubectl, operator: OperatorProcess, tenant: str
) -> None:
    names = {defence: f"pair-{defence}" for defence in DEFENCES}
    for defence, name in names.items():
        model = _model(name, replicas=1, decode={"replicas": 2})
        model["spec"].update(DEFENCES[defence])
        _as_author(kubectl, model, tenant)
    wait_for(
        lambda: all(_serving_count(kubectl, name, tenant, 4) for name in names.values()),
        240,
        "each model's four pods Ready",
    )
    pods: dict[str, list[dict[str, Any]]] = {}
    prefills: dict[str, dict[str, Any]] = {}
    for defence, name in names.items():
        pods[defence] = kubectl.items("pods", tenant, f"pdwarden.io/model={name}")
        prefills[defence] = next(p for p in pods[defence] if _role(p) == "prefill")
        decodes = [p["status"]["podIP"] for p in pods[defence] if _role(p) == "decode"]
        kubectl.apply(_stranger(defence, prefills[defence]["status"]["podIP"], decodes), tenant)

    def finished(defence: str) -> str | None:
        out = kubectl("logs", f"stranger-{defence}", "-n", tenant, check=False).stdout
        return out if "DONE" in out else None

    for defence, name in names.items():
        log = wait_for(
            functools.partial(finished, defence), 180, f"the requests of {defence}'s stranger to end"
        )
        assert "ANSWERED" not in log and log.count("REFUSED") >= 10, (defence, log)
        if defence == "worker-key":  # reached, and told no by the worker itself
            assert log.count("REFUSED HTTPError 401") == log.count("REFUSED"), log
            _assert_one_worker_key_secret(kubectl, name, tenant, pods[defence])
    for defence, name in names.items():
        wait_rounds(operator, name, 3)
        status = (kubectl.get("disaggregatedmodel", name, tenant) or {}).get("status") or {}
        assert not status.get("remediations"), (defence, status.get("remediations"))
        prefill = prefills[defence]
        now = kubectl.get("pod", prefill["metadata"]["name"], tenant)
        assert now is not None and now["metadata"]["uid"] == prefill["metadata"]["uid"], (
            f"{defence}: the prefill kept"
        )


def _assert_one_worker_key_secret(
    kubectl: Kubectl, name: str, namespace: str, pods: list[dict[str, Any]]
) -> None:
    """One Secret holds the model's worker key: named by the API server, controlled by the
    model, immutable, and mounted by each of its pods."""
    model = kubectl.get("disaggregatedmodel", name, namespace)
    assert model is not None
    secrets = [
        s
        for s in kubectl.items("secrets", namespace, f"pdwarden.io/model={name}")
        if s["metadata"]["name"].startswith(f"{name}-worker-key-")
    ]
    assert len(secrets) == 1, [s["metadata"]["name"] for s in secrets]
    [secret] = secrets
    [ref] = secret["metadata"]["ownerReferences"]
    assert ref["uid"] == model["metadata"]["uid"] and ref["controller"] is True
    assert secret["immutable"] is True and set(secret["data"]) == {"key"}
    router = kubectl.items("pods", namespace, f"pdwarden.io/model={name},pdwarden.io/role=router")
    for pod in [*pods, *router]:
        mounted = [v["secret"]["secretName"] for v in pod["spec"]["volumes"] if v["name"] == "worker-key"]
        assert mounted == [secret["metadata"]["name"]], pod["metadata"]["name"]


def _role(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["labels"]["pdwarden.io/role"])


def _serving_count(kubectl: Kubectl, name: str, namespace: str, count: int) -> bool:
    pods = kubectl.items("pods", namespace, f"pdwarden.io/model={name}")
    return sum(1 for p in pods if pod_ready(p)) == count

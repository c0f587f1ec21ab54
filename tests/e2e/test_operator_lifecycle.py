"""The operator against the local cluster: a DisaggregatedModel becomes prefill, decode and
router workloads that serve requests, scale per role, heal hand-made damage, disappear with
the resource, and converge after the operator is killed mid-reconcile."""

from __future__ import annotations

import json
import select
import subprocess
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.kubectl import Kubectl
from pdwarden_testkit.operator_process import OperatorProcess
from pdwarden_testkit.ports import free_port

from ._operator_helpers import (
    CHILD_RESOURCES,
    ROOT,
    condition,
    idle_model,
    new_namespace,
    operator_module_fixtures,
)

pytestmark = pytest.mark.e2e

NS_PREFIX = "pdwe-op-"
CRASH_MODELS = 12  # enough work that a kill at the first child lands mid-reconcile
CHILDREN = {
    "deployments": {"prefill", "decode", "router"},
    "services": {"router"},
    "serviceaccounts": {"router", "runtime"},
    "networkpolicies": {"router", "runtime"},
    "roles": {"router"},
    "rolebindings": {"router"},
    # the idle models here run no pods, so no role has a disruption budget
    "poddisruptionbudgets": set(),
}


kubectl, operator, namespace = operator_module_fixtures(NS_PREFIX)


def _dm(kubectl: Kubectl, name: str, ns: str) -> dict[str, Any] | None:
    return kubectl.get("disaggregatedmodel", name, ns)


def _children(
    kubectl: Kubectl, name: str, ns: str, *, managed_fields: bool = False
) -> dict[str, list[dict[str, Any]]]:
    sel = f"pdwarden.io/model={name}"
    return {kind: kubectl.items(kind, ns, sel, managed_fields=managed_fields) for kind in CHILD_RESOURCES}


def _complete(kubectl: Kubectl, name: str, ns: str) -> bool:
    found = _children(kubectl, name, ns)
    return all(
        sorted(o["metadata"]["name"] for o in found[kind]) == sorted(f"{name}-{r}" for r in roles)
        for kind, roles in CHILDREN.items()
    )


def _zero_model(kubectl: Kubectl, name: str, ns: str) -> None:
    kubectl.run("apply", "-f", "-", stdin=yaml.safe_dump(idle_model(name, ns)))


def _ready(kubectl: Kubectl, name: str, ns: str) -> dict[str, Any] | None:
    dm = _dm(kubectl, name, ns)
    if not dm or (dm.get("status") or {}).get("phase") != "Ready":
        return None
    if dm["status"].get("observedGeneration") != dm["metadata"]["generation"]:
        return None
    return dm


def _uid(kubectl: Kubectl, kind: str, name: str, ns: str) -> str | None:
    obj = kubectl.get(kind, name, ns)
    return obj["metadata"]["uid"] if obj else None


# --- zero-replica models: the control loop alone ------------------------------------------------


def test_zero_replica_model_gets_every_child_and_status(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    _zero_model(kubectl, "zero", namespace)
    wait_for(lambda: _complete(kubectl, "zero", namespace), 60, "every child")
    dm = wait_for(lambda: _ready(kubectl, "zero", namespace), 60, "status Ready")
    assert condition(dm, "Ready")["status"] == "True"
    assert condition(dm, "Progressing")["status"] == "False"
    assert condition(dm, "Degraded")["status"] == "False"
    for kind in CHILD_RESOURCES:
        for obj in _children(kubectl, "zero", namespace, managed_fields=True)[kind]:
            [ref] = obj["metadata"]["ownerReferences"]
            assert ref["uid"] == dm["metadata"]["uid"] and ref["controller"] is True
            managers = {
                m["manager"] for m in obj["metadata"].get("managedFields", []) if m["operation"] == "Apply"
            }
            assert managers == {"pdwarden"}
    table = kubectl.run("get", "dm", "zero", "-n", namespace).stdout
    assert "READY" in table and "PHASE" in table and "Ready" in table


def test_hand_deleted_children_come_back(kubectl: Kubectl, operator: OperatorProcess, namespace: str) -> None:
    _zero_model(kubectl, "heal", namespace)
    wait_for(lambda: _complete(kubectl, "heal", namespace), 60, "all children")
    victims = [("deployment", "heal-decode"), ("service", "heal-router"), ("role", "heal-router")]
    before = {v: _uid(kubectl, *v, namespace) for v in victims}
    for kind, name in victims:
        kubectl.run("delete", kind, name, "-n", namespace, "--wait=true")

    def restored() -> bool:
        now = {v: _uid(kubectl, *v, namespace) for v in victims}
        return all(now[v] is not None and now[v] != before[v] for v in victims)

    wait_for(restored, 60, "deleted children recreated")
    assert _complete(kubectl, "heal", namespace)


def test_hand_edits_are_reverted(kubectl: Kubectl, operator: OperatorProcess, namespace: str) -> None:
    _zero_model(kubectl, "edit", namespace)
    wait_for(lambda: _complete(kubectl, "edit", namespace), 60, "all children")
    kubectl.run("scale", "deployment", "edit-prefill", "-n", namespace, "--replicas=2")
    granted = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    widened = {"rules": [{"apiGroups": [""], "resources": ["pods", "secrets"], "verbs": ["get", "delete"]}]}
    kubectl.run("patch", "role", "edit-router", "-n", namespace, "--type=merge", "-p", json.dumps(widened))

    def reverted() -> bool:
        dep = kubectl.get("deployment", "edit-prefill", namespace)
        role = kubectl.get("role", "edit-router", namespace)
        return bool(dep and role and dep["spec"]["replicas"] == 0 and role["rules"] == granted)

    wait_for(reverted, 60, "hand edits reverted to the spec")


def test_deleting_the_model_removes_every_child(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    _zero_model(kubectl, "gone", namespace)
    wait_for(lambda: _complete(kubectl, "gone", namespace), 60, "all children")
    kubectl.run("delete", "dm", "gone", "-n", namespace, "--wait=true", timeout=90)
    assert _dm(kubectl, "gone", namespace) is None, "no finalizer may hold the resource"

    def empty() -> bool:
        found = _children(kubectl, "gone", namespace)
        return not any(found.values()) and not kubectl.items(
            "replicasets", namespace, "pdwarden.io/model=gone"
        )

    wait_for(empty, 90, "garbage collection of every child")


def test_operator_killed_mid_reconcile_converges_without_duplicates(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    names = [f"crash-{i}" for i in range(CRASH_MODELS)]
    # One apply for all: the operator gets them at once, and a watch (not polling, which is
    # slower than the operator) kills it at its first child, leaving most models with some or
    # none of their children.
    watch = subprocess.Popen(
        [kubectl.exe, "get", "deployments", "-n", namespace, "--watch", "-o", "name"],
        env=kubectl.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert watch.stdout is not None
        kubectl.run("apply", "-f", "-", stdin=yaml.safe_dump_all([idle_model(n, namespace) for n in names]))
        readable, _, _ = select.select([watch.stdout], [], [], 60)
        assert readable, "no child within 60 s"
        operator.kill()
    finally:
        watch.kill()
        watch.wait(10)
    complete_when_killed = [n for n in names if _complete(kubectl, n, namespace)]
    assert len(complete_when_killed) < len(names), "the kill came after the reconcile, not during it"
    operator.start()
    for name in names:

        def ready(n: str = name) -> dict[str, Any] | None:
            return _ready(kubectl, n, namespace)

        wait_for(ready, 90, f"{name} Ready after restart")
    for name in names:
        found = _children(kubectl, name, namespace)
        for kind, roles in CHILDREN.items():
            assert len(found[kind]) == len(roles), f"{name}: {kind} duplicated or missing: {found[kind]}"
        for role in ("prefill", "decode", "router"):
            rs = kubectl.items("replicasets", namespace, f"pdwarden.io/model={name},pdwarden.io/role={role}")
            assert len(rs) == 1, f"{name}-{role}: {len(rs)} ReplicaSets"


def test_invalid_spec_that_passes_the_crd_is_reported(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    """A spec the CRD accepts but whose child the API server refuses: Degraded, not a crash loop."""
    doc = {
        "apiVersion": "pdwarden.io/v1alpha1",
        "kind": "DisaggregatedModel",
        "metadata": {"name": "badenv", "namespace": namespace},
        "spec": {
            "model": {"path": "x"},
            "engine": "synthetic",
            "prefill": {"replicas": 0, "env": [{"name": "X", "valueFrom": {"nonsense": {}}}]},
            "decode": {"replicas": 0},
            "router": {"replicas": 0},
        },
    }
    kubectl.run("apply", "-f", "-", stdin=yaml.safe_dump(doc))

    def degraded() -> dict[str, Any] | None:
        dm = _dm(kubectl, "badenv", namespace)
        return dm if condition(dm, "Degraded").get("status") == "True" else None

    dm = wait_for(degraded, 60, "Degraded condition")
    assert dm["status"]["phase"] == "Degraded"
    assert condition(dm, "Degraded")["reason"] == "ApplyFailed"
    assert "badenv-prefill" in condition(dm, "Degraded")["message"]
    assert operator.healthy()


# --- the synthetic example with real runtime and router processes ---------------------------------


GENERATE_BODY = {"model": "synthetic", "text": "hello pdwarden", "sampling_params": {"max_new_tokens": 8}}
# a pod's client: POST one /generate to the URL given, retrying until it answers, then idle
POD_CLIENT = (
    "import json, sys, time, urllib.request\n"
    "body = sys.argv[2].encode()\n"
    "while True:\n"
    "    req = urllib.request.Request(sys.argv[1], data=body, headers={'Content-Type': 'application/json'})\n"
    "    try:\n"
    "        print('ANSWER', urllib.request.urlopen(req, timeout=20).read().decode(), flush=True)\n"
    "        break\n"
    "    except OSError as exc:\n"
    "        print('retry', exc, flush=True)\n"
    "        time.sleep(1)\n"
    "time.sleep(3600)\n"
)


def _generate(base_url: str) -> dict[str, Any] | None:
    body = json.dumps(GENERATE_BODY).encode()
    req = urllib.request.Request(
        f"{base_url}/generate", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return dict(json.loads(resp.read())) if resp.status == 200 else None
    except OSError:
        return None


def _pod_answer(kubectl: Kubectl, pod: str, ns: str) -> dict[str, Any] | None:
    out = kubectl("logs", pod, "-n", ns, check=False).stdout
    for line in out.splitlines():
        if line.startswith("ANSWER "):
            return dict(json.loads(line.removeprefix("ANSWER ")))
    return None


@pytest.fixture(scope="module")
def synthetic(kubectl: Kubectl, operator: OperatorProcess) -> Iterator[tuple[str, str]]:
    for ns in new_namespace(kubectl, NS_PREFIX):
        kubectl.run("apply", "-n", ns, "-f", str(ROOT / "examples" / "synthetic.yaml"))
        yield "synthetic", ns


@pytest.mark.timeout(900)
def test_synthetic_example_becomes_ready_and_serves_through_the_router(
    kubectl: Kubectl, synthetic: tuple[str, str]
) -> None:
    name, ns = synthetic
    dm = wait_for(lambda: _ready(kubectl, name, ns), 420, "examples/synthetic.yaml Ready", interval=1)
    assert dm["status"]["prefill"] == {"replicas": 1, "readyReplicas": 1, "summary": "1/1"}
    assert dm["status"]["router"]["readyReplicas"] == 1
    service = f"{name}-router"
    # from the host, as the README says: kubectl port-forward to the router's Service
    local = free_port()
    forward = subprocess.Popen(
        [kubectl.exe, "port-forward", f"svc/{service}", f"{local}:8000", "-n", ns, "--address", "127.0.0.1"],
        env=kubectl.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        answer = wait_for(
            lambda: _generate(f"http://127.0.0.1:{local}"),
            90,
            "a /generate answer through port-forward",
            interval=2,
        )
    finally:
        forward.terminate()
        forward.wait(timeout=10)
    assert answer.get("text") is not None, answer
    # from a pod: the Service's DNS name and ClusterIP (kube-proxy picks the router pod)
    client = {
        "name": "client",
        "image": "python:3.11-slim",
        "command": ["python", "-c", POD_CLIENT, f"http://{service}:8000/generate", json.dumps(GENERATE_BODY)],
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "router-client"},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [client]},
    }
    kubectl.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(pod))
    from_pod = wait_for(
        lambda: _pod_answer(kubectl, "router-client", ns), 120, "a pod's answer via the Service"
    )
    assert from_pod.get("text") is not None, from_pod


@pytest.mark.timeout(1500)
def test_scaling_prefill_changes_only_prefill(kubectl: Kubectl, synthetic: tuple[str, str]) -> None:
    name, ns = synthetic
    wait_for(lambda: _ready(kubectl, name, ns), 420, "Ready before scaling", interval=1)
    decode_gen = kubectl.get("deployment", f"{name}-decode", ns)["metadata"]["generation"]  # type: ignore[index]
    router_gen = kubectl.get("deployment", f"{name}-router", ns)["metadata"]["generation"]  # type: ignore[index]
    for replicas in (3, 1):
        kubectl.run(
            "patch",
            "dm",
            name,
            "-n",
            ns,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"prefill": {"replicas": replicas}}}),
        )

        def scaled(r: int = replicas) -> dict[str, Any] | None:
            dm = _ready(kubectl, name, ns)
            ok = (
                dm
                and dm["status"]["prefill"]["readyReplicas"] == r
                and dm["status"]["prefill"]["replicas"] == r
            )
            return dm if ok else None

        wait_for(scaled, 420, f"prefill at {replicas} ready replicas", interval=1)
        pods = kubectl.items("pods", ns, f"pdwarden.io/model={name},pdwarden.io/role=prefill")
        assert len([p for p in pods if not p["metadata"].get("deletionTimestamp")]) == replicas
    assert kubectl.get("deployment", f"{name}-decode", ns)["metadata"]["generation"] == decode_gen  # type: ignore[index]
    assert kubectl.get("deployment", f"{name}-router", ns)["metadata"]["generation"] == router_gen  # type: ignore[index]

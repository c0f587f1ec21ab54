"""Pods a real cluster admits: the operator against the local cluster's real API server.

- the rendered pods pass Pod Security admission (enforced by the kube-apiserver) in
  namespaces labelled `restricted` and `baseline`, and a model with RDMA (IPC_LOCK) is
  refused in a `baseline` one (the control: admission is really enforced);
- a podTemplate the CRD accepts but the API server would refuse (a bad toleration, an
  unknown field) is reported in status naming the field, and nothing is applied (a new
  model's first pass deletes what it created, later passes are refused by the dry-run);
  fixing it creates the children;
- (a model on nodes all tainted like GPU nodes: tests/e2e/test_operator_gpu_taint.py, a module
  of its own because it is cluster-exclusive);
- a GPU role's Deployment tolerates the GPU taint by default and not with `gpuToleration: false`;
- the NetworkPolicies (on by default) disappear and reappear with `networkPolicy.enabled`;
- every example is accepted by the API server (server-side dry-run).

- inside the runtime container (read through /proc/<pid>, the local kubelet's container id):
  a download cache on a PersistentVolumeClaim outlives the pod: its replacement finds what the
  first pod's cache held.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pdwarden_contract import ROLES
from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.operator_process import OperatorProcess

from ._operator_helpers import (
    CHILD_RESOURCES,
    ROOT,
    Kubectl,
    condition,
    operator_module_fixtures,
)

pytestmark = pytest.mark.e2e

NS_PREFIX = "pdwe-pods-"
# An idle model's children: 3 Deployments, 2 ServiceAccounts, a Role and its binding, the
# router's Service, 2 NetworkPolicies (no role runs pods, so no disruption budget).
IDLE_CHILDREN = 10


kubectl, operator, namespace = operator_module_fixtures(NS_PREFIX)


def _model(name: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"path": "synthetic/tiny"},
        "engine": "synthetic",
        "prefill": {"replicas": 0},
        "decode": {"replicas": 0},
        "router": {"replicas": 0},
    }
    for key, value in spec.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return {
        "apiVersion": "pdwarden.io/v1alpha1",
        "kind": "DisaggregatedModel",
        "metadata": {"name": name},
        "spec": base,
    }


def _children(kubectl: Kubectl, name: str, ns: str) -> list[str]:
    sel = f"pdwarden.io/model={name}"
    found = ((kind, o) for kind in CHILD_RESOURCES for o in kubectl.items(kind, ns, sel))
    return [f"{kind}/{o['metadata']['name']}" for kind, o in found]


def _pods_by_role(kubectl: Kubectl, name: str, ns: str) -> dict[str, int]:
    pods = kubectl.items("pods", ns, f"pdwarden.io/model={name}")
    return {
        role: sum(p["metadata"]["labels"].get("pdwarden.io/role") == role for p in pods) for role in ROLES
    }


def _replicaset_failures(kubectl: Kubectl, name: str, ns: str) -> list[str]:
    out = []
    for rs in kubectl.items("replicasets", ns, f"pdwarden.io/model={name}"):
        for c in (rs.get("status") or {}).get("conditions") or []:
            if c.get("type") == "ReplicaFailure" and c.get("status") == "True":
                out.append(str(c.get("message")))
    return out


def _enforce(kubectl: Kubectl, ns: str, level: str) -> None:
    kubectl.run("label", "namespace", ns, f"pod-security.kubernetes.io/enforce={level}", "--overwrite")


@pytest.mark.parametrize("level", ["restricted", "baseline"])
def test_pods_are_admitted_by_pod_security(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str, level: str
) -> None:
    _enforce(kubectl, namespace, level)
    one = {"replicas": 1}
    kubectl.apply(_model("psa", prefill=one, decode=one, router=one), namespace)

    def admitted() -> dict[str, int] | None:
        assert not _replicaset_failures(kubectl, "psa", namespace), "a pod was refused"
        counts = _pods_by_role(kubectl, "psa", namespace)
        return counts if all(counts.values()) else None

    counts = wait_for(admitted, 180, f"a pod of every role admitted under {level}", 1.0)
    assert counts == {"prefill": 1, "decode": 1, "router": 1}
    # Stop the processes early: this test is about admission, not serving.
    kubectl.run("delete", "disaggregatedmodel", "psa", "-n", namespace, "--wait=false")


def test_rdma_pods_are_refused_by_baseline(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    """The control for the test above: the API server really enforces the label."""
    _enforce(kubectl, namespace, "baseline")
    rdma = {"rdma": {"resourceName": "rdma/ib", "count": 1}}
    kubectl.apply(_model("rdma", prefill={"replicas": 1}, transfer=rdma), namespace)
    [message] = wait_for(
        lambda: _replicaset_failures(kubectl, "rdma", namespace), 120, "the prefill pod refused", interval=1
    )
    assert "violates PodSecurity" in message and "IPC_LOCK" in message, message
    assert _pods_by_role(kubectl, "rdma", namespace)["prefill"] == 0

    def reported() -> dict[str, Any] | None:
        ready = condition(kubectl.get("disaggregatedmodel", "rdma", namespace), "Ready")
        return ready if ready.get("reason") == "PodsBlocked" else None

    ready = wait_for(reported, 120, "the refusal in the model's status", 2.0)
    assert "prefill: pods are refused" in ready["message"] and "PodSecurity" in ready["message"]


BAD_TOLERATION = {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Sometimes", "effect": "NoSchedule"}]}
UNKNOWN_FIELD = {"containers": [{"name": "runtime", "envFrm": [{"configMapRef": {"name": "x"}}]}]}


@pytest.mark.parametrize(
    ("pod_spec", "field"),
    [
        (BAD_TOLERATION, "spec.template.spec.tolerations[0].operator"),
        (UNKNOWN_FIELD, "envFrm"),
    ],
    ids=["bad-toleration", "unknown-field"],
)
def test_a_refused_fragment_is_reported_and_nothing_is_applied(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str, pod_spec: dict[str, Any], field: str
) -> None:
    manifest = _model("frag", decode={"podTemplate": {"spec": pod_spec}}, networkPolicy={"enabled": True})
    kubectl.apply(manifest, namespace)

    def rejected() -> dict[str, Any] | None:
        c = condition(kubectl.get("disaggregatedmodel", "frag", namespace), "Degraded")
        return c if c.get("reason") == "ApplyFailed" else None

    degraded = wait_for(rejected, 120, "Degraded/ApplyFailed", 1.0)
    assert degraded["status"] == "True"
    assert "frag-decode" in degraded["message"] and "spec.decode" in degraded["message"]
    assert field in degraded["message"], degraded["message"]
    assert _children(kubectl, "frag", namespace) == [], "nothing half-applied"
    # A new model's first pass applies without a dry-run and deletes what it created; the pass
    # its deletions cause (and every later one of this generation) validates first instead.
    validated = wait_for(
        lambda: ((c := rejected()) is not None and "dry-run" in c["message"]) or None,
        60,
        "a later pass refused by the dry-run",
        1.0,
    )
    assert validated and _children(kubectl, "frag", namespace) == []

    fixed = copy.deepcopy(manifest)
    fixed["spec"]["decode"]["podTemplate"] = {"spec": {"nodeSelector": {"kubernetes.io/os": "linux"}}}
    kubectl.apply(fixed, namespace)
    wait_for(
        lambda: len(_children(kubectl, "frag", namespace)) == IDLE_CHILDREN or None,
        120,
        "the children after the fix",
    )
    degraded = condition(kubectl.get("disaggregatedmodel", "frag", namespace), "Degraded")
    assert degraded.get("reason") != "ApplyFailed", degraded


def test_gpu_toleration_false_through_kubectl_apply_drops_the_gpu_toleration(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    """The opt-out reaches the operator (a podTemplate's `tolerations: null` does not: the API
    server prunes it); the Deployments are enough, no pod needs to start (replicas 0)."""
    kubectl.apply(_model("tol-default", prefill={"gpus": 1}), namespace)
    kubectl.apply(_model("tol-off", prefill={"gpus": 1, "gpuToleration": False}), namespace)

    def pod_spec(name: str) -> dict[str, Any] | None:
        deployment = kubectl.get("deployment", f"{name}-prefill", namespace)
        return deployment["spec"]["template"]["spec"] if deployment else None

    def gpu_tolerations(pod: dict[str, Any]) -> list[dict[str, Any]]:
        return [t for t in pod.get("tolerations") or [] if t.get("key") == "nvidia.com/gpu"]

    default = wait_for(lambda: pod_spec("tol-default"), 120, "the default model's prefill Deployment", 1.0)
    off = wait_for(lambda: pod_spec("tol-off"), 120, "the opted-out model's prefill Deployment", 1.0)
    for pod in (default, off):
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1", "a GPU role"
    assert gpu_tolerations(default) == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert gpu_tolerations(off) == [], off.get("tolerations")
    # what the API server stored: the field as applied, and the CRD's default where it was left out
    for name, expected in (("tol-default", True), ("tol-off", False)):
        dm = kubectl.get("disaggregatedmodel", name, namespace)
        assert dm is not None and dm["spec"]["prefill"]["gpuToleration"] is expected, name


def test_network_policy_follows_the_spec(kubectl: Kubectl, operator: OperatorProcess, namespace: str) -> None:
    kubectl.apply(_model("np"), namespace)
    policy = wait_for(lambda: kubectl.get("networkpolicy", "np-runtime", namespace), 120, "the NetworkPolicy")
    assert kubectl.get("networkpolicy", "np-router", namespace) is not None, "on by default, router too"
    assert [r.get("ports", [{}])[0].get("port") for r in policy["spec"]["ingress"]] == [
        "http",
        None,
        "metrics",
    ]
    kubectl.run(
        "patch", "disaggregatedmodel", "np", "-n", namespace, "--type=merge",
        "-p", '{"spec": {"networkPolicy": {"enabled": false}}}',
    )  # fmt: skip
    wait_for(lambda: kubectl.get("networkpolicy", "np-runtime", namespace) is None, 120, "the policy deleted")
    wait_for(lambda: kubectl.get("networkpolicy", "np-router", namespace) is None, 120, "the router's gone")
    assert kubectl.get("deployment", "np-prefill", namespace) is not None, "only the policy goes"


def test_a_roles_disruption_budget_comes_with_its_pods_and_goes_with_them(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    kubectl.apply(_model("budget", decode={"replicas": 1}), namespace)
    budget = wait_for(lambda: kubectl.get("pdb", "budget-decode", namespace), 120, "the decode's budget")
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"]["pdwarden.io/role"] == "decode"
    assert [p["metadata"]["name"] for p in kubectl.items("pdb", namespace, "pdwarden.io/model=budget")] == [
        "budget-decode"
    ], "the roles scaled to zero have none"
    kubectl.run(
        "patch", "disaggregatedmodel", "budget", "-n", namespace, "--type=merge",
        "-p", '{"spec": {"decode": {"replicas": 0}}}',
    )  # fmt: skip
    wait_for(lambda: kubectl.get("pdb", "budget-decode", namespace) is None, 120, "the budget deleted")
    deployment = kubectl.get("deployment", "budget-decode", namespace)
    assert deployment is not None and deployment["spec"]["replicas"] == 0, "only the budget goes"


def _container_proc(pod: dict[str, Any]) -> Path:
    """/proc of the pod's first container (the local kubelet's container id is its pid): its
    root and mount table are the container's own."""
    pid = int(pod["status"]["containerStatuses"][0]["containerID"].removeprefix("pdwarden://"))
    return Path(f"/proc/{pid}")


def _mounts(proc: Path) -> dict[str, tuple[str, str, str]]:
    """Mount point -> (filesystem type, super options, mount options) from mountinfo."""
    out = {}
    for line in (proc / "mountinfo").read_text().splitlines():
        fields = line.split()
        tail = fields[fields.index("-") + 1 :]
        out[fields[4]] = (tail[0], tail[2] if len(tail) > 2 else "", fields[5])
    return out


@pytest.fixture
def cache_claim(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    """A claim of the cluster's default (local) StorageClass: the download cache's volume."""
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "hf-cache"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    kubectl.apply(claim, namespace)
    try:
        yield "hf-cache"
    finally:
        kubectl.run("delete", "pvc", "hf-cache", "-n", namespace, "--wait=false", check=False)


def test_a_replacement_pod_finds_the_download_cache_of_the_pod_before_it(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str, cache_claim: str
) -> None:
    hf = {"cache": {"claimName": cache_claim}}
    model = _model("cached", model={"path": "org/tiny", "huggingFace": hf}, prefill={"replicas": 1})
    kubectl.apply(model, namespace)
    selector = "pdwarden.io/model=cached,pdwarden.io/role=prefill"

    def running(exclude: str = "") -> dict[str, Any] | None:
        """A prefill pod (not `exclude`) whose container has its volumes mounted (the sandbox
        mounts them in the container's process before it execs the runtime)."""
        for pod in kubectl.items("pods", namespace, selector):
            statuses = pod.get("status", {}).get("containerStatuses") or []
            if pod["metadata"]["uid"] == exclude or not (
                statuses and statuses[0].get("state", {}).get("running")
            ):
                continue
            with contextlib.suppress(OSError):  # the process may be between exec steps
                if "/cache" in _mounts(_container_proc(pod)):
                    return pod
        return None

    first = wait_for(running, 300, "the prefill pod running with its cache claim", 2.0)
    proc = _container_proc(first)
    assert _container_env(proc)["HF_HOME"] == "/cache/huggingface"
    assert "rw" in _mounts(proc)["/cache"][2].split(",")
    marker = proc / "root/cache/huggingface/hub/models--org--tiny/refs/main"
    marker.parent.mkdir(parents=True)
    marker.write_text("0123abcd")  # what a first download leaves in the cache

    kubectl.run("delete", "pod", first["metadata"]["name"], "-n", namespace, "--wait=false")
    second = wait_for(lambda: running(first["metadata"]["uid"]), 300, "the replacement prefill pod", 2.0)
    again = _container_proc(second) / "root/cache/huggingface/hub/models--org--tiny/refs/main"
    assert again.read_text() == "0123abcd"
    kubectl.run("delete", "disaggregatedmodel", "cached", "-n", namespace, "--wait=false")


def _container_env(proc: Path) -> dict[str, str]:
    return dict(e.split("=", 1) for e in (proc / "environ").read_text().split("\0") if "=" in e)


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_pass_a_server_side_dry_run(kubectl: Kubectl, namespace: str, example: Path) -> None:
    proc = kubectl.run("apply", "-n", namespace, "--dry-run=server", "-f", str(example))
    assert "(server dry run)" in proc.stdout


def test_kubectl_explain_describes_the_merge(kubectl: Kubectl) -> None:
    text = kubectl.run("explain", "dm.spec.prefill.podTemplate").stdout
    for words in ("strategic-merge", "merge by name", "appended", "refused"):
        assert words in " ".join(text.split()), f"{words!r} not in: {text}"

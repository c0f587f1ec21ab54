"""The local cluster's nodes, end to end: a GPU cluster's shape (a CPU node, tainted GPU nodes),
pods spread over nodes and talking across them, the scheduler's refusals."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest

from pdwarden_localcluster import provisioner, topology
from pdwarden_localcluster.cluster import ClusterInfo, ports
from pdwarden_localcluster.waits import WaitTimeout, pod_ready, wait_for
from pdwarden_testkit.kubectl import Kubectl
from tests.support.kube_objects import deployment

from .test_cluster_network import fetched, fetcher, server, service

pytestmark = pytest.mark.e2e

NOT_READY = "node.kubernetes.io/not-ready"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def nodes(kubectl: Kubectl) -> list[dict[str, Any]]:
    listing = kubectl.json("get", "nodes", "-l", f"{topology.LOCAL_NODE_LABEL}=true")
    return sorted(listing["items"], key=lambda n: n["metadata"]["name"])


def gpu_nodes(kubectl: Kubectl) -> list[dict[str, Any]]:
    return [n for n in nodes(kubectl) if "nvidia.com/gpu" in n["status"]["capacity"]]


def node_index(node: dict[str, Any]) -> int:
    return int(node["metadata"]["name"].rsplit("-", 1)[1])


def test_gpu_nodes_carry_the_device_plugins_labels_taint_and_capacity(
    kubectl: Kubectl, cluster: ClusterInfo
) -> None:
    # A node registers with node.kubernetes.io/not-ready until the node lifecycle controller
    # has seen it Ready: the shape asserted below is the settled one.
    def settled() -> list[dict[str, Any]] | None:
        found = nodes(kubectl)
        lifted = not any(t["key"] == NOT_READY for n in found for t in n["spec"].get("taints") or [])
        return found if lifted else None

    every = wait_for(settled, 60, "the nodes' not-ready taints lifted")
    assert [n["metadata"]["name"] for n in every] == cluster.nodes
    gpus = gpu_nodes(kubectl)
    assert gpus, "the cluster has GPU nodes"
    assert len(gpus) < len(every), "and an untainted CPU node"
    for node in every:
        labels, spec = node["metadata"]["labels"], node["spec"]
        capacity = node["status"]["capacity"]
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"
        subnet = ipaddress.ip_network(ports().net.node_subnet(node_index(node)))
        assert spec["podCIDR"] == str(subnet)
        lease = kubectl.json("get", "lease", node["metadata"]["name"], "-n", "kube-node-lease")
        assert lease["spec"]["holderIdentity"] == node["metadata"]["name"] and lease["spec"]["renewTime"]
        if node in gpus:
            assert labels["nvidia.com/gpu.present"] == "true"
            assert labels["nvidia.com/gpu.count"] == capacity["nvidia.com/gpu"] != "0"
            assert labels["nvidia.com/gpu.product"]
            assert topology.gpu_taint() in spec["taints"]
        else:
            assert not any(k.startswith("nvidia.com/") for k in labels)
            assert not spec.get("taints")
    assert len({n["spec"]["podCIDR"] for n in every}) == len(every)


def test_a_gpu_pod_without_the_toleration_stays_pending_with_the_schedulers_reason(
    kubectl: Kubectl, namespace: str
) -> None:
    container = {
        "name": "cuda",
        "image": "x",
        "command": ["sleep", "3600"],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "intolerant"},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [container]},
    }
    kubectl.apply(pod, namespace)

    def unschedulable() -> dict[str, Any] | None:
        obj = kubectl.get("pod", "intolerant", namespace) or {}
        conds = (obj.get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == "PodScheduled" and c["status"] == "False"), None)

    cond = wait_for(unschedulable, 60, "PodScheduled=False")
    assert cond["reason"] == "Unschedulable"
    assert "untolerated taint" in cond["message"] and "nvidia.com/gpu" in cond["message"], cond["message"]
    assert not (kubectl.get("pod", "intolerant", namespace) or {})["spec"].get("nodeName")

    tolerant = {**pod, "metadata": {"name": "tolerant"}}
    tolerant["spec"] = {**pod["spec"], "tolerations": [GPU_TOLERATION]}
    kubectl.apply(tolerant, namespace)
    obj = wait_for(
        lambda: (p := kubectl.get("pod", "tolerant", namespace)) and p["spec"].get("nodeName") and p,
        60,
        "the tolerating pod bound to a node",
    )
    assert obj["spec"]["nodeName"] in {n["metadata"]["name"] for n in gpu_nodes(kubectl)}


def spread_over_nodes(name: str, replicas: int) -> dict[str, Any]:
    """A Deployment whose replicas must run on distinct nodes (GPU nodes included)."""
    manifest = deployment(name, replicas, server(), grace_seconds=2)
    spec = manifest["spec"]["template"]["spec"]
    spec["tolerations"] = [GPU_TOLERATION]
    spec["topologySpreadConstraints"] = [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": name}},
        }
    ]
    spec["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": name}}, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    }
    return manifest


def test_replicas_spread_over_nodes_and_reach_each_other_and_a_service_across_them(
    kubectl: Kubectl, namespace: str, cluster: ClusterInfo
) -> None:
    count = len(cluster.nodes)
    assert count >= 2, "this test needs a cluster of several nodes"
    kubectl.apply(spread_over_nodes("web", count), namespace)
    kubectl.apply(service("web"), namespace)

    def all_ready() -> list[dict[str, Any]] | None:
        pods = kubectl.items("pods", namespace, "app=web")
        return pods if len(pods) == count and all(pod_ready(p) for p in pods) else None

    pods = wait_for(all_ready, 120, f"{count} Ready replicas")
    placed = {p["spec"]["nodeName"]: p for p in pods}
    assert sorted(placed) == cluster.nodes, "one replica per node"
    for name, pod in placed.items():
        index = int(name.rsplit("-", 1)[1])
        assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(
            ports().net.node_subnet(index)
        )
    # a client on the last node fetches from the replica on the first, and through the Service
    first, last = placed[cluster.nodes[0]], cluster.nodes[-1]
    pin = {"nodeSelector": {"kubernetes.io/hostname": last}, "tolerations": [GPU_TOLERATION]}
    for client, url in (
        ("direct", f"http://{first['status']['podIP']}:8080/"),
        ("viasvc", f"http://web.{namespace}.svc/"),
    ):
        kubectl.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": client},
                "spec": {"terminationGracePeriodSeconds": 1, "containers": [fetcher(url)], **pin},
            },
            namespace,
        )
    assert answer_of(kubectl, namespace, "direct", "the cross-node answer") == (
        f"served-by {first['metadata']['name']}"
    )
    answer = answer_of(kubectl, namespace, "viasvc", "the answer through the Service")
    assert answer.removeprefix("served-by ") in {p["metadata"]["name"] for p in pods}
    assert (kubectl.get("pod", "direct", namespace) or {})["spec"]["nodeName"] == last


def answer_of(kubectl: Kubectl, namespace: str, client: str, what: str) -> str:
    """What the fetcher pod `client` got; a timeout says what it printed and where it stood
    (its retries name the error: a refused or unrouted connection, or no start at all)."""
    try:
        return wait_for(lambda: fetched(kubectl, namespace, client), 180, what)
    except WaitTimeout as exc:
        log = kubectl("logs", client, "-n", namespace, "--tail=5", check=False)
        status = (kubectl.get("pod", client, namespace) or {}).get("status")
        raise AssertionError(
            f"{exc}\nlog: {log.stdout[-800:]}{log.stderr[-300:]}\nstatus: {status}"
        ) from None


# --- local PersistentVolumes --------------------------------------------------------------


def test_a_claim_of_the_local_class_binds_on_its_first_pods_node_and_is_deleted_with_it(
    kubectl: Kubectl, namespace: str, cluster: ClusterInfo
) -> None:
    classes = kubectl.json("get", "storageclass")["items"]
    [default] = [
        c
        for c in classes
        if (c["metadata"].get("annotations") or {}).get(provisioner.ANN_DEFAULT_CLASS) == "true"
    ]
    assert default["metadata"]["name"] == provisioner.CLASS_NAME
    assert default["volumeBindingMode"] == "WaitForFirstConsumer"
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},  # no class: the default one
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "64Mi"}}},
    }
    kubectl.apply(claim, namespace)
    pvc = wait_for(lambda: kubectl.get("pvc", "data", namespace), 30, "the claim")
    assert pvc["spec"]["storageClassName"] == provisioner.CLASS_NAME
    # late binding: no volume until a pod uses the claim
    assert pvc["status"]["phase"] == "Pending" and not pvc["spec"].get("volumeName")

    # a pod that may go to any node (GPU nodes included) and uses the claim
    user = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "user"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "tolerations": [GPU_TOLERATION],
            "containers": [{"name": "c", "image": "x", "command": ["sleep", "3600"]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        },
    }
    kubectl.apply(user, namespace)
    bound = wait_for(
        lambda: (c := kubectl.get("pvc", "data", namespace)) and c["status"].get("phase") == "Bound" and c,
        120,
        "the claim Bound",
    )
    pv_name = bound["spec"]["volumeName"]
    pv = kubectl.json("get", "pv", pv_name)
    [term] = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    [node] = term["matchExpressions"][0]["values"]
    assert node in cluster.nodes
    path = Path(pv["spec"]["local"]["path"])
    assert path.is_dir() and path.parent == cluster.state_dir / "volumes"
    scheduled = wait_for(
        lambda: (p := kubectl.get("pod", "user", namespace)) and p["spec"].get("nodeName"),
        120,
        "the pod bound",
    )
    assert scheduled == node, "the pod runs where its volume is"

    # a second pod of the claim goes to the same node, even one it could otherwise avoid
    second = {**user, "metadata": {"name": "second"}}
    kubectl.apply(second, namespace)
    assert (
        wait_for(
            lambda: (p := kubectl.get("pod", "second", namespace)) and p["spec"].get("nodeName"),
            120,
            "the second pod bound",
        )
        == node
    )

    kubectl("delete", "pod", "user", "second", "-n", namespace, "--wait=true", timeout=120)
    kubectl("delete", "pvc", "data", "-n", namespace, "--wait=true", timeout=120)
    wait_for(
        lambda: kubectl("get", "pv", pv_name, check=False).returncode != 0 and not path.exists(),
        120,
        "the volume and its directory deleted",
    )

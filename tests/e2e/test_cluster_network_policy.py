"""NetworkPolicies are enforced: kube-network-policies judges pod traffic in the cluster's
gateway namespace, between pods of one node (bridged) and of two nodes (routed), to a pod's
address and through a Service."""

from __future__ import annotations

from typing import Any

import pytest

from pdwarden_localcluster import netpolicy
from pdwarden_localcluster.cluster import ClusterInfo, ports
from pdwarden_localcluster.waits import pod_ready, wait_for
from pdwarden_testkit.kubectl import Kubectl
from tests.e2e.test_cluster_network import fetched, fetcher, pod, ready_pod, server, service

pytestmark = pytest.mark.e2e

FRIEND = {"role": "friend"}
EVERY_TAINT = [{"operator": "Exists"}]  # a test pod may go to a tainted (GPU) node


def on_node(node: str) -> dict[str, Any]:
    return {"nodeSelector": {"kubernetes.io/hostname": node}, "tolerations": EVERY_TAINT}


def ingress_only_from(labels: dict[str, str]) -> dict[str, Any]:
    """Deny every ingress to the `app: web` pods but from pods labelled `labels`."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "web-ingress"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "web"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": labels}}]}],
        },
    }


def attempts(kubectl: Kubectl, ns: str, name: str) -> int:
    """How many of a fetcher's tries have failed so far."""
    out = kubectl("logs", name, "-n", ns, check=False).stdout
    return sum(1 for line in out.splitlines() if line.startswith("retry"))


def test_an_ingress_policy_admits_only_labelled_pods_on_one_node_and_across_nodes(
    cluster: ClusterInfo, kubectl: Kubectl, namespace: str
) -> None:
    here, *others = cluster.nodes
    kubectl.apply(pod("web", [server()], labels={"app": "web"}, **on_node(here)), namespace)
    kubectl.apply(service("web"), namespace)
    web = wait_for(lambda: ready_pod(kubectl, namespace, "web"), 60, "the web pod Ready")
    ip = web["status"]["podIP"]
    cluster_ip = kubectl.json("get", "service", "web", "-n", namespace)["spec"]["clusterIP"]

    kubectl.apply(ingress_only_from(FRIEND), namespace)
    netns = ports().net.gateway_netns
    # the enforcer judges web's connections once its node's controller has the policy
    wait_for(lambda: ip in netpolicy.judged_addresses(netns, here), 60, "web's address judged")

    # (name, node, url): a friend and a stranger each, on web's node and on another
    clients = [("near", here, f"http://{ip}:8080/"), ("near-svc", here, f"http://{cluster_ip}/")]
    if others:
        clients += [("far", others[0], f"http://{ip}:8080/"), ("far-svc", others[0], f"http://{cluster_ip}/")]
    for name, node, url in clients:
        kubectl.apply(pod(f"friend-{name}", [fetcher(url)], labels=FRIEND, **on_node(node)), namespace)
        kubectl.apply(pod(f"stranger-{name}", [fetcher(url)], **on_node(node)), namespace)
    for name, _, _ in clients:
        answer = wait_for(
            lambda n=name: fetched(kubectl, namespace, f"friend-{n}"),  # type: ignore[misc]
            90,
            f"friend-{name}'s answer",
        )
        assert answer == "served-by web"
    for name, _, _ in clients:
        stranger = f"stranger-{name}"
        wait_for(
            lambda s=stranger: attempts(kubectl, namespace, s) >= 2,  # type: ignore[misc]
            90,
            f"{stranger}'s refused attempts",
        )
        assert fetched(kubectl, namespace, stranger) is None, f"{stranger} got through the policy"
    # the kubelet's probes come from the node, which the policy does not shut out
    assert pod_ready(kubectl.get("pod", "web", namespace) or {}), "web lost readiness under the policy"

    kubectl("delete", "networkpolicy", "web-ingress", "-n", namespace)
    for name, _, _ in clients:
        answer = wait_for(
            lambda n=name: fetched(kubectl, namespace, f"stranger-{n}"),  # type: ignore[misc]
            90,
            f"stranger-{name}'s answer once the policy is gone",
        )
        assert answer == "served-by web"

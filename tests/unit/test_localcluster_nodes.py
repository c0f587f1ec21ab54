"""The local cluster's nodes (pure): which are GPU nodes, their CIDRs, labels, taints, capacity."""

from __future__ import annotations

import ipaddress

import pytest

from pdwarden_localcluster import network, topology
from pdwarden_localcluster.errors import ClusterError
from pdwarden_localcluster.kubelet.node import NodeShape, node_labels, node_spec, node_status

pytestmark = pytest.mark.unit


def test_cpu_nodes_come_first_and_the_rest_are_gpu_nodes() -> None:
    nodes = topology.plan(3, 1, 8)
    assert [(n.index, n.name, n.gpus) for n in nodes] == [
        (0, "pdwarden-node-0", 0),
        (1, "pdwarden-node-1", 8),
        (2, "pdwarden-node-2", 8),
    ]
    assert [n.is_gpu for n in nodes] == [False, True, True]


@pytest.mark.parametrize(
    ("nodes", "cpu_nodes", "gpus", "field"),
    [(0, 0, 8, "--nodes"), (16, 1, 8, "--nodes"), (2, 3, 8, "--cpu-nodes"), (2, 1, 0, "--gpus")],
)
def test_a_bad_node_count_names_its_setting(nodes: int, cpu_nodes: int, gpus: int, field: str) -> None:
    with pytest.raises(ClusterError, match=field):
        topology.plan(nodes, cpu_nodes, gpus)


def test_defaults_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PDWARDEN_CLUSTER_NODES", raising=False)
    monkeypatch.delenv("PDWARDEN_CLUSTER_CPU_NODES", raising=False)
    assert (topology.default_nodes(), topology.default_cpu_nodes(3)) == (3, 1)
    monkeypatch.setenv("PDWARDEN_CLUSTER_NODES", "5")
    monkeypatch.setenv("PDWARDEN_CLUSTER_CPU_NODES", "2")
    assert (topology.default_nodes(), topology.default_cpu_nodes(1)) == (5, 1)
    monkeypatch.setenv("PDWARDEN_CLUSTER_NODES", "three")
    with pytest.raises(ClusterError, match="PDWARDEN_CLUSTER_NODES"):
        topology.default_nodes()


def test_each_node_has_its_own_pod_cidr_inside_the_clusters_range() -> None:
    net = network.plan(40200)
    cidrs = [ipaddress.ip_network(net.node_subnet(n.index)) for n in topology.plan(network.MAX_NODES, 1, 8)]
    assert len(set(cidrs)) == network.MAX_NODES
    cluster = ipaddress.ip_network(net.pod_cidr)
    assert all(c.subnet_of(cluster) for c in cidrs)  # type: ignore[arg-type]
    assert all(c.subnet_of(ipaddress.ip_network("198.18.0.0/16")) for c in cidrs)  # type: ignore[arg-type]
    assert not any(a.overlaps(b) for i, a in enumerate(cidrs) for b in cidrs[i + 1 :])


def test_a_gpu_node_is_labelled_tainted_and_sized_like_one_with_the_device_plugin() -> None:
    shape = NodeShape(gpus=4, pod_cidr="198.18.33.0/24")
    labels = node_labels("n1", shape)
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/gpu.product"] == topology.GPU_PRODUCT
    assert labels["kubernetes.io/hostname"] == "n1"
    spec = node_spec(shape)
    assert spec["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    assert spec["podCIDR"] == "198.18.33.0/24" and spec["podCIDRs"] == ["198.18.33.0/24"]
    status = node_status("n1", "127.0.0.1", shape, "2026-01-01T00:00:00Z")
    assert status["capacity"]["nvidia.com/gpu"] == status["allocatable"]["nvidia.com/gpu"] == "4"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and ready["lastHeartbeatTime"]


def test_a_cpu_node_has_no_gpu_labels_taint_or_capacity() -> None:
    shape = NodeShape(gpus=0, pod_cidr="198.18.32.0/24")
    assert not any(k.startswith("nvidia.com/") for k in node_labels("n0", shape))
    assert "taints" not in node_spec(shape)
    assert "nvidia.com/gpu" not in node_status("n0", "127.0.0.1", shape, "x")["capacity"]

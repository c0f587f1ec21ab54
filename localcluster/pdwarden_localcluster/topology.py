"""Which nodes the local cluster has (pure): CPU nodes first, then GPU nodes.

A GPU cluster's usual shape: GPU nodes carry `nvidia.com/gpu` capacity, the labels of the
NVIDIA device plugin and GPU feature discovery, and the taint `nvidia.com/gpu=present:
NoSchedule`, so only pods that tolerate it (GPU workloads) land there; an untainted CPU node
takes the rest (the router, the operator). Node i is index i of the cluster network (its
pod CIDR is `NetPlan.node_subnet(i)`).

`PDWARDEN_CLUSTER_NODES` (all nodes) and `PDWARDEN_CLUSTER_CPU_NODES` (how many of them are
CPU-only) set the defaults of `pdwarden cluster up --nodes/--cpu-nodes`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pdwarden_localcluster.errors import ClusterError
from pdwarden_localcluster.network import MAX_NODES

NODE_PREFIX = "pdwarden-node"
DEFAULT_NODES = 3  # one CPU node and two GPU nodes: prefill and decode on distinct GPU nodes
DEFAULT_CPU_NODES = 1
DEFAULT_GPUS = 8
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TAINT_KEY = GPU_RESOURCE
GPU_TAINT_VALUE = "present"
GPU_TAINT_EFFECT = "NoSchedule"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
LOCAL_NODE_LABEL = "pdwarden.io/local-node"


@dataclass(frozen=True)
class NodeSpec:
    index: int  # the node's /24 within the cluster's pod range
    name: str
    gpus: int  # 0: a CPU node (untainted, no GPU labels)

    @property
    def is_gpu(self) -> bool:
        return self.gpus > 0


def gpu_taint() -> dict[str, str]:
    return {"key": GPU_TAINT_KEY, "value": GPU_TAINT_VALUE, "effect": GPU_TAINT_EFFECT}


def plan(nodes: int, cpu_nodes: int, gpus: int, prefix: str = NODE_PREFIX) -> list[NodeSpec]:
    """The cluster's nodes; a clear error names the setting that is out of range."""
    if not 1 <= nodes <= MAX_NODES:
        raise ClusterError(
            f"--nodes (PDWARDEN_CLUSTER_NODES) must be between 1 and {MAX_NODES} (got {nodes})"
        )
    if not 0 <= cpu_nodes <= nodes:
        raise ClusterError(
            f"--cpu-nodes (PDWARDEN_CLUSTER_CPU_NODES) must be between 0 and --nodes={nodes} "
            f"(got {cpu_nodes})"
        )
    if gpus < 1 and cpu_nodes < nodes:
        raise ClusterError(f"--gpus must be at least 1 on GPU nodes (got {gpus}); use --cpu-nodes={nodes}")
    return [NodeSpec(i, f"{prefix}-{i}", 0 if i < cpu_nodes else gpus) for i in range(nodes)]


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit():
        raise ClusterError(f"{name}={raw!r}: want a whole number")
    return int(raw)


def default_nodes() -> int:
    return _env_int("PDWARDEN_CLUSTER_NODES", DEFAULT_NODES)


def default_cpu_nodes(nodes: int) -> int:
    """At most `nodes` (a one-node cluster defaults to a single untainted CPU node)."""
    return min(_env_int("PDWARDEN_CLUSTER_CPU_NODES", DEFAULT_CPU_NODES), nodes)

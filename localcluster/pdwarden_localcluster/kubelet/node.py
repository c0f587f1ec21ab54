"""A Node object, its status heartbeat and its Lease in kube-node-lease."""

from __future__ import annotations

import datetime as dt
import logging
import platform
import threading
import time
from dataclasses import dataclass
from typing import Any

from pdwarden_localcluster import topology
from pdwarden_localcluster.kubeapi import ApiError, KubeApi

JSON = dict[str, Any]
log = logging.getLogger("pdwarden.kubelet")
LEASE_SECONDS = 40
LEASE_RENEW_S = 10.0
STATUS_EVERY_S = 30.0


@dataclass(frozen=True)
class NodeShape:
    cpu: str = "32"
    memory: str = "256Gi"
    pods: str = "110"
    ephemeral_storage: str = "100Gi"
    gpus: int = 8  # 0: a CPU node (untainted, no GPU labels)
    gpu_product: str = topology.GPU_PRODUCT
    pod_cidr: str = ""  # the node's /24 of the cluster's pod range (spec.podCIDR)
    kubelet_version: str = "v0.0.0"
    kubelet_port: int = 0  # the node's HTTPS endpoint for `kubectl logs`; 0 = none


def micro_time() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def seconds_time() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_labels(name: str, shape: NodeShape) -> dict[str, str]:
    """A node's labels; a GPU node's are those of the NVIDIA device plugin and GPU feature
    discovery, so selectors written for a GPU cluster behave the same here."""
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "topology.kubernetes.io/zone": "local",
        topology.LOCAL_NODE_LABEL: "true",
    }
    if shape.gpus <= 0:
        return labels | {
            "node.kubernetes.io/instance-type": "pdwarden-local-cpu",
            "node-role.kubernetes.io/cpu": "",
        }
    return labels | {
        "node.kubernetes.io/instance-type": "pdwarden-local-gpu",
        "node-role.kubernetes.io/gpu": "",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.count": str(shape.gpus),
        "nvidia.com/gpu.product": shape.gpu_product,
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.machine": "pdwarden-local",
    }


def node_spec(shape: NodeShape) -> JSON:
    """The spec a node registers with: its pod CIDR and, on a GPU node, the GPU taint (set at
    registration only, like a kubelet's --register-with-taints: an admin may remove it)."""
    spec: JSON = {}
    if shape.pod_cidr:
        spec |= {"podCIDR": shape.pod_cidr, "podCIDRs": [shape.pod_cidr]}
    if shape.gpus > 0:
        spec["taints"] = [topology.gpu_taint()]
    return spec


def node_status(name: str, node_ip: str, shape: NodeShape, ready_since: str) -> JSON:
    resources = {
        "cpu": shape.cpu,
        "memory": shape.memory,
        "pods": shape.pods,
        "ephemeral-storage": shape.ephemeral_storage,
    }
    if shape.gpus > 0:
        resources[topology.GPU_RESOURCE] = str(shape.gpus)
    beat = seconds_time()

    def cond(ctype: str, status: str, reason: str, message: str) -> JSON:
        return {
            "type": ctype,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": beat,
            "lastTransitionTime": ready_since,
        }

    return {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            cond(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            cond("Ready", "True", "KubeletReady", "pdwarden process kubelet is posting ready status"),
        ],
        # the apiserver reaches the kubelet (kubectl logs) by the first address type it prefers;
        # every node lives on this host, so its Hostname address is one that resolves here
        "addresses": [
            {"type": "InternalIP", "address": node_ip},
            {"type": "Hostname", "address": "localhost"},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": shape.kubelet_port}},
        "nodeInfo": {
            "machineID": name,
            "systemUUID": name,
            "bootID": ready_since,
            "kernelVersion": platform.release(),
            "osImage": "pdwarden local cluster",
            "containerRuntimeVersion": "pdwarden-process://0.1",
            "kubeletVersion": shape.kubelet_version,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


class NodeAgent:
    def __init__(
        self,
        api: KubeApi,
        name: str,
        node_ip: str,
        shape: NodeShape,
        *,
        labels: dict[str, str] | None = None,
        spec: JSON | None = None,
    ) -> None:
        """`labels` and `spec` replace the local node's (node_labels, node_spec): a simulated
        node (the test kit's fleet) is not one of the cluster's own nodes."""
        self.api, self.name, self.node_ip, self.shape = api, name, node_ip, shape
        self.labels = labels if labels is not None else node_labels(name, shape)
        self.spec = spec if spec is not None else node_spec(shape)
        self.ready_since = seconds_time()
        self.uid = ""

    def register(self) -> None:
        node = self.api.get_or_none(f"/api/v1/nodes/{self.name}")
        if node is None:
            try:
                node = self.api.post(
                    "/api/v1/nodes",
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "metadata": {"name": self.name, "labels": self.labels},
                        "spec": self.spec,
                    },
                )
            except ApiError as exc:
                if exc.status != 409:
                    raise
                node = self.api.get(f"/api/v1/nodes/{self.name}")
        else:
            self.api.merge_patch(f"/api/v1/nodes/{self.name}", {"metadata": {"labels": self.labels}})
        self.uid = node["metadata"]["uid"]
        self.heartbeat()
        self.renew_lease()

    def heartbeat(self) -> None:
        self.api.merge_patch(
            f"/api/v1/nodes/{self.name}/status",
            {"status": node_status(self.name, self.node_ip, self.shape, self.ready_since)},
        )

    def renew_lease(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": micro_time()}
        try:
            self.api.merge_patch(path, {"spec": spec})
        except ApiError as exc:
            if exc.status != 404:
                raise
            self.api.post(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {
                        "name": self.name,
                        "namespace": "kube-node-lease",
                        "ownerReferences": [
                            {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": self.uid}
                        ],
                    },
                    "spec": spec,
                },
            )

    def heartbeat_forever(self, stop: threading.Event) -> None:
        """Renew the Lease every LEASE_RENEW_S and post the status every STATUS_EVERY_S until
        `stop`; a failed beat is logged and tried again at the next one."""
        last_status = time.monotonic()
        while not stop.wait(LEASE_RENEW_S):
            try:
                self.renew_lease()
                if time.monotonic() - last_status >= STATUS_EVERY_S:
                    self.heartbeat()
                    last_status = time.monotonic()
            except ApiError as exc:
                log.warning("node %s heartbeat: %s", self.name, exc)
            except Exception:
                log.exception("node %s heartbeat failed; retrying", self.name)

"""A Deployment's count through its scale subresource, and which pod its ReplicaSet removes
first (the autoscaler's only write paths)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pdwarden_operator.kube.client import KubeClient, resource_path

# The ReplicaSet controller removes the pods of lowest cost first (among pods equally ready).
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
REMOVE_FIRST_COST = str(-(2**31))


@dataclass(frozen=True)
class Scale:
    replicas: int
    resource_version: str

    @classmethod
    def of(cls, body: dict[str, Any]) -> Scale:
        """A Scale (autoscaling/v1) or a Deployment body's count and version."""
        replicas = (body.get("spec") or {}).get("replicas")
        version = (body.get("metadata") or {}).get("resourceVersion")
        return cls(replicas if isinstance(replicas, int) else 0, str(version or ""))


def _path(namespace: str, deployment: str) -> str:
    return resource_path("apps/v1", "Deployment", namespace, deployment) + "/scale"


async def read(client: KubeClient, namespace: str, deployment: str) -> Scale:
    return Scale.of(await client.request("GET", _path(namespace, deployment)))


async def write(
    client: KubeClient, namespace: str, deployment: str, replicas: int, resource_version: str
) -> Scale:
    """Set the count if the Deployment is still at `resource_version` (409 otherwise: someone
    changed it since it was read, and the next round decides again)."""
    body = {"metadata": {"resourceVersion": resource_version}, "spec": {"replicas": replicas}}
    answer = await client.request(
        "PATCH", _path(namespace, deployment), body=body, content_type="application/merge-patch+json"
    )
    return Scale.of(answer)


async def mark(client: KubeClient, namespace: str, pod: str, uid: str, cost: str | None) -> None:
    """Set the pod's deletion cost (None: remove it), if the name still has the pod `uid`
    (409 otherwise)."""
    await client.request(
        "PATCH",
        resource_path("v1", "Pod", namespace, pod),
        body={"metadata": {"uid": uid, "annotations": {POD_DELETION_COST: cost}}},
        content_type="application/merge-patch+json",
    )

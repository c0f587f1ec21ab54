"""The leader-election Lease (coordination.k8s.io/v1): read it, create it, replace it.

The leader elector calls these with its own connection (leader.py).
"""

from __future__ import annotations

from typing import Any

from pdwarden_operator.kube.client import KubeApiError, KubeClient, resource_path

Obj = dict[str, Any]
LEASE_API_VERSION = "coordination.k8s.io/v1"


async def get_lease(client: KubeClient, namespace: str, name: str) -> Obj | None:
    """The Lease, or None when it does not exist."""
    try:
        return await client.request("GET", resource_path(LEASE_API_VERSION, "Lease", namespace, name))
    except KubeApiError as exc:
        if exc.not_found:
            return None
        raise


async def create_lease(client: KubeClient, namespace: str, name: str, spec: Obj) -> Obj:
    """Create the Lease; 409 (AlreadyExists) when another replica was faster."""
    body = {"apiVersion": LEASE_API_VERSION, "kind": "Lease", "metadata": {"name": name}, "spec": spec}
    return await client.request("POST", resource_path(LEASE_API_VERSION, "Lease", namespace), body=body)


async def replace_lease(
    client: KubeClient, namespace: str, name: str, resource_version: str, spec: Obj
) -> Obj:
    """Replace the Lease's spec if it is still at `resource_version` (else 409 Conflict)."""
    body = {
        "apiVersion": LEASE_API_VERSION,
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": resource_version},
        "spec": spec,
    }
    return await client.request("PUT", resource_path(LEASE_API_VERSION, "Lease", namespace, name), body=body)

"""The leader-election Lease (coordination.k8s.io/v1): read it, create it, replace it.

`client`: the connection to use (the leader elector has one of its own); None: the process's.
"""

from __future__ import annotations

from typing import Any

from pdwarden_operator.kube.client import KubeApiError, KubeClient, get_client, resource_path

Obj = dict[str, Any]
LEASE_API_VERSION = "coordination.k8s.io/v1"


async def get_lease(namespace: str, name: str, *, client: KubeClient | None = None) -> Obj | None:
    """The Lease, or None when it does not exist."""
    try:
        return await (client or get_client()).request(
            "GET", resource_path(LEASE_API_VERSION, "Lease", namespace, name)
        )
    except KubeApiError as exc:
        if exc.not_found:
            return None
        raise


async def create_lease(namespace: str, name: str, spec: Obj, *, client: KubeClient | None = None) -> Obj:
    """Create the Lease; 409 (AlreadyExists) when another replica was faster."""
    body = {"apiVersion": LEASE_API_VERSION, "kind": "Lease", "metadata": {"name": name}, "spec": spec}
    return await (client or get_client()).request(
        "POST", resource_path(LEASE_API_VERSION, "Lease", namespace), body=body
    )


async def replace_lease(
    namespace: str, name: str, resource_version: str, spec: Obj, *, client: KubeClient | None = None
) -> Obj:
    """Replace the Lease's spec if it is still at `resource_version` (else 409 Conflict)."""
    body = {
        "apiVersion": LEASE_API_VERSION,
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": resource_version},
        "spec": spec,
    }
    return await (client or get_client()).request(
        "PUT", resource_path(LEASE_API_VERSION, "Lease", namespace, name), body=body
    )

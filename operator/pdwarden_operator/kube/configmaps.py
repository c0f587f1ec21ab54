"""The ConfigMap in which the watchdog lists a model's gone runtime pods."""

from __future__ import annotations

from typing import Any

from pdwarden_operator.kube import apply as kube_apply
from pdwarden_operator.kube.client import KubeApiError, KubeClient, resource_path

Obj = dict[str, Any]


async def read(client: KubeClient, namespace: str, name: str) -> Obj | None:
    """The ConfigMap, None when it does not exist."""
    return await kube_apply.get(client, "v1", "ConfigMap", namespace, name)


async def write(client: KubeClient, obj: Obj) -> None:
    """Create or update the ConfigMap pdwarden owns (server-side apply, with force: the caller
    has made sure that one of that name, if any, is the model's)."""
    await kube_apply.apply(client, obj)


async def pod_gone(client: KubeClient, namespace: str, name: str, uid: str) -> bool:
    """True when no pod of that name exists, or another pod (another UID) holds the name."""
    try:
        pod = await client.request("GET", resource_path("v1", "Pod", namespace, name))
    except KubeApiError as exc:
        if exc.not_found:
            return True
        raise
    return str((pod.get("metadata") or {}).get("uid") or "") != uid

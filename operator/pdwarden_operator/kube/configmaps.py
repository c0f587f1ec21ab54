"""The ConfigMap in which the watchdog lists a model's gone runtime pods."""

from __future__ import annotations

from typing import Any

from pdwarden_operator.kube import apply as kube_apply
from pdwarden_operator.kube.client import KubeApiError, get_client, resource_path

Obj = dict[str, Any]


async def read_key(namespace: str, name: str, key: str) -> str | None:
    """One key of the ConfigMap, None when it (or the key) does not exist."""
    obj = await kube_apply.get("v1", "ConfigMap", namespace, name)
    return None if obj is None else (obj.get("data") or {}).get(key)


async def write(obj: Obj) -> None:
    """Create or update the ConfigMap pdwarden owns (server-side apply)."""
    await kube_apply.apply(obj)


async def pod_gone(namespace: str, name: str, uid: str) -> bool:
    """True when no pod of that name exists, or another pod (another UID) holds the name."""
    try:
        pod = await get_client().request("GET", resource_path("v1", "Pod", namespace, name))
    except KubeApiError as exc:
        if exc.not_found:
            return True
        raise
    return str((pod.get("metadata") or {}).get("uid") or "") != uid

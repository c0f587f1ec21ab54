"""The API call behind DisaggregatedModel status writes (status_writer.py decides their content)."""

from __future__ import annotations

from typing import Any

import pdwarden_contract as contract
from pdwarden_operator.kube import apply as kube_apply
from pdwarden_operator.kube.client import KubeApiError, KubeClient, resource_path

DM_API_VERSION = f"{contract.API_GROUP}/{contract.API_VERSION}"


async def patch_status(
    client: KubeClient,
    namespace: str,
    name: str,
    patch: dict[str, Any],
    *,
    resource_version: str | None = None,
) -> None:
    """JSON merge patch of .status: keys in `patch` are replaced, other keys are kept.

    Lists (conditions, remediations) are replaced whole, so pass complete lists. With
    `resource_version`, the API server applies the patch only to that version of the object
    (compare-and-swap): a write by anyone else since it was read fails with 409.
    """
    path = resource_path(DM_API_VERSION, contract.KIND, namespace, name) + "/status"
    body: dict[str, Any] = {"status": patch}
    if resource_version is not None:
        body["metadata"] = {"resourceVersion": resource_version}
    await client.request("PATCH", path, body=body, content_type="application/merge-patch+json")


async def still_exists(client: KubeClient, namespace: str, name: str, uid: str) -> bool:
    """Whether the model with this UID still exists; True when the API server cannot tell.

    For a model whose writes fail with 404 while no deletion event came: kopf stops watching a
    namespace that matched a pattern as soon as its deletion starts, before the models in it
    are deleted. A model of the same name with another UID is another model.
    """
    try:
        current = await kube_apply.get(client, DM_API_VERSION, contract.KIND, namespace, name)
    except KubeApiError:
        return True
    return current is not None and (current.get("metadata") or {}).get("uid") == uid

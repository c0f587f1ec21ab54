"""The single writer of DisaggregatedModel status (the reconciler and the watchdog both go through it)."""

from __future__ import annotations

from typing import Any

from pdwarden_operator.kube.client import get_client, resource_path
from pdwarden_runtime import contract

DM_API_VERSION = f"{contract.API_GROUP}/{contract.API_VERSION}"


async def patch_status(namespace: str, name: str, patch: dict[str, Any]) -> None:
    """JSON merge patch of .status: keys in `patch` are replaced, other keys are kept.

    Lists (conditions, remediations) are replaced whole, so pass complete lists.
    """
    path = resource_path(DM_API_VERSION, contract.KIND, namespace, name) + "/status"
    await get_client().request(
        "PATCH", path, body={"status": patch}, content_type="application/merge-patch+json"
    )

"""Runtime pods: list them, delete one, evict one (the watchdog's only write paths to pods)."""

from __future__ import annotations

from typing import Any, Literal

from pdwarden_operator.kube.client import KubeApiError, get_client, resource_path
from pdwarden_runtime import contract

Obj = dict[str, Any]
# What a delete or eviction came to.
PodActionOutcome = Literal["done", "gone", "refused-by-pdb"]


def runtime_selector(model: str) -> str:
    roles = ",".join(contract.RUNTIME_ROLES)
    return f"{contract.LABEL_MODEL}={model},{contract.LABEL_ROLE} in ({roles})"


async def list_runtime_pods(namespace: str, model: str) -> list[Obj]:
    """The prefill and decode pods of one DisaggregatedModel."""
    body = await get_client().request(
        "GET", resource_path("v1", "Pod", namespace), query=[("labelSelector", runtime_selector(model))]
    )
    return list(body.get("items") or [])


async def delete_pod(namespace: str, name: str, uid: str) -> PodActionOutcome:
    """Delete the pod if it is still the one with `uid` (its controller recreates it)."""
    try:
        await get_client().request(
            "DELETE",
            resource_path("v1", "Pod", namespace, name),
            body={"preconditions": {"uid": uid}} if uid else {},
        )
    except KubeApiError as exc:
        if exc.not_found or (exc.status == 409 and uid):  # gone, or the name now belongs to another pod
            return "gone"
        raise
    return "done"


async def evict_pod(namespace: str, name: str, uid: str) -> PodActionOutcome:
    """Ask the Eviction API to evict the pod; a PodDisruptionBudget refusal is reported, not bypassed."""
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": uid}} if uid else {},
    }
    try:
        await get_client().request(
            "POST", resource_path("v1", "Pod", namespace, name) + "/eviction", body=eviction
        )
    except KubeApiError as exc:
        if exc.status == 429:  # the disruption budget does not allow it now
            return "refused-by-pdb"
        if exc.not_found or (exc.status == 409 and uid):
            return "gone"
        raise
    return "done"

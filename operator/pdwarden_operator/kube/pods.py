"""Runtime pods: list them, delete one, evict one (the watchdog's only write paths to pods)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Final, Literal

import pdwarden_contract as contract
from pdwarden_operator.kube import apply as kube_apply
from pdwarden_operator.kube.client import KubeApiError, KubeClient, resource_path

Obj = dict[str, Any]
# What a delete or eviction came to.
PodActionOutcome = Literal["done", "gone", "refused-by-pdb", "throttled"]
# The cause type the Eviction API puts in its 429 when a PodDisruptionBudget refuses
# (policy/v1 DisruptionBudgetCause); any other 429 is the API server's rate limiting.
DISRUPTION_BUDGET_CAUSE = "DisruptionBudget"


def eviction_refusal(exc: KubeApiError) -> PodActionOutcome | None:
    """A 429 from the Eviction API told apart: a disruption budget, or throttling."""
    if exc.status != 429:
        return None
    if DISRUPTION_BUDGET_CAUSE in exc.causes or "disruption budget" in exc.message:
        return "refused-by-pdb"
    return "throttled"


# Every model's runtime pods (the watchdog's pod watch and its namespace listings).
RUNTIME_PODS_SELECTOR = (
    f"{contract.LABEL_MODEL},{contract.LABEL_ROLE} in "
    f"({','.join((*contract.RUNTIME_ROLES, contract.ROLE_QUARANTINED))})"
)
# A namespace's runtime pods are listed this many a page. A page is decoded whole, about 30 KB
# a pod: ten thousand pods in one answer held some 300 MB at once, and the operator's memory
# stayed fragmented by it long after.
LIST_PAGE_PODS: Final = 500


def list_namespace_runtime_pods(
    client: KubeClient, namespace: str, page_size: int = LIST_PAGE_PODS
) -> AsyncIterator[list[Obj]]:
    """Every model's runtime pods in the namespace: one LIST, `page_size` a page."""
    return kube_apply.list_pages(client, "v1", "Pod", namespace, RUNTIME_PODS_SELECTOR, page_size=page_size)


async def delete_pod(client: KubeClient, namespace: str, name: str, uid: str) -> PodActionOutcome:
    """Delete the pod if it is still the one with `uid` (its controller recreates it)."""
    try:
        await client.request(
            "DELETE",
            resource_path("v1", "Pod", namespace, name),
            body={"preconditions": {"uid": uid}} if uid else {},
        )
    except KubeApiError as exc:
        if exc.not_found or (exc.status == 409 and uid):  # gone, or the name now belongs to another pod
            return "gone"
        raise
    return "done"


async def label_pod(client: KubeClient, namespace: str, name: str, uid: str, labels: dict[str, str]) -> None:
    """Add labels to the pod if it is still the one with `uid` (a 409 otherwise)."""
    await client.request(
        "PATCH",
        resource_path("v1", "Pod", namespace, name),
        body={"metadata": {"uid": uid, "labels": labels}},
        content_type="application/merge-patch+json",
    )


async def quarantine_pod(
    client: KubeClient, namespace: str, name: str, uid: str, owner: Obj, quarantined_at: str
) -> PodActionOutcome:
    """Take the pod out of its Deployment's selector and the router's discovery (its role label
    becomes `quarantined`; the role it served and why are labels, when an annotation) and give
    it the model as owner: its ReplicaSet releases it, and garbage collection must still reach
    it. Idempotent; the uid in the patch is a precondition (409: another pod has the name)."""
    try:
        pod = await client.request("GET", resource_path("v1", "Pod", namespace, name))
        meta = pod.get("metadata") or {}
        if uid and meta.get("uid") != uid:
            return "gone"
        await client.request(
            "PATCH",
            resource_path("v1", "Pod", namespace, name),
            body=quarantine_patch(meta, uid, owner, quarantined_at),
            content_type="application/strategic-merge-patch+json",
        )
    except KubeApiError as exc:
        if exc.not_found or (exc.status == 409 and uid):
            return "gone"
        raise
    return "done"


def quarantine_patch(meta: Obj, uid: str, owner: Obj, quarantined_at: str) -> Obj:
    """The strategic-merge patch that quarantines a pod whose metadata is `meta`. Pure."""
    labels = {
        contract.LABEL_ROLE: contract.ROLE_QUARANTINED,
        contract.LABEL_QUARANTINE_REASON: contract.QUARANTINE_REASON_WEDGED,
    }
    served = (meta.get("labels") or {}).get(contract.LABEL_ROLE)
    if served in contract.RUNTIME_ROLES:
        labels[contract.LABEL_QUARANTINED_ROLE] = served
    annotations = {contract.ANNOTATION_QUARANTINED_AT: quarantined_at}
    if (meta.get("annotations") or {}).get(contract.ANNOTATION_QUARANTINED_AT):
        annotations = {}  # a resumed quarantine keeps its first time
    patch: Obj = {
        "metadata": {
            "labels": labels,
            "annotations": annotations,
            # merged by uid: added next to the ReplicaSet's reference, never replacing it
            "ownerReferences": [{**owner, "controller": False, "blockOwnerDeletion": False}],
        }
    }
    if uid:
        patch["metadata"]["uid"] = uid  # a precondition: 409 when the name has another pod
    return patch


class EvictionRefused(Exception):
    """The Eviction API answered 429: `outcome` says why; `retry_after` when it said when."""

    def __init__(self, outcome: PodActionOutcome, retry_after: float | None) -> None:
        super().__init__(f"eviction {outcome}" + (f", retry after {retry_after:g}s" if retry_after else ""))
        self.outcome = outcome
        self.retry_after = retry_after


async def evict_pod(client: KubeClient, namespace: str, name: str, uid: str) -> PodActionOutcome:
    """Ask the Eviction API to evict the pod. A 429 (a PodDisruptionBudget's refusal, or
    throttling) raises EvictionRefused: it is retried later, never bypassed."""
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": uid}} if uid else {},
    }
    try:
        await client.request("POST", resource_path("v1", "Pod", namespace, name) + "/eviction", body=eviction)
    except KubeApiError as exc:
        refusal = eviction_refusal(exc)
        if refusal is not None:
            raise EvictionRefused(refusal, exc.retry_after) from exc
        if exc.not_found or (exc.status == 409 and uid):
            return "gone"
        raise
    return "done"


async def mark_only(client: KubeClient, namespace: str, pod: str, label: str) -> None:
    """`label: "true"` on `pod` and on no other pod of the namespace (a Service that selects
    the label then reaches that pod alone: the leader, for the external metrics API)."""
    marked = await client.request(
        "GET", resource_path("v1", "Pod", namespace), query=[("labelSelector", f"{label}=true")]
    )
    for other in marked.get("items") or []:
        meta = other.get("metadata") or {}
        if meta.get("name") != pod:
            await client.request(
                "PATCH",
                resource_path("v1", "Pod", namespace, meta.get("name")),
                body={"metadata": {"uid": meta.get("uid"), "labels": {label: None}}},
                content_type="application/merge-patch+json",
            )
    await client.request(
        "PATCH",
        resource_path("v1", "Pod", namespace, pod),
        body={"metadata": {"labels": {label: "true"}}},
        content_type="application/merge-patch+json",
    )

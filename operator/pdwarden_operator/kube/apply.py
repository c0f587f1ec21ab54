"""Server-side apply with one field manager, and the reads of objects the operator needs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from pdwarden_operator.kube.client import KubeApiError, KubeClient, object_path, resource_path

Obj = dict[str, Any]
FIELD_MANAGER = "pdwarden"
# A read answered from the API server's watch cache instead of a quorum read from etcd.
_FROM_WATCH_CACHE = ("resourceVersion", "0")


async def apply(client: KubeClient, obj: Obj, *, dry_run: bool = False) -> Obj:
    """Create or update `obj` so that pdwarden owns exactly the fields it sets.

    force=True takes back fields someone changed by hand (drift is undone, not argued with).
    Strict field validation: an unknown field is an error, never silently dropped. dry_run:
    the API server validates and admits the object but stores nothing.
    """
    query = [("fieldManager", FIELD_MANAGER), ("force", "true"), ("fieldValidation", "Strict")]
    if dry_run:
        query.append(("dryRun", "All"))
    return await client.request(
        "PATCH",
        object_path(obj),
        body=obj,
        query=query,
        content_type="application/apply-patch+yaml",
    )


async def get(
    client: KubeClient,
    api_version: str,
    kind: str,
    namespace: str | None,
    name: str,
    *,
    from_watch_cache: bool = False,
) -> Obj | None:
    """The object, or None when it does not exist. `from_watch_cache`: the API server answers
    from its watch cache (resourceVersion=0) instead of a quorum read from etcd: a read that
    may be a moment old, at a fraction of the cost."""
    query = [_FROM_WATCH_CACHE] if from_watch_cache else None
    try:
        return await client.request("GET", resource_path(api_version, kind, namespace, name), query=query)
    except KubeApiError as exc:
        if exc.not_found:
            return None
        raise


async def list_objects(
    client: KubeClient,
    api_version: str,
    kind: str,
    namespace: str | None,
    label_selector: str | None = None,
    *,
    from_watch_cache: bool = False,
) -> list[Obj]:
    """The objects of one namespace, or of every namespace when `namespace` is None.
    `from_watch_cache`: answered from the API server's watch cache, as `get` explains."""
    query = [("labelSelector", label_selector)] if label_selector else []
    if from_watch_cache:
        query.append(_FROM_WATCH_CACHE)
    body = await client.request("GET", _list_path(api_version, kind, namespace), query=query)
    return list(body.get("items") or [])


async def list_pages(
    client: KubeClient,
    api_version: str,
    kind: str,
    namespace: str | None,
    label_selector: str | None,
    *,
    page_size: int,
) -> AsyncIterator[list[Obj]]:
    """The objects as `list_objects` lists them, `page_size` a page: one LIST whose pages the
    API server's continue token keeps one snapshot. A page is decoded whole, so a caller that
    handles each before the next holds one page at a time, however many objects match."""
    query = [("limit", str(page_size))]
    if label_selector:
        query.append(("labelSelector", label_selector))
    path = _list_path(api_version, kind, namespace)
    token = ""
    while True:
        body = await client.request("GET", path, query=[*query, *([("continue", token)] if token else [])])
        token = str((body.get("metadata") or {}).get("continue") or "")
        page = list(body.get("items") or [])
        del body  # the page is all the caller holds while the next one is on the wire
        yield page
        if not token:
            return


def _list_path(api_version: str, kind: str, namespace: str | None) -> str:
    return resource_path(api_version, kind, namespace, all_namespaces=namespace is None)


async def delete(client: KubeClient, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
    """Delete (background propagation); False when it was already gone."""
    try:
        await client.request(
            "DELETE",
            resource_path(api_version, kind, namespace, name),
            body={"propagationPolicy": "Background"},
        )
    except KubeApiError as exc:
        if exc.not_found:
            return False
        raise
    return True


async def create(client: KubeClient, obj: Obj, *, dry_run: bool = False) -> Obj:
    """Create `obj` (409 when it exists); strict field validation. A dry run tells whether a
    name is taken to a caller that may create but not read such objects."""
    meta = obj["metadata"]
    path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"))
    query = [("fieldValidation", "Strict"), *([("dryRun", "All")] if dry_run else [])]
    return await client.request("POST", path, body=obj, query=query)


async def replace(client: KubeClient, obj: Obj) -> Obj:
    """Replace `obj` whole (PUT): fields it lacks are removed, whoever set them. Its
    metadata.resourceVersion makes it a compare-and-swap (409 when the object changed since)."""
    query = [("fieldValidation", "Strict")]
    return await client.request("PUT", object_path(obj), body=obj, query=query)

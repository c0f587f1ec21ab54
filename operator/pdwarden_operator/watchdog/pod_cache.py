"""Every model's runtime pods from one watch, for the watchdog's rounds.

A round used to LIST its model's pods each scrape interval: a thousand models at 10 s is a
hundred LISTs a second with nothing changed. The pods now come from one watch the API server
filters by label (kopf_handlers.py). The watch resumes from its last resourceVersion across
reconnects; when that version has expired, kopf lists the pods again, and a listing reports
the pods there are, not those deleted in the gap: so after such a listing (its events have no
type) the cache lists the namespace itself on the next round, and besides once per
`RELIST_AFTER_S`, which bounds how long a pod that is gone can linger here. Events that arrive
while a listing is in flight are applied over it, so the listing never brings back a pod
deleted meanwhile. A pod listed (by kopf or by the cache) with the cached copy's
resourceVersion keeps that copy: at 10,000 pods a listing then costs the decoding of its
pages, not a second copy of the fleet.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import pdwarden_contract as contract
from pdwarden_operator.kube import scale as kube_scale

Obj = dict[str, Any]
Lister = Callable[[str], AsyncIterator[list[Obj]]]  # namespace -> its runtime pods (one LIST, in pages)
RELIST_AFTER_S: Final = 900.0


# What the watchdog reads of a pod, and nothing else: at 10,000 pods a cached pod's size is
# most of the operator's memory. Readers: targets.py (view, metrics URL, addresses),
# gone_pods.py, ownership.py, group_health.py (ranks, restarts, age) and the scaler (the
# deletion cost of a pod it picked to remove).
_KEPT_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "labels",
    "ownerReferences",
    "deletionTimestamp",
    "creationTimestamp",
)
_KEPT_ANNOTATIONS = (contract.ANNOTATION_QUARANTINED_AT, kube_scale.POD_DELETION_COST)
_KEPT_STATUS = ("phase", "podIP", "podIPs")


def _interned(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """Labels and the like repeat across a model's pods: one copy of each key and value."""
    return {sys.intern(str(k)): sys.intern(v) if isinstance(v, str) else v for k, v in mapping.items()}


# Parts of a slim pod that repeat across a namespace's pods (a ReplicaSet's labels, owner and
# containers; a ready pod's conditions): one copy of each, from the namespace's table, about 3 KB
# a pod less. A shared part is never changed in place: an event replaces a pod's whole copy.
_SHARED = (
    ("metadata", "labels"),
    ("metadata", "ownerReferences"),
    ("metadata", "annotations"),
    ("spec", "containers"),
    ("status", "conditions"),
    ("status", "containerStatuses"),
)
# More distinct parts than this and the table starts afresh (pods keep the parts they have):
# a namespace's table is otherwise renewed with each listing.
MAX_SHARED_PARTS: Final = 10_000


def _frozen(value: Any) -> Hashable:
    """A hashable twin of a JSON value; equal only for values of the same types (True is not 1)."""
    if isinstance(value, Mapping):
        return (dict, tuple((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list):
        return (list, tuple(_frozen(v) for v in value))
    return (type(value), value)


def share_parts(pod: Obj, table: dict[Hashable, Any]) -> Obj:
    """`pod` (a slim copy) with its repeating parts replaced by the table's equal ones."""
    if len(table) > MAX_SHARED_PARTS:
        table.clear()
    for section, key in _SHARED:
        part = pod[section].get(key)
        if part is not None:
            pod[section][key] = table.setdefault(_frozen(part), part)
    return pod


def _container_status(status: Mapping[str, Any]) -> Obj:
    """A container's name, restart count, and how it last ended (its `terminated` states)."""
    out: Obj = {"name": status.get("name"), "restartCount": status.get("restartCount")}
    for key in ("state", "lastState"):
        terminated = (status.get(key) or {}).get("terminated")
        if terminated:
            out[key] = {"terminated": dict(terminated)}
    return out


def _metrics_port(port: Any) -> bool:
    return isinstance(port, Mapping) and port.get("name") == contract.PORT_NAME_METRICS


def slim_pod(pod: Mapping[str, Any]) -> Obj:
    """What the watchdog reads of a pod (see _KEPT_METADATA): its identity, labels, owners,
    the annotations it reads, each container's metrics port, its phase,
    addresses, conditions and container restarts."""
    meta = pod.get("metadata") or {}
    slim_meta: Obj = {sys.intern(k): meta[k] for k in _KEPT_METADATA if k in meta}
    if isinstance(meta.get("labels"), Mapping):
        slim_meta["labels"] = _interned(meta["labels"])
    if isinstance(meta.get("ownerReferences"), list):
        slim_meta["ownerReferences"] = [
            _interned(r) if isinstance(r, Mapping) else r for r in meta["ownerReferences"]
        ]
    annotations = meta.get("annotations") or {}
    slim_meta["annotations"] = {k: annotations[k] for k in _KEPT_ANNOTATIONS if k in annotations}
    spec = pod.get("spec") or {}
    containers = [
        {"name": c.get("name"), "ports": [p for p in c.get("ports") or [] if _metrics_port(p)]}
        for c in spec.get("containers") or []
        if isinstance(c, Mapping)
    ]
    status = pod.get("status") or {}
    slim_status: Obj = {k: status[k] for k in _KEPT_STATUS if k in status}
    slim_status["conditions"] = [
        _interned({"type": c.get("type"), "status": c.get("status")})
        for c in status.get("conditions") or []
        if isinstance(c, Mapping)
    ]
    slim_status["containerStatuses"] = [
        _container_status(c) for c in status.get("containerStatuses") or [] if isinstance(c, Mapping)
    ]
    return {"metadata": slim_meta, "spec": {"containers": containers}, "status": slim_status}


@dataclass
class _Namespace:
    by_model: dict[str, dict[str, Obj]] = field(default_factory=dict)  # model -> uid -> pod
    model_of: dict[str, str] = field(default_factory=dict)  # uid -> model
    shared: dict[Hashable, Any] = field(default_factory=dict)  # share_parts' table
    listed_at: float | None = None
    # the watch listed the pods again since this cache's last listing (a deletion in the
    # watch's gap may be unseen): the next round lists the namespace
    watch_listed: bool = False
    # events seen while a listing is in flight: replayed over it
    during_list: list[tuple[str | None, Obj]] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def pod(self, uid: str) -> Obj | None:
        """The cached copy of the pod with `uid`, if any."""
        return self.by_model.get(self.model_of.get(uid, ""), {}).get(uid)

    def slimmed(self, pod: Mapping[str, Any], *, listed: bool) -> Obj:
        """What the cache keeps of `pod`: a slim copy sharing its parts through this
        namespace's table, or, for a pod from a listing (kopf's or this cache's, which repeats
        every unchanged pod), its cached copy when that has the same resourceVersion."""
        if listed:
            meta = pod.get("metadata") or {}
            cached = self.pod(str(meta.get("uid", "")))
            version = meta.get("resourceVersion")
            if cached is not None and version and cached["metadata"].get("resourceVersion") == version:
                return cached
        return share_parts(slim_pod(pod), self.shared)


class PodCache:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._namespaces: dict[str, _Namespace] = {}
        self._clock = clock

    def _ns(self, namespace: str) -> _Namespace:
        return self._namespaces.setdefault(namespace, _Namespace())

    def event(self, event_type: str | None, pod: Mapping[str, Any]) -> None:
        """A watch event (None: kopf's initial listing)."""
        meta = pod.get("metadata") or {}
        namespace, uid = meta.get("namespace"), meta.get("uid")
        if not namespace or not uid:
            return
        ns = self._ns(str(namespace))
        if event_type is None:
            ns.watch_listed = True
        slim = ns.slimmed(pod, listed=event_type is None)
        if ns.during_list is not None:
            ns.during_list.append((event_type, slim))
        self._apply(ns, event_type, slim)

    @staticmethod
    def _apply(ns: _Namespace, event_type: str | None, pod: Obj) -> None:
        uid = str(pod["metadata"]["uid"])
        before = ns.model_of.pop(uid, None)
        if before is not None:
            bucket = ns.by_model.get(before, {})
            bucket.pop(uid, None)
            if not bucket:
                ns.by_model.pop(before, None)
        model = (pod["metadata"].get("labels") or {}).get(contract.LABEL_MODEL)
        if event_type != "DELETED" and model:
            ns.by_model.setdefault(str(model), {})[uid] = pod
            ns.model_of[uid] = str(model)

    async def pods(self, namespace: str, model: str, lister: Lister) -> list[Obj]:
        """The model's runtime pods (prefill, decode, quarantined), listing the namespace first
        when it was never listed, the watch listed the pods since, or not for RELIST_AFTER_S."""
        ns = self._ns(namespace)
        if self._listing_due(ns):
            async with ns.lock:
                if self._listing_due(ns):
                    await self._relist(ns, namespace, lister)
        return list(ns.by_model.get(model, {}).values())

    def _listing_due(self, ns: _Namespace) -> bool:
        return ns.listed_at is None or ns.watch_listed or self._clock() - ns.listed_at > RELIST_AFTER_S

    async def _relist(self, ns: _Namespace, namespace: str, lister: Lister) -> None:
        ns.during_list = []
        # a listing by the watch from here on asks for another
        asked, ns.watch_listed = ns.watch_listed, False
        try:
            # the share table is kept (MAX_SHARED_PARTS bounds it): unchanged pods keep their
            # cached copies, read from `ns` until the listing replaces its pods
            fresh = _Namespace(lock=ns.lock, shared=ns.shared)
            async for page in lister(namespace):
                for pod in page:
                    if (pod.get("metadata") or {}).get("uid"):
                        self._apply(fresh, "ADDED", ns.slimmed(pod, listed=True))
                page.clear()  # only the slim copies stay while the next page is fetched
            for event_type, pod in ns.during_list:
                self._apply(fresh, event_type, pod)
            ns.by_model, ns.model_of = fresh.by_model, fresh.model_of
            ns.listed_at = self._clock()
        except BaseException:
            ns.watch_listed |= asked  # not listed: still asked for
            raise
        finally:
            ns.during_list = None

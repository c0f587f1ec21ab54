"""In-memory view of DisaggregatedModels and their children, fed by watch events.

The operator's watches (kopf on.event) keep the `ChildStore` current, so the periodic resync
compares rendered children with what the cluster holds without asking the API server; the
`ResyncQueue` holds which models a resync pass is due for. One of each per process, in the
operator's context (context.py). No I/O here.
"""

from __future__ import annotations

import asyncio
import marshal
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pdwarden_contract as contract

Obj = dict[str, Any]
ModelKey = tuple[str, str]  # (namespace, DisaggregatedModel name)
ChildKey = tuple[str, str]  # (kind, name)
# the label selector of every object the operator manages (what its watches and lists ask for)
MANAGED_SELECTOR = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"


def slim(body: Mapping[str, Any]) -> Obj:
    """A copy without managedFields (large, and never compared)."""
    out = dict(body)
    meta = dict(out.get("metadata") or {})
    meta.pop("managedFields", None)
    out["metadata"] = meta
    return out


def _packed(obj: Obj) -> bytes:
    """A child as the cache keeps it: marshalled (the watch's JSON types only; never written
    anywhere). A thousand models' children take a fifth of the memory they take as dicts, and
    one comes back in a few microseconds."""
    return marshal.dumps(obj)


def _unpacked(data: bytes) -> Obj:
    """A `_packed` child, as a fresh copy of its own."""
    obj: Obj = marshal.loads(data)
    return obj


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The object's controller owner reference, if it has one."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether the object's controller is the owner with `uid` (the never-take-over rule:
    reconcile's NameTaken, the watchdog's list of gone pods)."""
    ctl = controller_ref(obj)
    return ctl is not None and ctl.get("uid") == uid


def owner_model(body: Mapping[str, Any]) -> ModelKey | None:
    """The DisaggregatedModel a child belongs to, from its controller owner reference."""
    meta = body.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == contract.KIND and ref.get("apiVersion", "").startswith(
            contract.API_GROUP + "/"
        ):
            return meta.get("namespace", ""), ref["name"]
    return None


@dataclass
class ChildStore:
    """The models and their children as the watches deliver them (the informer store)."""

    models: dict[ModelKey, Obj] = field(default_factory=dict)
    children: dict[ModelKey, dict[ChildKey, bytes]] = field(default_factory=dict)  # `_packed`
    locks: dict[ModelKey, asyncio.Lock] = field(default_factory=dict)
    # per model, the last reconcile's `PassResult.settled` (most resyncs follow a controller's
    # status update of a child and change nothing of ours: those skip render and compare)
    settled: dict[ModelKey, Hashable] = field(default_factory=dict)

    def record(self, body: Mapping[str, Any]) -> ModelKey:
        """A model's body as its latest watch event brought it (not a deletion: the
        registry forgets a model that is gone)."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        self.models[key] = slim(body)
        return key

    def uid(self, key: ModelKey) -> str | None:
        """The UID of the model this store holds under `key` (None: none held)."""
        body = self.models.get(key)
        return None if body is None else str((body.get("metadata") or {}).get("uid") or "")

    def forget(self, namespace: str, name: str) -> None:
        """A model that is gone: nothing of it stays."""
        key = (namespace, name)
        self.models.pop(key, None)
        self.children.pop(key, None)
        self.locks.pop(key, None)
        self.settled.pop(key, None)

    def in_namespace(self, namespace: str) -> list[ModelKey]:
        """The models of a namespace this store knows (by their bodies or their children)."""
        return sorted(key for key in {*self.models, *self.children} if key[0] == namespace)

    def child_event(
        self, api_version: str, kind: str, event_type: str | None, body: Mapping[str, Any]
    ) -> ModelKey | None:
        """Record a child's event; returns its model, or None if not ours."""
        key = owner_model(body)
        if key is None:
            return None
        meta = body.get("metadata") or {}
        ckey = (kind, str(meta.get("name")))
        kids = self.children.setdefault(key, {})
        if event_type == "DELETED":
            kids.pop(ckey, None)
        else:
            kids[ckey] = _packed({**slim(body), "apiVersion": api_version, "kind": kind})
        return key

    def note_applied(self, key: ModelKey, objs: list[Obj]) -> None:
        """Children as the API server returned them from an apply: known now, before their
        watch events arrive (so a resync right after a create does not re-apply them).

        A copy the watch already delivered is kept: it may be newer than the apply response
        (e.g. with the Deployment controller's status), and a stale copy would hide that.
        """
        if key not in self.models:
            return  # deleted meanwhile
        kids = self.children.setdefault(key, {})
        for obj in objs:
            ckey = (str(obj.get("kind")), str(obj["metadata"]["name"]))
            if ckey not in kids:
                kids[ckey] = _packed(slim(obj))

    def note_settled(self, key: ModelKey, settled: Hashable | None) -> None:
        if settled is None or key not in self.models:
            self.settled.pop(key, None)
        else:
            self.settled[key] = settled

    def note_status(self, key: ModelKey, status: Mapping[str, Any]) -> None:
        """The status just written, so the next resync compares with it, not an older copy."""
        body = self.models.get(key)
        if body is not None:
            self.models[key] = {**body, "status": {**(body.get("status") or {}), **status}}

    def lock(self, key: ModelKey) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())

    def children_of(self, key: ModelKey) -> dict[ChildKey, Obj]:
        """The model's children as the watch holds them (fresh copies: the caller's own)."""
        return {ckey: _unpacked(data) for ckey, data in self.children.get(key, {}).items()}

    def child(self, key: ModelKey, kind: str, name: str) -> Obj | None:
        """One child as the watch holds it (read each round: one child, not the model's)."""
        data = self.children.get(key, {}).get((kind, name))
        return None if data is None else _unpacked(data)


@dataclass
class ResyncQueue:
    """The models a resync pass is due for (the work queue), over the store's models."""

    store: ChildStore
    dirty: set[ModelKey] = field(default_factory=set)
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def forget(self, namespace: str, name: str) -> None:
        self.dirty.discard((namespace, name))

    def mark(self, key: ModelKey) -> None:
        if key in self.store.models:
            self.dirty.add(key)
            self.wake.set()

    def mark_all(self) -> None:
        self.dirty.update(self.store.models)
        self.wake.set()

    def mark_unsettled(self) -> None:
        """The models a periodic pass may still change: not settled (the last pass applied,
        or found something to apply), or not Ready (a rollout or a wait that time moves on).
        A settled Ready model changes only by an event, which marks it anyway."""
        for key, body in self.store.models.items():
            if key not in self.store.settled or (body.get("status") or {}).get("phase") != "Ready":
                self.dirty.add(key)
        self.wake.set()

    def take_dirty(self) -> list[ModelKey]:
        keys = [k for k in self.dirty if k in self.store.models]
        self.dirty.clear()
        self.wake.clear()
        return keys

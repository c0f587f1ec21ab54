"""Which listed pods are the model's own: the watchdog scrapes, judges and acts only on those.

Labels alone prove nothing: anyone who may create pods in the namespace can label one like a
model's runtime pod (or as quarantined). A pod is the model's when its controller is
- a ReplicaSet controlled by a Deployment that the model controls (a runtime role's pods),
- a StatefulSet the model controls (a group's pods), or
- nothing, with the model among its owners (a quarantined pod: the drain adds the model as an
  owner and its ReplicaSet then lets it go).
Controllers are checked by uid, each once (`Owners` keeps what it learnt); a forged owner
reference names a uid the chain does not lead to.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pdwarden_contract as contract
from pdwarden_operator.cache import controller_ref

Obj = dict[str, Any]
# (apiVersion, kind, namespace, name) -> the object, or None when it does not exist
Reader = Callable[[str, str, str, str], Awaitable[Obj | None]]

# what may control what, up to the model
MAX_KNOWN = 1024
_PARENTS = {"ReplicaSet": ("Deployment",), "Deployment": (contract.KIND,), "StatefulSet": (contract.KIND,)}


@dataclass
class Owners:
    """The controllers (by uid) found to lead up to one model, or not."""

    model_uid: str
    namespace: str
    known: dict[str, bool] = field(default_factory=dict)

    def ours(self, pod: Mapping[str, Any]) -> bool:
        """Whether `pod` belongs to the model, from what `learn` found (unknown: not ours)."""
        ref = controller_ref(pod)
        if ref is None:
            # quarantined: its ReplicaSet let it go, and the drain made the model an owner
            refs = (pod.get("metadata") or {}).get("ownerReferences") or []
            return any(
                isinstance(r, Mapping) and r.get("kind") == contract.KIND and r.get("uid") == self.model_uid
                for r in refs
            )
        if ref.get("kind") == contract.KIND:
            return bool(ref.get("uid") == self.model_uid)
        return self.known.get(str(ref.get("uid")), False)

    async def learn(self, pods: Iterable[Mapping[str, Any]], read: Reader) -> None:
        """Follow the controllers of `pods` not yet known, one read per new controller."""
        if len(self.known) > MAX_KNOWN:  # a model has a few controllers; forget stale ones at once
            self.known.clear()
        for pod in pods:
            ref = controller_ref(pod)
            if ref is not None and ref.get("kind") != contract.KIND:
                await self._check(ref, read, depth=0)

    async def _check(self, ref: Mapping[str, Any], read: Reader, depth: int) -> bool:
        uid, kind = str(ref.get("uid")), str(ref.get("kind"))
        if uid in self.known:
            return self.known[uid]
        if kind == contract.KIND:
            return uid == self.model_uid
        if kind not in _PARENTS or ref.get("apiVersion") != "apps/v1" or depth > 2:
            self.known[uid] = False
            return False
        obj = await read(str(ref.get("apiVersion")), kind, self.namespace, str(ref.get("name")))
        meta = (obj or {}).get("metadata") or {}
        parent = controller_ref(obj or {})
        ok = (
            obj is not None
            and meta.get("uid") == uid
            and parent is not None
            and parent.get("kind") in _PARENTS[kind]
            and await self._check(parent, read, depth + 1)
        )
        self.known[uid] = ok
        return ok

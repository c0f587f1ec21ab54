"""Which children need applying: pure comparison of rendered children with observed ones."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import pdwarden_contract as contract
from pdwarden_operator.render.children import child_key
from pdwarden_operator.render.kinds import OPTIONAL_KINDS, POD_MAKING_KINDS

Obj = dict[str, Any]


def covers(observed: Any, desired: Any) -> bool:
    """Whether `observed` holds every value `desired` sets.

    The API server adds defaults (protocol, scheme, ...), so extra observed fields are fine.
    Lists of named items (containers, env, ports) match by name and may hold extra items that
    other field managers own; other lists must match element by element.
    """
    if isinstance(desired, Mapping):
        return isinstance(observed, Mapping) and all(
            k in observed and covers(observed[k], v) for k, v in desired.items()
        )
    if isinstance(desired, list):
        if not isinstance(observed, list):
            return False
        if desired and all(isinstance(d, Mapping) and "name" in d for d in desired):
            by_name = {o.get("name"): o for o in observed if isinstance(o, Mapping)}
            return all(d["name"] in by_name and covers(by_name[d["name"]], d) for d in desired)
        return len(observed) == len(desired) and all(
            covers(o, d) for o, d in zip(observed, desired, strict=True)
        )
    return bool(observed == desired)


# On every child, contract.ANNOTATION_RENDERED_DIGEST: a digest of the child as rendered when it
# was last applied. `covers` sees a value that differs but not a field the spec no longer renders
# (an env var removed); a new digest does, and applying the child without that field removes it
# (pdwarden owns it).
def rendered_digest(obj: Mapping[str, Any]) -> str:
    """The digest of `obj` without its own digest and without `spec.replicas` (an autoscaled
    role's count follows its Deployment, and `covers` compares a fixed one)."""
    body = dict(obj)  # shallow copies of the parts changed below: `obj` stays as it is
    meta = dict(body.get("metadata") or {})
    meta["annotations"] = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k != contract.ANNOTATION_RENDERED_DIGEST
    }
    body["metadata"] = meta
    if isinstance(body.get("spec"), Mapping):
        body["spec"] = {k: v for k, v in body["spec"].items() if k != "replicas"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stamped(objs: Iterable[Obj]) -> list[Obj]:
    """`objs`, each carrying its `rendered_digest`."""
    out = []
    for obj in objs:
        meta = dict(obj["metadata"])
        meta["annotations"] = {
            **(meta.get("annotations") or {}),
            contract.ANNOTATION_RENDERED_DIGEST: rendered_digest(obj),
        }
        out.append({**obj, "metadata": meta})
    return out


# Annotations the cluster's controllers keep on children and pdwarden never renders: their
# value cannot change what `covers` finds, so they leave a child's settled key alone (the
# Deployment controller adds its revision once it first observes a Deployment).
CONTROLLER_ANNOTATIONS = frozenset({"deployment.kubernetes.io/revision"})


def settled_key(inputs: Hashable, observed: Mapping[tuple[str, str], Obj]) -> Hashable:
    """What a render and compare depend on, cheaply: the model's `inputs` (its generation,
    annotations and what reconcile observed for it) and, per child, what changes when anyone
    edits it. A child's generation moves with its spec but not with its status (a controller's
    status updates, the usual child event, leave it); kinds without one use resourceVersion;
    labels and annotations never move a generation, so they count themselves (but for
    CONTROLLER_ANNOTATIONS)."""

    def child(obj: Obj) -> Hashable:
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        return (
            meta.get("generation") or meta.get("resourceVersion"),
            meta.get("uid"),
            _frozen(meta.get("labels")),
            _frozen({k: v for k, v in annotations.items() if k not in CONTROLLER_ANNOTATIONS}),
            _frozen({str(i): r for i, r in enumerate(meta.get("ownerReferences") or [])}),
        )

    return inputs, tuple(sorted((key, child(obj)) for key, obj in observed.items()))


def _frozen(value: Any) -> Hashable:
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value if isinstance(value, Hashable) else repr(value)


def to_apply(desired: Iterable[Obj], observed: Mapping[tuple[str, str], Obj]) -> list[Obj]:
    """Children that are missing, that someone changed, or that render differently from when
    they were last applied (a `stamped` child's digest is compared like any other value)."""
    out = []
    for obj in desired:
        current = observed.get(child_key(obj))
        if current is None or not covers(current, obj):
            out.append(obj)
    return out


def to_delete(desired: Iterable[Obj], observed: Mapping[tuple[str, str], Obj]) -> list[Obj]:
    """Observed children of an optional kind (e.g. a NetworkPolicy) the spec no longer asks for."""
    wanted = {child_key(o) for o in desired}
    return [obj for key, obj in sorted(observed.items()) if key[0] in OPTIONAL_KINDS and key not in wanted]


# The children that make pods (POD_MAKING_KINDS) go last. Everything their pods name or are
# covered by (ServiceAccounts, RBAC, Services, disruption budgets, NetworkPolicies) goes first: a
# pod created before its ServiceAccount exists is refused (the ReplicaSet reports ReplicaFailure
# and backs off), and one created before its NetworkPolicy would run unprotected for a moment.
def apply_waves(objs: Iterable[Obj]) -> tuple[list[Obj], list[Obj]]:
    """`objs` split in the order they are applied: what pods depend on, then what makes pods."""
    first: list[Obj] = []
    then: list[Obj] = []
    for obj in objs:
        (then if obj["kind"] in POD_MAKING_KINDS else first).append(obj)
    return first, then

"""Which children need applying: pure comparison of rendered children with observed ones."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pdwarden_operator.render import OPTIONAL_KINDS, child_key

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


def to_apply(desired: Iterable[Obj], observed: Mapping[tuple[str, str], Obj]) -> list[Obj]:
    """Children that are missing or that someone changed: these get re-applied."""
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


# The children that make pods. Everything their pods name or are covered by (ServiceAccounts,
# RBAC, Services, disruption budgets, NetworkPolicies) goes first: a pod created before its
# ServiceAccount exists is refused (the ReplicaSet reports ReplicaFailure and backs off), and
# one created before its NetworkPolicy would run unprotected for a moment.
POD_MAKERS = frozenset({"Deployment", "StatefulSet"})


def apply_waves(objs: Iterable[Obj]) -> tuple[list[Obj], list[Obj]]:
    """`objs` split in the order they are applied: what pods depend on, then what makes pods."""
    first: list[Obj] = []
    then: list[Obj] = []
    for obj in objs:
        (then if obj["kind"] in POD_MAKERS else first).append(obj)
    return first, then

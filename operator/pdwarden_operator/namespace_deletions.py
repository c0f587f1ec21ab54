"""Namespace deletions, for an operator that watches namespace patterns (`-n 'team-*'`).

kopf stops watching a namespace that matched a pattern as soon as its deletion starts, before
the namespace controller deletes what is in it: the models there are never seen deleted. So
with patterns the operator watches namespaces itself (kopf needs to list and watch them for the
patterns anyway, so its RBAC already allows it) and tells the reconciler and the watchdog when
one is being deleted. Without patterns kopf keeps each namespace's watch and delivers every
deletion; nothing here runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import kopf

_subscribers: list[Callable[[str], None]] = []
_registered = False
# Namespaces whose deletion has started and is not done: a model event from one of them that
# kopf delivers after the namespace's (its watch is stopping) must not bring the model back.
_deleting: set[str] = set()


def subscribe(forget: Callable[[str], None]) -> None:
    """`forget(namespace)` is called once a namespace's deletion has started (idempotent: it may
    be called again for the same namespace)."""
    _subscribers.append(forget)


def unsubscribe(forget: Callable[[str], None]) -> None:
    """No more calls to `forget` (nothing when it was not subscribed)."""
    if forget in _subscribers:
        _subscribers.remove(forget)


def deleting(event_type: str | None, namespace: Mapping[str, Any]) -> bool:
    """Whether a namespace event says its deletion has started (or is done)."""
    return event_type == "DELETED" or bool((namespace.get("metadata") or {}).get("deletionTimestamp"))


async def _namespace_event(event: kopf.RawEvent, **_: Any) -> None:
    obj = event.get("object")
    if not isinstance(obj, Mapping):
        return
    name = str((obj.get("metadata") or {}).get("name") or "")
    if not deleting(event.get("type"), obj):
        _deleting.discard(name)  # a namespace of that name again
        return
    if event.get("type") == "DELETED":
        _deleting.discard(name)  # done: its models are long gone
    else:
        _deleting.add(name)
    for forget in _subscribers:
        forget(name)


def model_event_type(event_type: str | None, namespace: str) -> str | None:
    """A model event's type as the handlers must take it: DELETED once its namespace is being
    deleted (kopf may still deliver one of its events after the namespace's)."""
    return "DELETED" if namespace in _deleting else event_type


def watch(namespaces: list[str], is_pattern: Callable[[str], bool]) -> None:
    """Register the namespace watch, before kopf runs, when `namespaces` holds a pattern."""
    global _registered
    if not _registered and any(is_pattern(ns) for ns in namespaces):
        kopf.on.event("", "v1", "namespaces", id="pdwarden_namespace_deletions")(_namespace_event)
        _registered = True

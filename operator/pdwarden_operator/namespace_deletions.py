"""Namespace deletions, for an operator that watches namespace patterns (`-n 'team-*'`).

kopf stops watching a namespace that matched a pattern as soon as its deletion starts, before
the namespace controller deletes what is in it: the models there are never seen deleted. So
with patterns the operator watches namespaces itself (kopf needs to list and watch them for the
patterns anyway, so its RBAC already allows it) and has the operator's context forget every
model of one being deleted (`OperatorContext.forget_namespace`: the reconciler's and the
watchdog's stores alike). Without patterns kopf keeps each namespace's watch and delivers every
deletion; nothing here runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from pdwarden_operator.context import OperatorContext, context_of

HANDLER_ID = "pdwarden_namespace_deletions"
log = logging.getLogger("pdwarden.handlers")


def deleting(event_type: str | None, namespace: Mapping[str, Any]) -> bool:
    """Whether a namespace event says its deletion has started (or is done)."""
    return event_type == "DELETED" or bool((namespace.get("metadata") or {}).get("deletionTimestamp"))


def namespace_event(context: OperatorContext, event_type: str | None, obj: Mapping[str, Any]) -> None:
    """A namespace's watch event. `context.deleting` holds the namespaces whose deletion has
    started and is not done: a model event from one of them that kopf delivers after the
    namespace's (its watch is stopping) must not bring the model back."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    if not deleting(event_type, obj):
        context.deleting.discard(name)  # a namespace of that name again
        return
    if event_type == "DELETED":
        context.deleting.discard(name)  # done: its models are long gone
    else:
        context.deleting.add(name)
    for key in context.forget_namespace(name):
        log.info("%s/%s: forgotten: its namespace is being deleted", *key)


async def _namespace_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    obj = event.get("object")
    if isinstance(obj, Mapping):
        namespace_event(context_of(memo), event.get("type"), obj)


def watch(
    namespaces: list[str], is_pattern: Callable[[str], bool], registry: kopf.OperatorRegistry | None = None
) -> None:
    """Register the namespace watch, before kopf runs, when `namespaces` holds a pattern (once:
    kopf's registry is asked whether it holds it already)."""
    registry = registry or kopf.get_default_registry()
    if not any(is_pattern(ns) for ns in namespaces):
        return
    if any(h.id == HANDLER_ID for h in registry._watching.get_all_handlers()):  # kopf's own
        return
    kopf.on.event("", "v1", "namespaces", id=HANDLER_ID, registry=registry)(_namespace_event)

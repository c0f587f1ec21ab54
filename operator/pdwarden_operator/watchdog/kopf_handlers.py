"""The watchdog's kopf wiring: one asyncio task per DisaggregatedModel (model_watchdog.py).

Models are tracked through a watch-event handler rather than a kopf daemon, which would put a
finalizer on every DisaggregatedModel (the reconcile's handlers.py avoids them for the same
reason). What the watchdogs share (context.py) comes in kopf's memo, as the operator built it
at start-up; the running watchdogs are kept in it (`WatchdogContext.models`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Mapping
from typing import Any

import kopf

import pdwarden_contract as contract
from pdwarden_operator import namespace_deletions
from pdwarden_operator.cache import slim
from pdwarden_operator.kube.pods import RUNTIME_PODS_SELECTOR
from pdwarden_operator.status_writer import WRITER
from pdwarden_operator.watchdog.context import MEMO_KEY, Key, WatchdogContext
from pdwarden_operator.watchdog.latest_body import LatestBody
from pdwarden_operator.watchdog.model_watchdog import ModelWatchdog

GROUP, VERSION, PLURAL = contract.API_GROUP, contract.API_VERSION, contract.PLURAL

log = logging.getLogger("pdwarden.watchdog")


def context_of(memo: Any) -> WatchdogContext:
    """The operator's watchdog context, from kopf's memo (cli.py puts it there)."""
    context = memo.get(MEMO_KEY) if isinstance(memo, Mapping) else None
    if not isinstance(context, WatchdogContext):
        raise RuntimeError(
            f"kopf's memo holds no watchdog context ({MEMO_KEY!r}): start the operator with one"
        )
    return context


def _forget(context: WatchdogContext, key: Key) -> asyncio.Task[None] | None:
    """Everything kept for the model at `key`; returns its watchdog's task."""
    models = context.models
    latest = models.bodies.pop(key, None)
    if latest is not None:
        latest.end()
    models.uids.pop(key, None)
    WRITER.forget(*key)
    context.brakes.forget(key)
    context.role_loads.forget(*key)
    return models.tasks.pop(key, None)


def stop(context: WatchdogContext, key: Key) -> None:
    """The model's watchdog ends and nothing of it stays behind."""
    task = _forget(context, key)
    if task is not None:
        task.cancel()


async def _watch(context: WatchdogContext, key: Key, watchdog: ModelWatchdog, latest: LatestBody) -> None:
    await watchdog.run(latest)
    # The watchdog ended by itself: its model is gone, though no event said so (kopf stops
    # watching a deleted namespace that matched a pattern). Nothing of it may stay behind.
    if context.models.tasks.get(key) is asyncio.current_task():
        _forget(context, key)


def stop_namespace(context: WatchdogContext, namespace: str) -> None:
    for key in [k for k in context.models.tasks if k[0] == namespace]:
        log.info("%s/%s: watchdog stopped: its namespace is being deleted", *key)
        stop(context, key)


def attach(context: WatchdogContext) -> None:
    """The context's watchdogs stop with their namespace's deletion (namespace_deletions.py)."""
    if context.models.on_namespace_deleted is None:
        context.models.on_namespace_deleted = functools.partial(stop_namespace, context)
        namespace_deletions.subscribe(context.models.on_namespace_deleted)


def detach(context: WatchdogContext) -> None:
    if context.models.on_namespace_deleted is not None:
        namespace_deletions.unsubscribe(context.models.on_namespace_deleted)
        context.models.on_namespace_deleted = None


@kopf.on.startup(id="watchdog_context")
def start(memo: kopf.Memo, **_: Any) -> None:
    attach(context_of(memo))


async def track(context: WatchdogContext, event: Mapping[str, Any], body: Mapping[str, Any]) -> None:
    """A model's watch event: its watchdog started, fed its latest body, or stopped."""
    meta = body.get("metadata") or {}
    key: Key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
    models = context.models
    kind = namespace_deletions.model_event_type(event.get("type"), key[0])
    if kind == "DELETED" or meta.get("deletionTimestamp"):
        stop(context, key)
        return
    uid = str(meta.get("uid") or "")
    if key in models.uids and models.uids[key] != uid:
        stop(context, key)  # deleted and created again, the deletion unseen: the old watchdog ends
    kept = slim(body)  # the watchdog reads spec, status and metadata only
    latest = models.bodies.get(key)
    if latest is None:
        latest = models.bodies[key] = LatestBody(kept)
    else:
        latest.set(kept)
    task = models.tasks.get(key)
    if task is None or task.done():
        models.uids[key] = uid
        context.brakes.expect(key)  # the brakes hold until this model has reported once
        watchdog = ModelWatchdog(key[0], key[1], uid, context=context)
        models.tasks[key] = asyncio.create_task(
            _watch(context, key, watchdog, latest), name=f"watchdog-{key[0]}-{key[1]}"
        )


@kopf.on.event(GROUP, VERSION, PLURAL, id="watchdog_track")
async def track_model(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await track(context_of(memo), event, body)


async def stop_every(context: WatchdogContext) -> None:
    tasks = list(context.models.tasks.values())
    for key in list(context.models.tasks):
        stop(context, key)
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


@kopf.on.cleanup(id="watchdog_stop")
async def stop_all(memo: kopf.Memo, **_: Any) -> None:
    context = context_of(memo)
    await stop_every(context)
    detach(context)


@kopf.on.startup(id="watchdog_pod_watch")
def watch_runtime_pods(settings: kopf.OperatorSettings, **_: Any) -> None:
    """The API server filters the pod watch: only runtime pods reach the operator."""
    settings.watching.label_selectors["", "v1", "pods"] = RUNTIME_PODS_SELECTOR


@kopf.on.event("", "v1", "pods", id="watchdog_pods")
async def track_pod(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    obj = event.get("object")
    if isinstance(obj, Mapping):
        context_of(memo).pods.event(event.get("type"), obj)

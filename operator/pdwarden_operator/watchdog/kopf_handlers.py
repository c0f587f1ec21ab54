"""The watchdog's kopf wiring: one asyncio task per DisaggregatedModel (model_watchdog.py).

Models are tracked through a watch-event handler rather than a kopf daemon, which would put a
finalizer on every DisaggregatedModel (the reconcile's handlers.py avoids them for the same
reason). The operator's context (pdwarden_operator/context.py) comes in kopf's memo, as the
operator built it at start-up: what the watchdogs share is its `watchdog` (context.py here),
the running watchdogs are kept there (`WatchdogContext.models`), and a model that is gone is
forgotten by its registry (model_registry.py), the watchdog with everything else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import kopf

import pdwarden_contract as contract
from pdwarden_operator.cache import slim
from pdwarden_operator.context import OperatorContext, context_of
from pdwarden_operator.kube.pods import RUNTIME_PODS_SELECTOR
from pdwarden_operator.watchdog.context import Key
from pdwarden_operator.watchdog.latest_body import LatestBody
from pdwarden_operator.watchdog.model_watchdog import ModelWatchdog

GROUP, VERSION, PLURAL = contract.API_GROUP, contract.API_VERSION, contract.PLURAL


async def _watch(context: OperatorContext, key: Key, watchdog: ModelWatchdog, latest: LatestBody) -> None:
    await watchdog.run(latest)
    # The watchdog ended by itself: its model is gone, though no event said so (kopf stops
    # watching a deleted namespace that matched a pattern). Nothing of it may stay behind.
    if context.watchdog.models.tasks.get(key) is asyncio.current_task():
        context.registry.forget(*key)


async def track(context: OperatorContext, event: Mapping[str, Any], body: Mapping[str, Any]) -> None:
    """A model's watch event: its watchdog started, fed its latest body, or (the model gone,
    through the registry) stopped."""
    key = context.model_event(event.get("type"), body)
    if key is None:
        return
    models = context.watchdog.models
    uid = str((body.get("metadata") or {}).get("uid") or "")
    kept = slim(body)  # the watchdog reads spec, status and metadata only
    latest = models.bodies.get(key)
    if latest is None:
        latest = models.bodies[key] = LatestBody(kept)
    else:
        latest.set(kept)
    task = models.tasks.get(key)
    if task is None or task.done():
        models.uids[key] = uid
        context.watchdog.brakes.expect(key)  # the brakes hold until this model has reported once
        watchdog = ModelWatchdog(key[0], key[1], uid, context=context.watchdog)
        models.tasks[key] = asyncio.create_task(
            _watch(context, key, watchdog, latest), name=f"watchdog-{key[0]}-{key[1]}"
        )


@kopf.on.event(GROUP, VERSION, PLURAL, id="watchdog_track")
async def track_model(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await track(context_of(memo), event, body)


async def stop_every(context: OperatorContext) -> None:
    """Every watchdog ends (the operator stops; the models are not gone: kept as they are)."""
    models = context.watchdog.models
    tasks = list(models.tasks.values())
    for key in list(models.tasks):
        models.forget(*key)
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


@kopf.on.cleanup(id="watchdog_stop")
async def stop_all(memo: kopf.Memo, **_: Any) -> None:
    await stop_every(context_of(memo))


@kopf.on.startup(id="watchdog_pod_watch")
def watch_runtime_pods(settings: kopf.OperatorSettings, **_: Any) -> None:
    """The API server filters the pod watch: only runtime pods reach the operator."""
    settings.watching.label_selectors["", "v1", "pods"] = RUNTIME_PODS_SELECTOR


@kopf.on.event("", "v1", "pods", id="watchdog_pods")
async def track_pod(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    obj = event.get("object")
    if isinstance(obj, Mapping):
        context_of(memo).watchdog.pods.event(event.get("type"), obj)

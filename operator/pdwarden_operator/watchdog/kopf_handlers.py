"""The watchdog's kopf wiring: one asyncio task per DisaggregatedModel (model_watchdog.py).

Models are tracked through a watch-event handler rather than a kopf daemon, which would put a
finalizer on every DisaggregatedModel (the reconcile's handlers.py avoids them for the same
reason).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import kopf

import pdwarden_contract as contract
from pdwarden_operator.cache import slim
from pdwarden_operator.kube.pods import RUNTIME_PODS_SELECTOR
from pdwarden_operator.status_writer import WRITER
from pdwarden_operator.watchdog.brake import BRAKE
from pdwarden_operator.watchdog.model_watchdog import Key, ModelWatchdog
from pdwarden_operator.watchdog.pod_cache import POD_CACHE
from pdwarden_operator.watchdog.role_load import ROLE_LOADS

GROUP, VERSION, PLURAL = contract.API_GROUP, contract.API_VERSION, contract.PLURAL

_bodies: dict[Key, Mapping[str, Any]] = {}
_tasks: dict[Key, asyncio.Task[None]] = {}


def _stop(key: Key) -> None:
    _bodies.pop(key, None)
    WRITER.forget(*key)
    BRAKE.forget(key)
    ROLE_LOADS.forget(*key)
    task = _tasks.pop(key, None)
    if task is not None:
        task.cancel()


@kopf.on.event(GROUP, VERSION, PLURAL, id="watchdog_track")
async def track_model(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
    key: Key = (body.metadata.namespace or "", body.metadata.name or "")
    if event.get("type") == "DELETED" or body.metadata.get("deletionTimestamp"):
        _stop(key)
        return
    _bodies[key] = slim(body)  # the watchdog reads spec, status and metadata only
    task = _tasks.get(key)
    if task is None or task.done():
        watchdog = ModelWatchdog(key[0], key[1], body.metadata.uid or "")
        BRAKE.expect(key)  # the brakes hold until this model has reported once
        _tasks[key] = asyncio.create_task(
            watchdog.run(lambda: _bodies.get(key)), name=f"watchdog-{key[0]}-{key[1]}"
        )


@kopf.on.cleanup(id="watchdog_stop")
async def stop_all(**_: Any) -> None:
    tasks = list(_tasks.values())
    for key in list(_tasks):
        _stop(key)
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


@kopf.on.startup(id="watchdog_pod_watch")
def watch_runtime_pods(settings: kopf.OperatorSettings, **_: Any) -> None:
    """The API server filters the pod watch: only runtime pods reach the operator."""
    settings.watching.label_selectors["", "v1", "pods"] = RUNTIME_PODS_SELECTOR


@kopf.on.event("", "v1", "pods", id="watchdog_pods")
async def track_pod(event: kopf.RawEvent, **_: Any) -> None:
    obj = event.get("object")
    if isinstance(obj, Mapping):
        POD_CACHE.event(event.get("type"), obj)

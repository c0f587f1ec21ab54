"""The watchdog's kopf wiring: one asyncio task per DisaggregatedModel (model_watchdog.py).

Models are tracked through a watch-event handler rather than a kopf daemon, which would put a
finalizer on every DisaggregatedModel (the reconcile's handlers.py avoids them for the same
reason).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import kopf

import pdwarden_contract as contract
from pdwarden_operator import namespace_deletions
from pdwarden_operator.cache import slim
from pdwarden_operator.kube.pods import RUNTIME_PODS_SELECTOR
from pdwarden_operator.status_writer import WRITER
from pdwarden_operator.watchdog.brake import BRAKE
from pdwarden_operator.watchdog.latest_body import LatestBody
from pdwarden_operator.watchdog.model_watchdog import Key, ModelWatchdog
from pdwarden_operator.watchdog.pod_cache import POD_CACHE
from pdwarden_operator.watchdog.role_load import ROLE_LOADS

GROUP, VERSION, PLURAL = contract.API_GROUP, contract.API_VERSION, contract.PLURAL

log = logging.getLogger("pdwarden.watchdog")

_bodies: dict[Key, LatestBody] = {}
_tasks: dict[Key, asyncio.Task[None]] = {}


_uids: dict[Key, str] = {}  # the model each running watchdog watches


def _forget(key: Key) -> asyncio.Task[None] | None:
    """Everything kept for the model at `key`; returns its watchdog's task."""
    latest = _bodies.pop(key, None)
    if latest is not None:
        latest.end()
    _uids.pop(key, None)
    WRITER.forget(*key)
    BRAKE.forget(key)
    ROLE_LOADS.forget(*key)
    return _tasks.pop(key, None)


def _stop(key: Key) -> None:
    task = _forget(key)
    if task is not None:
        task.cancel()


async def _watch(key: Key, watchdog: ModelWatchdog, latest: LatestBody) -> None:
    await watchdog.run(latest)
    # The watchdog ended by itself: its model is gone, though no event said so (kopf stops
    # watching a deleted namespace that matched a pattern). Nothing of it may stay behind.
    if _tasks.get(key) is asyncio.current_task():
        _forget(key)


def _stop_namespace(namespace: str) -> None:
    for key in [k for k in _tasks if k[0] == namespace]:
        log.info("%s/%s: watchdog stopped: its namespace is being deleted", *key)
        _stop(key)


namespace_deletions.subscribe(_stop_namespace)


@kopf.on.event(GROUP, VERSION, PLURAL, id="watchdog_track")
async def track_model(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
    key: Key = (body.metadata.namespace or "", body.metadata.name or "")
    kind = namespace_deletions.model_event_type(event.get("type"), key[0])
    if kind == "DELETED" or body.metadata.get("deletionTimestamp"):
        _stop(key)
        return
    uid = body.metadata.uid or ""
    if key in _uids and _uids[key] != uid:
        _stop(key)  # deleted and created again, the deletion unseen: the old watchdog ends
    kept = slim(body)  # the watchdog reads spec, status and metadata only
    latest = _bodies.get(key)
    if latest is None:
        latest = _bodies[key] = LatestBody(kept)
    else:
        latest.set(kept)
    task = _tasks.get(key)
    if task is None or task.done():
        _uids[key] = uid
        BRAKE.expect(key)  # the brakes hold until this model has reported once
        _tasks[key] = asyncio.create_task(
            _watch(key, ModelWatchdog(key[0], key[1], uid), latest), name=f"watchdog-{key[0]}-{key[1]}"
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

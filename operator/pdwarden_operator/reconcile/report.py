"""A reconcile pass's one status write: the observation of the children the pass left (`report`),
or the refusal that stopped it (`report_refusal`), handed to the status writer, which writes
only when the status changed."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from pdwarden_contract import LABEL_MODEL, ROLES, RUNTIME_ROLES
from pdwarden_operator import scheduling, timestamps, worker_key_secret
from pdwarden_operator.cache import controlled_by
from pdwarden_operator.kube import apply as kube_apply
from pdwarden_operator.kube.client import KubeApiError, KubeClient
from pdwarden_operator.models import DisaggregatedModelSpec
from pdwarden_operator.reconcile.errors import InvalidSpec, Refused, RetryLater
from pdwarden_operator.reconcile.executor import Executed
from pdwarden_operator.reconcile.observation import Observation, generation
from pdwarden_operator.render.meta import Obj, child_name, role_of
from pdwarden_operator.status import Observed, observe_deployment, observe_groups
from pdwarden_operator.status_writer import StatusWriter

T = TypeVar("T")
log = logging.getLogger("pdwarden.reconcile")


async def report(kube: KubeClient, writer: StatusWriter, obs: Observation, done: Executed) -> Obj:
    """Hand the observation of the children the pass left to the status writer (it writes when
    the status changed). When pods exist that have waited long to run, ask the scheduler's view
    why first (one pod list)."""
    body, spec, children = obs.body, obs.spec, done.children
    deployments = [o for (kind, _), o in children.items() if kind == "Deployment"]
    uid = str(body["metadata"].get("uid", ""))
    workloads = [o for o in children.values() if controlled_by(o, uid)]
    key = worker_key_secret.progress(
        workloads, body["metadata"]["name"], spec.worker_key.enabled, spec.worker_key.rotation
    )
    observed = replace(
        _observed(body, spec, children), blocked=scheduling.refused(deployments), worker_key=key
    )
    waiting = scheduling.pods_not_ready(observed.workloads.values())
    if waiting and _waiting_long(writer.preview(body, spec, observed)):
        pods = await _pods(kube, body)
        if pods is not None:
            observed = replace(observed, blocked={**scheduling.unschedulable(pods), **observed.blocked})
    done_status = await _guarded(writer.observed(body, spec, observed))
    return done_status[0] if done_status else {}


async def report_refusal(writer: StatusWriter, body: Mapping[str, Any], refusal: Refused) -> InvalidSpec:
    """The status of a refused pass: Degraded with the refusal's message until the spec changes."""
    if refusal.reason is None or refusal.spec is None:
        await _guarded(writer.invalid(body, refusal.shown, generation(body)))
    else:
        observed = _observed(body, refusal.spec, {}, reason=refusal.reason, message=refusal.message)
        await _guarded(writer.observed(body, refusal.spec, observed))
    return InvalidSpec(refusal.message)


async def _guarded(write: Awaitable[T]) -> T | None:
    """Run a status write; a deleted model needs none, other failures are retried."""
    try:
        return await write
    except KubeApiError as exc:
        if exc.not_found:  # deleted meanwhile: nothing to report on
            return None
        raise RetryLater(f"writing status failed: {exc}") from exc


def _observed(
    body: Mapping[str, Any],
    spec: DisaggregatedModelSpec,
    children: Mapping[tuple[str, str], Obj],
    **error: str,
) -> Observed:
    name = body["metadata"]["name"]
    workloads = {
        role: observe_deployment(children.get(("Deployment", child_name(name, role)))) for role in ROLES
    }
    for role in RUNTIME_ROLES:
        role_spec = spec.role(role)
        if role_spec.grouped:
            sets = [o for (kind, _), o in children.items() if kind == "StatefulSet" and role_of(o) == role]
            workloads[role] = observe_groups(sets, role_spec.nodes_per_replica, role_spec.replicas)
    return Observed(
        generation=generation(body),
        workloads=workloads,
        error_reason=error.get("reason"),
        error_message=error.get("message"),
    )


def _waiting_long(new: Obj) -> bool:
    """Whether pods have been not ready for a while (then it is worth asking why)."""
    ready = next((c for c in new["conditions"] if c["type"] == "Ready"), None)
    if ready is None or ready["reason"] not in ("ReplicasNotReady", "PodsBlocked"):
        return False
    start = timestamps.from_rfc3339(ready.get("lastTransitionTime"))
    return start is not None and time.time() - start >= scheduling.LOOK_AFTER_S


async def _pods(kube: KubeClient, body: Mapping[str, Any]) -> list[Obj] | None:
    meta = body["metadata"]
    try:
        return await kube_apply.list_objects(
            kube, "v1", "Pod", meta["namespace"], f"{LABEL_MODEL}={meta['name']}", from_watch_cache=True
        )
    except KubeApiError as exc:
        log.warning("%s/%s: listing pods failed: %s", meta["namespace"], meta["name"], exc)
        return None  # status without the scheduler's reason this time

"""A reconcile pass's reads, before it decides anything -> a frozen `Observation`: the spec
validated and allowed by the pod policy, the owner as its children see it (who uses its worker
key; `Baseline`: the namespace's workloads when the cache has none of the model's), and what
the status writer remembers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Mapping
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from pdwarden_operator import replicas, worker_key_secret
from pdwarden_operator.cache import MANAGED_SELECTOR, controlled_by, controller_ref
from pdwarden_operator.kube import apply as kube_apply
from pdwarden_operator.kube.client import KubeApiError, KubeClient
from pdwarden_operator.models import DisaggregatedModelSpec, parse_spec
from pdwarden_operator.podpolicy import PodPolicy, violations
from pdwarden_operator.reconcile.errors import (
    Refused,
    RetryLater,
    describe_validation_error,
    worker_key_failed,
)
from pdwarden_operator.reconcile.observation import Observation, generation
from pdwarden_operator.render.meta import Obj, Owner, child_name
from pdwarden_operator.render.worker_key import worker_key_secret_object
from pdwarden_operator.status_writer import StatusWriter

log = logging.getLogger("pdwarden.reconcile")


async def observe(
    kube: KubeClient,
    body: Mapping[str, Any],
    children: Mapping[tuple[str, str], Obj],
    settled_before: Hashable | None,
    *,
    pod_policy: PodPolicy,
    baseline: Baseline,
    writer: StatusWriter,
    verify_secret: bool,
) -> Observation:
    """The spec (Refused when it does not validate or the pod policy refuses it) and the owner
    (`verify_secret`: whether its worker key's Secret still exists, one dry-run)."""
    spec = _spec(pod_policy, body)
    owner = await read_owner(kube, baseline, body, spec, children, verify=verify_secret)
    meta = body["metadata"]
    refused = writer.refused(meta["namespace"], meta["name"], generation(body))
    return Observation(body, spec, owner, children, settled_before, refused)


def _spec(pod_policy: PodPolicy, body: Mapping[str, Any]) -> DisaggregatedModelSpec:
    """The parsed spec, if it validates and the installation's pod policy allows what it asks."""
    try:
        spec = parse_spec(dict(body.get("spec") or {}))
    except ValidationError as exc:
        message = describe_validation_error(exc)
        raise Refused(message, shown=f"Invalid spec: {message}") from exc
    meta = body["metadata"]
    refused = violations(
        spec, meta["name"], meta.get("annotations") or {}, pod_policy.allowed(meta["namespace"])
    )
    if refused:
        message = "; ".join(refused)
        raise Refused(message, shown=f"Refused by the pod policy: {message}")
    return spec


async def read_owner(
    kube: KubeClient,
    baseline: Baseline,
    body: Mapping[str, Any],
    spec: DisaggregatedModelSpec,
    children: Mapping[tuple[str, str], Obj],
    *,
    verify: bool,
) -> Owner:
    """The model as its children see it, with who uses its worker key now (`worker_key_secret.
    plan_use` over the workloads it controls) and the Secret they mount (`verify`: make sure it
    still exists, one dry-run create), or a stand-in name until `execute` has created one after
    the checks (so that a refused spec creates no Secret)."""
    owner = Owner.from_body(body)
    workloads = [
        o
        for o in children.values()
        if o["kind"] in worker_key_secret.WORKLOAD_KINDS and controlled_by(o, owner.uid)
    ]
    if spec.worker_key.enabled and worker_key_secret.in_use(workloads, owner.name) is None:
        # None in the cache: a new model, or a cache not filled yet (the operator just started),
        # which must not make a second Secret and roll every pod onto it
        workloads = await baseline.workloads(kube, owner)
    key = spec.worker_key
    use = worker_key_secret.plan_use(workloads, owner.name, key.enabled, key.rotation)
    pending = worker_key_secret.pending(owner.name)
    newest = None if use is None else worker_key_secret.newest(use.secrets, owner.name)
    checked = verify and key.enabled and newest not in (None, pending)
    if checked and newest is not None and not await _secret_exists(kube, spec, owner, newest):
        # pods could not start on it: everyone moves to a new one at once
        log.warning("%s/%s: the worker key's Secret %s is gone", owner.namespace, owner.name, newest)
        use = worker_key_secret.KeyUse.final(pending)
    deployed = {
        role: count
        for role in spec.autoscaled_roles
        if (count := replicas.deployed(children.get(("Deployment", child_name(owner.name, role)))))
        is not None
    }
    return replace(owner, worker_key=use, deployed=deployed)


class Baseline:
    """The Deployments and StatefulSets each namespace held, listed once per namespace (two
    LISTs) the first time a model there has none in the cache.

    The watches may not have brought everything yet when the operator starts; what was
    created before the listing is in it, and what this operator applies after it reaches the
    cache through `cache.note_applied`. A thousand new models in one namespace cost two LISTs,
    not two thousand (each LIST scans every workload of the namespace). Listed again once
    older than `max_age_s`."""

    def __init__(self, max_age_s: float = 300.0) -> None:
        self.max_age_s = max_age_s  # by then the watches hold everything; listing again is cheap
        self._by_namespace: dict[str, tuple[float, dict[str, list[Obj]]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def workloads(self, kube: KubeClient, owner: Owner) -> list[Obj]:
        now = asyncio.get_running_loop().time()
        async with self._locks.setdefault(owner.namespace, asyncio.Lock()):
            listed = self._by_namespace.get(owner.namespace)
            if listed is None or now - listed[0] > self.max_age_s:
                listed = self._by_namespace[owner.namespace] = (now, await self._list(kube, owner.namespace))
        return list(listed[1].get(owner.uid, []))

    @staticmethod
    async def _list(kube: KubeClient, namespace: str) -> dict[str, list[Obj]]:
        by_model: dict[str, list[Obj]] = {}
        for kind in worker_key_secret.WORKLOAD_KINDS:
            try:
                items = await kube_apply.list_objects(kube, "apps/v1", kind, namespace, MANAGED_SELECTOR)
            except KubeApiError as exc:
                raise RetryLater(f"listing the namespace's {kind}s failed: {exc}") from exc
            for item in items:
                ctl = controller_ref(item)
                if ctl is not None and ctl.get("uid"):
                    # a list's items carry no kind of their own
                    by_model.setdefault(str(ctl["uid"]), []).append({**item, "kind": kind})
        return by_model


async def _secret_exists(kube: KubeClient, spec: DisaggregatedModelSpec, owner: Owner, name: str) -> bool:
    # With the model's labels and owner: the chart's admission policy admits the operator's
    # writes, dry runs included, only to objects it manages.
    probe = worker_key_secret_object(owner, spec, "")
    probe["metadata"] = {**{k: v for k, v in probe["metadata"].items() if k != "generateName"}, "name": name}
    try:
        await kube_apply.create(kube, probe, dry_run=True)
    except KubeApiError as exc:
        if exc.status == 409:
            return True
        raise worker_key_failed(spec, exc) from exc
    return False

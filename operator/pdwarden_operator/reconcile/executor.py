"""A reconcile pass's writes: every API write of a pass is here (and the reads that guard them:
who holds a child's name, the autoscaled counts in effect). The plan is carried out in waves,
the children the spec shapes freely dry-run first, the worker key's Secret created only after
the checks, and a refused child leaves nothing half-applied."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pdwarden_operator import plan, replicas, worker_key_secret
from pdwarden_operator.cache import controlled_by, controller_ref
from pdwarden_operator.kube import apply as kube_apply
from pdwarden_operator.kube.client import KubeApiError, KubeClient
from pdwarden_operator.models import DisaggregatedModelSpec
from pdwarden_operator.reconcile.errors import Refused, RetryLater, worker_key_failed
from pdwarden_operator.reconcile.observation import Observation
from pdwarden_operator.reconcile.planner import PassPlan
from pdwarden_operator.render.children import child_key, spec_field
from pdwarden_operator.render.gone_pods import gone_pods_configmap
from pdwarden_operator.render.kinds import USER_SHAPED_KINDS
from pdwarden_operator.render.meta import Obj, Owner, role_of
from pdwarden_operator.render.worker_key import bind_created_key, worker_key_secret_object

log = logging.getLogger("pdwarden.reconcile")


@dataclass(frozen=True)
class Executed:
    """What `execute` did: the children as the API server returned them, the ones deleted, the
    owner the applied children were rendered for and the render (both over the worker key's
    Secret when the pass created it), and the children as the pass left them."""

    applied: tuple[Obj, ...]
    deleted: tuple[Obj, ...]
    rendered_for: Owner
    desired: tuple[Obj, ...] | None
    children: Mapping[tuple[str, str], Obj]


def names(objs: list[Obj]) -> list[str]:
    """`Kind/name` of each object (for logs)."""
    return [f"{o['kind']}/{o['metadata']['name']}" for o in objs]


async def execute(kube: KubeClient, obs: Observation, decided: PassPlan) -> Executed:
    """The plan carried out: every API write of a pass is here (and the reads that guard them:
    who holds a child's name, the autoscaled counts in effect). A refused child raises Refused
    with nothing half-applied; a transient failure raises RetryLater."""
    owner = obs.owner
    children = dict(obs.children)
    applied: list[Obj] = []
    rendered_for, desired = owner, decided.desired
    if decided.apply:
        if obs.children:
            log.info("%s/%s: applying %s", owner.namespace, owner.name, ", ".join(names(list(decided.apply))))
        assert desired is not None  # something to apply: the planner rendered
        applied, rendered_for, bound = await _apply(kube, obs, list(decided.apply), list(desired))
        desired = tuple(bound) if bound else desired
        children.update((child_key(o), o) for o in applied)
    for obj in decided.delete:
        log.info(
            "%s/%s: deleting %s %s (no longer in the spec)", owner.namespace, owner.name, *child_key(obj)
        )
        meta = obj["metadata"]
        try:
            await kube_apply.delete(kube, obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        except KubeApiError as exc:
            raise RetryLater(f"deleting {child_key(obj)} failed: {exc}") from exc
        children.pop(child_key(obj), None)
    return Executed(tuple(applied), decided.delete, rendered_for, desired, children)


async def _dry_run(kube: KubeClient, spec: DisaggregatedModelSpec, objs: list[Obj]) -> None:
    """Let the API server validate and admit the children the spec shapes freely (pod templates,
    NetworkPolicy peers) before anything is applied, so that a refused one leaves nothing
    half-applied. The refusal names the child, the spec field it came from and the API server's
    field path."""
    checked = [o for o in objs if o["kind"] in USER_SHAPED_KINDS]
    results = await asyncio.gather(
        *(kube_apply.apply(kube, o, dry_run=True) for o in checked), return_exceptions=True
    )
    for obj, result in zip(checked, results, strict=True):
        if not isinstance(result, BaseException):
            continue
        if not isinstance(result, KubeApiError):
            raise result
        if result.retriable:
            raise RetryLater(f"dry-run of the children failed: {result}") from result
        message = _refusal(obj, result, "'s dry-run; nothing was applied")
        raise Refused(message, reason="ApplyFailed", spec=spec) from result


def _refusal(obj: Obj, exc: KubeApiError, outcome: str) -> str:
    """What the status says of a child the API server refused: the child, the spec field it
    came from, what became of the pass (`outcome`) and the API server's words."""
    return (
        f"{obj['kind']} {obj['metadata']['name']} (from {spec_field(obj)}) was refused by the "
        f"API server{outcome}: {exc.message}"
    )


async def _refuse_foreign(
    kube: KubeClient,
    body: Mapping[str, Any],
    spec: DisaggregatedModelSpec,
    objs: list[Obj],
    known: Mapping[tuple[str, str], Obj],
) -> set[tuple[str, str]]:
    """Never take over an object by its name: a child is created only where none exists or the
    one there is already controlled by this model. Server-side apply with force would otherwise
    rewrite another team's object and make it ours (deleting the model would then delete it).
    Children the watch already holds are ours; the others are read once, from the API
    server's watch cache rather than etcd (13 quorum reads per new model were a large part
    of the API server's cost in a burst): a moment old at most, and a read from etcd is no
    more one step with the apply that follows it. Returns the children found that the watches
    did not hold (ours, since nothing else passes)."""
    uid = body["metadata"]["uid"]
    unknown = [o for o in objs if child_key(o) not in known]
    found = await asyncio.gather(
        *(
            kube_apply.get(
                kube,
                o["apiVersion"],
                o["kind"],
                o["metadata"]["namespace"],
                o["metadata"]["name"],
                from_watch_cache=True,
            )
            for o in unknown
        ),
        return_exceptions=True,
    )
    taken, ours = [], set()
    for obj, current in zip(unknown, found, strict=True):
        if isinstance(current, KubeApiError):
            raise RetryLater(f"reading {'/'.join(child_key(obj))} failed: {current}") from current
        if isinstance(current, BaseException):
            raise current
        if current is not None and not controlled_by(current, uid):
            taken.append(f"{obj['kind']} {obj['metadata']['name']} ({_controller(current)})")
        elif current is not None:
            ours.add(child_key(obj))
    if taken:
        message = (
            f"{', '.join(taken)} already exist and are not this model's; nothing was applied: "
            "rename the model or remove them"
        )
        raise Refused(message, reason="NameTaken", spec=spec)
    return ours


def _controller(obj: Mapping[str, Any]) -> str:
    ctl = controller_ref(obj)
    return f"controlled by {ctl.get('kind')} {ctl.get('name')}" if ctl else "no controller"


async def with_worker_key(
    kube: KubeClient, spec: DisaggregatedModelSpec, owner: Owner, desired: list[Obj]
) -> tuple[Owner, list[Obj], Obj | None]:
    """`owner` and `desired` (every child, as rendered), or, when the model has no worker key's
    Secret yet (the render mounts the placeholder, `worker_key_secret.pending`), the owner and
    every child bound to one created now (`bind_created_key`: no second render), and that
    Secret."""
    use = owner.worker_key
    pending = worker_key_secret.pending(owner.name)
    if use is None or pending not in use.secrets:
        return owner, desired, None
    secret = worker_key_secret_object(owner, spec, worker_key_secret.new_key())
    try:
        created = await kube_apply.create(kube, secret)
    except KubeApiError as exc:
        raise worker_key_failed(spec, exc) from exc
    name = created["metadata"]["name"]
    log.info("%s/%s: created the worker key's Secret %s", owner.namespace, owner.name, name)
    bound_owner = replace(owner, worker_key=use.renamed(pending, name))
    return bound_owner, plan.stamped(bind_created_key(desired, pending, name)), created


async def _apply(
    kube: KubeClient, obs: Observation, objs: list[Obj], desired: list[Obj]
) -> tuple[list[Obj], Owner, list[Obj] | None]:
    """Apply `objs` (of the render `desired`) in waves; a refused child fails the pass with
    nothing half-applied. Returns what the API server answered, the owner the children were
    rendered for, and, when the pass created the worker key's Secret, every child bound to it
    (then every child is applied; else None). A model with no child yet skips the dry-run:
    should a child be refused, what the pass created is deleted again (a dry-run of a new
    model's five user-shaped children was a fifth of its applies, for a refusal that admission
    of the model itself almost always catches first). The later passes of a refused generation
    (the status writer remembers it) dry-run first, so a model that stays refused creates and
    removes nothing again."""
    body, spec, owner, known = obs.body, obs.spec, obs.owner, obs.children
    existing = await _refuse_foreign(kube, body, spec, [*objs, gone_pods_configmap(owner, "")], known)
    fresh = not known and not existing and not obs.refused_before
    if not fresh:
        await _dry_run(kube, spec, objs)
    owner, bound, secret = await with_worker_key(kube, spec, owner, desired)
    if secret is not None:  # every child is applied, bound to the created Secret
        objs = bound
    objs = await _fresh_replicas(kube, spec, objs)
    made: list[Obj] = []
    for wave in plan.apply_waves(objs):
        results = await asyncio.gather(*(kube_apply.apply(kube, o) for o in wave), return_exceptions=True)
        made += [r for r in results if not isinstance(r, BaseException)]
        failed = [(o, r) for o, r in zip(wave, results, strict=True) if isinstance(r, BaseException)]
        if not failed:
            continue
        obj, exc = failed[0]
        if not isinstance(exc, KubeApiError):
            raise exc
        if exc.retriable:
            raise RetryLater(f"applying {'/'.join(child_key(obj))} failed: {exc}") from exc
        # What we rendered from this spec was refused (a bad quantity, an admission policy):
        # retrying will not help until the spec changes. Say so in status.
        outcome = ""
        if fresh:
            await _undo(kube, owner, [*made, *([secret] if secret is not None else [])])
            outcome = "; nothing was applied (what this pass had created was deleted)"
        raise Refused(_refusal(obj, exc, outcome), reason="ApplyFailed", spec=spec) from exc
    return made, owner, bound if secret is not None else None


async def _undo(kube: KubeClient, owner: Owner, made: list[Obj]) -> None:
    """Delete what a refused first pass created; one that cannot be deleted now stays (the model
    owns it, and the status already says the pass failed)."""
    for obj in reversed(made):
        meta = obj["metadata"]
        try:
            await kube_apply.delete(kube, obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        except KubeApiError as exc:
            where = f"{owner.namespace}/{owner.name}"
            log.warning("%s: could not delete %s %s: %s", where, *child_key(obj), exc)


async def _fresh_replicas(kube: KubeClient, spec: DisaggregatedModelSpec, objs: list[Obj]) -> list[Obj]:
    """`objs`, an autoscaled role's Deployment carrying the count the API server holds now: the
    watch may not have brought the autoscaler's last step yet, and applying an older count would
    undo it."""
    out = []
    for obj in objs:
        role = role_of(obj)
        if obj["kind"] == "Deployment" and role in spec.autoscaled_roles:
            meta = obj["metadata"]
            try:
                current = await kube_apply.get(kube, "apps/v1", "Deployment", meta["namespace"], meta["name"])
            except KubeApiError as exc:
                raise RetryLater(f"reading Deployment {meta['name']}'s replicas failed: {exc}") from exc
            count = replicas.in_effect(spec.role(role), replicas.deployed(current))
            obj = {**obj, "spec": {**obj["spec"], "replicas": count}}
        out.append(obj)
    return out

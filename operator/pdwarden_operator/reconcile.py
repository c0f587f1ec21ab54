"""Reconcile one DisaggregatedModel in a straight line: observe -> plan -> execute -> one
status write.

- observe (`observe`): the spec validated and allowed by the pod policy, the owner as its
  children see it (who uses its worker key), what the status writer remembers -> a frozen
  `Observation`;
- plan (`plan_pass`, pure): render and compare with the children the operator's watches hold
  -> a `PassPlan` (what to apply, what the spec dropped);
- execute (`execute`): every API write of a pass, in waves, nothing half-applied on a refusal;
- status (`_report`, or `_report_refusal` for a refused pass): written only when it changed.

An unchanged, healthy model costs no API call, so a thousand of them resynced or resumed cost
render and compare only. kopf is not imported here; handlers.py translates the exceptions
below into kopf's. What a pass reads and writes besides the model and its children comes in
`ReconcileParts` (the operator's context builds one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Hashable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from pydantic import ValidationError

from pdwarden_contract import LABEL_MANAGED_BY, LABEL_MODEL, LABEL_ROLE, MANAGED_BY, ROLES, RUNTIME_ROLES
from pdwarden_operator import plan, replicas, scheduling, timestamps, worker_key_secret
from pdwarden_operator.cache import controlled_by, controller_ref
from pdwarden_operator.kube import apply as kube_apply
from pdwarden_operator.kube.client import KubeApiError
from pdwarden_operator.models import DisaggregatedModelSpec, parse_spec
from pdwarden_operator.podpolicy import PodPolicy, violations
from pdwarden_operator.render.children import child_key, render_children, spec_field
from pdwarden_operator.render.gone_pods import gone_pods_configmap
from pdwarden_operator.render.kinds import USER_SHAPED_KINDS
from pdwarden_operator.render.meta import Owner, child_name
from pdwarden_operator.render.worker_key import worker_key_secret_object
from pdwarden_operator.status import Observed, observe_deployment, observe_groups
from pdwarden_operator.status_writer import StatusWriter

Obj = dict[str, Any]
T = TypeVar("T")
MANAGED_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
log = logging.getLogger("pdwarden.reconcile")


@dataclass
class PassResult:
    """What one pass did: the status it computed and the children the API server returned."""

    status: Obj
    applied: list[Obj] = field(default_factory=list)
    # `plan.settled_key` when the pass found nothing to apply or delete, else None: the next
    # pass with the same key skips render and compare.
    settled: Hashable | None = None

    @property
    def applied_names(self) -> list[str]:
        return _names(self.applied)


def _names(objs: list[Obj]) -> list[str]:
    return [f"{o['kind']}/{o['metadata']['name']}" for o in objs]


class InvalidSpec(Exception):
    """The spec cannot be reconciled until a person changes it."""


class RetryLater(Exception):
    """A transient failure (API unavailable, conflict, throttling): try again after `delay`."""

    def __init__(self, message: str, delay: float = 5.0) -> None:
        super().__init__(message)
        self.delay = delay


class Refused(Exception):
    """What a pass found it cannot do until a person changes the spec: the spec itself
    (`reason` None: it does not validate, or the pod policy refuses it; `shown` is what the
    status says) or the children the API server refused (`reason`: ApplyFailed, NameTaken,
    WorkerKeyFailed). `reconcile` writes the status that says so, then raises InvalidSpec."""

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        spec: DisaggregatedModelSpec | None = None,
        shown: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.reason, self.spec = message, reason, spec
        self.shown = shown if shown is not None else message


def describe_validation_error(exc: ValidationError, prefix: str = "spec") -> str:
    """`spec.prefill.tensorParallel: must be ...; spec.model: Field required`."""
    parts = []
    for err in exc.errors():
        loc = ".".join([prefix, *(str(p) for p in err["loc"])])
        msg = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def _generation(body: Mapping[str, Any]) -> int:
    return int(body["metadata"].get("generation") or 0)


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
            sets = [o for (kind, _), o in children.items() if kind == "StatefulSet" and _role_of(o) == role]
            workloads[role] = observe_groups(sets, role_spec.nodes_per_replica, role_spec.replicas)
    return Observed(
        generation=_generation(body),
        workloads=workloads,
        error_reason=error.get("reason"),
        error_message=error.get("message"),
    )


def _role_of(obj: Obj) -> str | None:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_ROLE)


# --- observe ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """What a pass reads before it decides anything; the planner only reads it."""

    body: Mapping[str, Any]
    spec: DisaggregatedModelSpec
    # the model as its children see it: who uses its worker key, the autoscaled roles' counts
    owner: Owner
    children: Mapping[tuple[str, str], Obj]  # what the watches hold (ours for sure)
    settled_before: Hashable | None  # the last pass's `PassResult.settled`
    # the status writer's last observation says the API server refused this generation's children
    refused_before: bool


async def observe(
    parts: ReconcileParts,
    body: Mapping[str, Any],
    children: Mapping[tuple[str, str], Obj],
    settled_before: Hashable | None,
    *,
    verify_secret: bool,
) -> Observation:
    """The spec (Refused when it does not validate or the pod policy refuses it) and the owner
    (`verify_secret`: whether its worker key's Secret still exists, one dry-run)."""
    spec = _spec(parts.pod_policy, body)
    owner = await _owner(parts.baseline, body, spec, children, verify=verify_secret)
    meta = body["metadata"]
    refused = parts.writer.refused(meta["namespace"], meta["name"], _generation(body))
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


async def _owner(
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
        workloads = await baseline.workloads(owner)
    key = spec.worker_key
    use = worker_key_secret.plan_use(workloads, owner.name, key.enabled, key.rotation)
    pending = worker_key_secret.pending(owner.name)
    newest = None if use is None else worker_key_secret.newest(use.secrets, owner.name)
    checked = verify and key.enabled and newest not in (None, pending)
    if checked and newest is not None and not await _secret_exists(spec, owner, newest):
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

    async def workloads(self, owner: Owner) -> list[Obj]:
        now = asyncio.get_running_loop().time()
        async with self._locks.setdefault(owner.namespace, asyncio.Lock()):
            listed = self._by_namespace.get(owner.namespace)
            if listed is None or now - listed[0] > self.max_age_s:
                listed = self._by_namespace[owner.namespace] = (now, await self._list(owner.namespace))
        return list(listed[1].get(owner.uid, []))

    @staticmethod
    async def _list(namespace: str) -> dict[str, list[Obj]]:
        by_model: dict[str, list[Obj]] = {}
        for kind in worker_key_secret.WORKLOAD_KINDS:
            try:
                items = await kube_apply.list_objects("apps/v1", kind, namespace, MANAGED_SELECTOR)
            except KubeApiError as exc:
                raise RetryLater(f"listing the namespace's {kind}s failed: {exc}") from exc
            for item in items:
                ctl = controller_ref(item)
                if ctl is not None and ctl.get("uid"):
                    # a list's items carry no kind of their own
                    by_model.setdefault(str(ctl["uid"]), []).append({**item, "kind": kind})
        return by_model


@dataclass(frozen=True)
class ReconcileParts:
    """What a pass reads and writes besides the model and its children: the one status writer,
    the namespaces' baseline of workloads and the installation's pod policy."""

    writer: StatusWriter
    baseline: Baseline
    pod_policy: PodPolicy


async def _secret_exists(spec: DisaggregatedModelSpec, owner: Owner, name: str) -> bool:
    # With the model's labels and owner: the chart's admission policy admits the operator's
    # writes, dry runs included, only to objects it manages.
    probe = worker_key_secret_object(owner, spec, "")
    probe["metadata"] = {**{k: v for k, v in probe["metadata"].items() if k != "generateName"}, "name": name}
    try:
        await kube_apply.create(probe, dry_run=True)
    except KubeApiError as exc:
        if exc.status == 409:
            return True
        raise _worker_key_failed(spec, exc) from exc
    return False


def _worker_key_failed(spec: DisaggregatedModelSpec, exc: KubeApiError) -> RetryLater | Refused:
    if exc.retriable:
        return RetryLater(f"creating the worker key's Secret failed: {exc}")
    message = (
        f"cannot create the worker key's Secret ({exc.status} {exc.reason}: {exc.message}); the operator "
        "needs create on secrets in this namespace, or set spec.workerKey.enabled: false"
    )
    return Refused(message, reason="WorkerKeyFailed", spec=spec)


# --- plan (pure) -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PassPlan:
    """What a pass is to do, from its observation alone (`plan_pass`)."""

    settled: Hashable  # the observation's `plan.settled_key`
    desired: tuple[Obj, ...] | None  # the render; None: the settled key matched, nothing rendered
    apply: tuple[Obj, ...]  # missing, changed by hand, or rendered differently (`plan.to_apply`)
    delete: tuple[Obj, ...]  # of an optional kind the spec no longer asks for (`plan.to_delete`)


def plan_pass(obs: Observation) -> PassPlan:
    """Render and compare, unless nothing anyone edits moved since render last matched."""
    settled = plan.settled_key(_inputs(obs.body, obs.owner), obs.children)
    if settled == obs.settled_before:
        return PassPlan(settled, None, (), ())
    desired = plan.stamped(render_children(obs.owner, obs.spec))
    return PassPlan(
        settled,
        tuple(desired),
        tuple(plan.to_apply(desired, obs.children)),
        tuple(plan.to_delete(desired, obs.children)),
    )


def _inputs(body: Mapping[str, Any], owner: Owner) -> Hashable:
    """What of the model its children render from, besides the children themselves."""
    return (
        owner.uid,
        _generation(body),
        tuple(sorted(owner.annotations.items())),
        repr(owner.worker_key),
        tuple(sorted(owner.deployed.items())),
    )


# --- execute ---------------------------------------------------------------------------------


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


async def execute(obs: Observation, decided: PassPlan) -> Executed:
    """The plan carried out: every API write of a pass is here (and the reads that guard them:
    who holds a child's name, the autoscaled counts in effect). A refused child raises Refused
    with nothing half-applied; a transient failure raises RetryLater."""
    owner = obs.owner
    children = dict(obs.children)
    applied: list[Obj] = []
    rendered_for, desired = owner, decided.desired
    if decided.apply:
        if obs.children:
            log.info(
                "%s/%s: applying %s", owner.namespace, owner.name, ", ".join(_names(list(decided.apply)))
            )
        applied, rendered_for, rerendered = await _apply(obs, list(decided.apply))
        desired = tuple(rerendered) if rerendered else desired
        children.update((child_key(o), o) for o in applied)
    for obj in decided.delete:
        log.info(
            "%s/%s: deleting %s %s (no longer in the spec)", owner.namespace, owner.name, *child_key(obj)
        )
        meta = obj["metadata"]
        try:
            await kube_apply.delete(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        except KubeApiError as exc:
            raise RetryLater(f"deleting {child_key(obj)} failed: {exc}") from exc
        children.pop(child_key(obj), None)
    return Executed(tuple(applied), decided.delete, rendered_for, desired, children)


async def _dry_run(spec: DisaggregatedModelSpec, objs: list[Obj]) -> None:
    """Let the API server validate and admit the children the spec shapes freely (pod templates,
    NetworkPolicy peers) before anything is applied, so that a refused one leaves nothing
    half-applied. The refusal names the child, the spec field it came from and the API server's
    field path."""
    checked = [o for o in objs if o["kind"] in USER_SHAPED_KINDS]
    results = await asyncio.gather(
        *(kube_apply.apply(o, dry_run=True) for o in checked), return_exceptions=True
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
    spec: DisaggregatedModelSpec, owner: Owner, objs: list[Obj]
) -> tuple[list[Obj], Obj | None]:
    """`objs`, or, when the model has no worker key's Secret yet, every child rendered over
    one created now (and that Secret)."""
    use = owner.worker_key
    pending = worker_key_secret.pending(owner.name)
    if use is None or pending not in use.secrets:
        return objs, None
    secret = worker_key_secret_object(owner, spec, worker_key_secret.new_key())
    try:
        created = await kube_apply.create(secret)
    except KubeApiError as exc:
        raise _worker_key_failed(spec, exc) from exc
    name = created["metadata"]["name"]
    log.info("%s/%s: created the worker key's Secret %s", owner.namespace, owner.name, name)
    return plan.stamped(render_children(with_created_key(owner, name), spec)), created


def with_created_key(owner: Owner, secret_name: str) -> Owner:
    """`owner` with the created Secret's name wherever its key use names the stand-in."""
    assert owner.worker_key is not None
    renamed = owner.worker_key.renamed(worker_key_secret.pending(owner.name), secret_name)
    return replace(owner, worker_key=renamed)


async def _apply(obs: Observation, objs: list[Obj]) -> tuple[list[Obj], Owner, list[Obj] | None]:
    """Apply `objs` in waves; a refused child fails the pass with nothing half-applied. Returns
    what the API server answered, the owner the children were rendered for, and, when the pass
    created the worker key's Secret, every child as rendered over it (else None). A model
    with no child yet skips the dry-run: should a child be refused, what the pass created is
    deleted again (a dry-run of a new model's five user-shaped children was a fifth of its
    applies, for a refusal that admission of the model itself almost always catches first). The
    later passes of a refused generation (the status writer remembers it) dry-run first, so a
    model that stays refused creates and removes nothing again."""
    body, spec, owner, known = obs.body, obs.spec, obs.owner, obs.children
    existing = await _refuse_foreign(body, spec, [*objs, gone_pods_configmap(owner, "")], known)
    fresh = not known and not existing and not obs.refused_before
    if not fresh:
        await _dry_run(spec, objs)
    objs, secret = await with_worker_key(spec, owner, objs)
    rerendered = None
    if secret is not None:
        owner, rerendered = with_created_key(owner, secret["metadata"]["name"]), objs
    objs = await _fresh_replicas(spec, objs)
    made: list[Obj] = []
    for wave in plan.apply_waves(objs):
        results = await asyncio.gather(*(kube_apply.apply(o) for o in wave), return_exceptions=True)
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
            await _undo(owner, [*made, *([secret] if secret is not None else [])])
            outcome = "; nothing was applied (what this pass had created was deleted)"
        raise Refused(_refusal(obj, exc, outcome), reason="ApplyFailed", spec=spec) from exc
    return made, owner, rerendered


async def _undo(owner: Owner, made: list[Obj]) -> None:
    """Delete what a refused first pass created; one that cannot be deleted now stays (the model
    owns it, and the status already says the pass failed)."""
    for obj in reversed(made):
        meta = obj["metadata"]
        try:
            await kube_apply.delete(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        except KubeApiError as exc:
            where = f"{owner.namespace}/{owner.name}"
            log.warning("%s: could not delete %s %s: %s", where, *child_key(obj), exc)


async def _fresh_replicas(spec: DisaggregatedModelSpec, objs: list[Obj]) -> list[Obj]:
    """`objs`, an autoscaled role's Deployment carrying the count the API server holds now: the
    watch may not have brought the autoscaler's last step yet, and applying an older count would
    undo it."""
    out = []
    for obj in objs:
        role = _role_of(obj)
        if obj["kind"] == "Deployment" and role in spec.autoscaled_roles:
            meta = obj["metadata"]
            try:
                current = await kube_apply.get("apps/v1", "Deployment", meta["namespace"], meta["name"])
            except KubeApiError as exc:
                raise RetryLater(f"reading Deployment {meta['name']}'s replicas failed: {exc}") from exc
            count = replicas.in_effect(spec.role(role), replicas.deployed(current))
            obj = {**obj, "spec": {**obj["spec"], "replicas": count}}
        out.append(obj)
    return out


# --- status: the one write -------------------------------------------------------------------


async def _report(parts: ReconcileParts, obs: Observation, done: Executed) -> Obj:
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
    if waiting and _waiting_long(parts.writer.preview(body, spec, observed)):
        pods = await _pods(body)
        if pods is not None:
            observed = replace(observed, blocked={**scheduling.unschedulable(pods), **observed.blocked})
    done_status = await _guarded(parts.writer.observed(body, spec, observed))
    return done_status[0] if done_status else {}


async def _report_refusal(parts: ReconcileParts, body: Mapping[str, Any], refusal: Refused) -> InvalidSpec:
    """The status of a refused pass: Degraded with the refusal's message until the spec changes."""
    if refusal.reason is None or refusal.spec is None:
        await _guarded(parts.writer.invalid(body, refusal.shown, _generation(body)))
    else:
        observed = _observed(body, refusal.spec, {}, reason=refusal.reason, message=refusal.message)
        await _guarded(parts.writer.observed(body, refusal.spec, observed))
    return InvalidSpec(refusal.message)


def _waiting_long(new: Obj) -> bool:
    """Whether pods have been not ready for a while (then it is worth asking why)."""
    ready = next((c for c in new["conditions"] if c["type"] == "Ready"), None)
    if ready is None or ready["reason"] not in ("ReplicasNotReady", "PodsBlocked"):
        return False
    start = timestamps.from_rfc3339(ready.get("lastTransitionTime"))
    return start is not None and time.time() - start >= scheduling.LOOK_AFTER_S


async def _pods(body: Mapping[str, Any]) -> list[Obj] | None:
    meta = body["metadata"]
    try:
        return await kube_apply.list_objects(
            "v1", "Pod", meta["namespace"], f"{LABEL_MODEL}={meta['name']}", from_watch_cache=True
        )
    except KubeApiError as exc:
        log.warning("%s/%s: listing pods failed: %s", meta["namespace"], meta["name"], exc)
        return None  # status without the scheduler's reason this time


# --- the pass ---------------------------------------------------------------------------------


async def reconcile(
    parts: ReconcileParts,
    body: Mapping[str, Any],
    children: Mapping[tuple[str, str], Obj],
    settled_before: Hashable | None = None,
    *,
    verify_secret: bool = False,
) -> PassResult:
    """One straight line for every cause (create, resume, spec change, a child's event, the
    periodic resync): observe -> plan (pure) -> execute -> one status write. `parts`: the
    writer, baseline and pod policy of the operator's context. `children`: what the watches hold
    (ours for sure). `settled_before`: the last pass's `PassResult.settled`. `verify_secret`:
    make sure the worker key's Secret still exists (one dry-run). A refusal (the spec, or a
    child the API server refused) is written to status and raised as InvalidSpec."""
    try:
        obs = await observe(parts, body, children, settled_before, verify_secret=verify_secret)
        decided = plan_pass(obs)
        done = await execute(obs, decided)
    except Refused as refusal:
        raise await _report_refusal(parts, body, refusal) from (refusal.__cause__ or refusal)
    status = await _report(parts, obs, done)
    if done.applied or done.deleted:
        assert done.desired is not None
        settled_now = await _settled_after(parts, obs, done)
        return PassResult(status, list(done.applied), settled_now)
    matched = done.children.keys() == children.keys()  # the cluster matched the render
    return PassResult(status, list(done.applied), decided.settled if matched else None)


async def _settled_after(parts: ReconcileParts, obs: Observation, done: Executed) -> Hashable | None:
    """The `plan.settled_key` of the children as a pass that applied or deleted left them, when
    they cover its render and the next pass would render the same (its owner, computed from these
    children, has the same inputs); else None. The watch then brings back what the pass wrote at
    the same generations, and the controllers' status updates leave those alone: without this, each
    of them rendered and compared a new model again."""
    after = await _owner(parts.baseline, obs.body, obs.spec, done.children, verify=False)
    inputs = _inputs(obs.body, after)
    if inputs != _inputs(obs.body, done.rendered_for):
        return None
    desired = list(done.desired or ())
    if plan.to_apply(desired, done.children) or plan.to_delete(desired, done.children):
        return None
    return plan.settled_key(inputs, done.children)

"""kopf handlers: thin adapters from kopf's causes to a reconcile pass (reconcile/run.py).

- login -> the credentials of the operator's own client (the context's `kube`, whose
  credentials kube/credentials.py found);
- watch events of DisaggregatedModels and their children feed `cache.ChildStore`;
- a model this process has not handled yet (created, or found at start) or whose generation,
  labels or annotations changed -> a full `reconcile` (what differs is applied), queued in
  arrival order, context.RECONCILE_CONCURRENCY at once. Not kopf's create/update/resume
  handlers: those deep-copied every model event to diff it and patched every handled model
  with an annotation (a write per model, and its watch event), which is what a burst of new
  models paid most for; the generation says the same;
- one background loop resyncs models whose children changed (a deleted or edited child is
  restored, pod readiness reaches status), every model that is not settled and Ready every
  RESYNC_INTERVAL_S, and every model every FULL_RESYNC_INTERVAL_S.
No timers or daemons per object: those would make kopf put a finalizer on every resource,
and deletion needs nothing but owner-reference garbage collection. What the handlers keep
(the child store, the resync queue, the reconciles' bookkeeping) is the operator's context's
(context.py), handed over in kopf's memo; a model that is gone is forgotten by its registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import kopf

import pdwarden_contract as contract
from pdwarden_operator import namespace_deletions
from pdwarden_operator.cache import MANAGED_SELECTOR, ModelKey
from pdwarden_operator.context import OperatorContext, context_of
from pdwarden_operator.kube import apply as kube_apply
from pdwarden_operator.kube import model_status as kube_model_status
from pdwarden_operator.kube.client import group_version_plural
from pdwarden_operator.reconcile import run
from pdwarden_operator.reconcile.errors import InvalidSpec, RetryLater
from pdwarden_operator.render import kinds

log = logging.getLogger("pdwarden.handlers")

GROUP, VERSION, PLURAL = contract.API_GROUP, contract.API_VERSION, contract.PLURAL
RESYNC_INTERVAL_S = 30.0  # safety net; events drive the usual case
# Every model, settled and Ready ones too: with a thousand unchanged models the 30 s pass over
# all of them was most of the operator's idle CPU.
FULL_RESYNC_INTERVAL_S = 300.0
# Coalesce a burst of child events into one resync: a new model's three Deployments (and the
# disruption budgets of its roles with pods) get their first status from the controllers within
# about a second; one status write for all of them instead of one each.
DEBOUNCE_S = 1.0
RESYNC_CONCURRENCY = 8
RETRY_MAX_S = 60.0
MANAGED = {contract.LABEL_MANAGED_BY: contract.MANAGED_BY}
KOPF_PREFIX = f"kopf.{GROUP}"

# (group, version, plural, apiVersion, kind) of each kind of child (kinds.CHILD_KINDS)
CHILD_KINDS = tuple(
    (*group_version_plural(api_version, kind), api_version, kind) for api_version, kind in kinds.CHILD_KINDS
)


class DiffBaseWhenChanging(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base, built only while a changing handler (on.create, on.update, ...) is
    registered. kopf builds it for every watch event of every object it watches, children and
    pods included (a deep copy of the body less its status), to diff it for those handlers;
    pdwarden registers none (handlers.py queues its own full reconciles), and the copies were
    an eighth of the operator's CPU in a burst of new models."""

    def __init__(self, *, registry: kopf.OperatorRegistry | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._registry = registry

    def _changing(self) -> bool:
        registry = self._registry or kopf.get_default_registry()
        changing = getattr(registry, "_changing", None)  # kopf's own; if it ever goes, build
        return changing is None or bool(changing.get_all_handlers())

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        if self._changing():
            return super().build(body=body, extra_fields=extra_fields)
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return super().fetch(body=body) if self._changing() else None


def apply_settings(settings: kopf.OperatorSettings) -> None:
    """pdwarden's kopf settings (pure: only mutates `settings`)."""
    # Progress and the last-handled spec live in kopf.pdwarden.io/ annotations (kopf ignores every
    # annotation under its own prefix, so it must not be pdwarden.io/ itself); status is ours alone.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_PREFIX)
    settings.persistence.diffbase_storage = DiffBaseWhenChanging(
        prefix=KOPF_PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.WARNING  # Events for warnings and errors only
    settings.watching.server_timeout = 300
    # Watch only pdwarden's own children, filtered by the API server: the handlers' label filter
    # alone would stream every Deployment, Service, ... of the cluster into the operator.
    for group, version, plural, *_kind in CHILD_KINDS:
        settings.watching.label_selectors[group, version, plural] = MANAGED_SELECTOR


def is_glob(namespace: str) -> bool:
    """A --namespace pattern (kopf resolves `team-*` by listing namespaces), not a name."""
    return bool(set(namespace) & set("*?[!"))


def watch_scope(context: OperatorContext, namespaces: list[str]) -> None:
    """The namespaces the operator watches (none: all of them), before kopf runs: where
    `prefill` lists the children (None: every namespace; nothing for globs, which kopf
    resolves), and the namespace watch when there are globs."""
    namespace_deletions.watch(namespaces, is_glob)
    globbed = any(is_glob(ns) for ns in namespaces)
    scope: list[str | None] = [*namespaces] if namespaces else [None]
    context.prefill_scope = [] if globbed else scope


async def prefill(context: OperatorContext) -> int:
    """Fill the child store with every child before the first handler runs: kopf resumes models as
    soon as their own watch lists them, and a model whose children the watches have not
    brought yet would be applied again in full (a restarted operator over a thousand models
    sent thousands of needless applies). One LIST per kind and namespace; a failed one leaves
    that kind to its watch. Returns the children recorded."""
    found = 0
    for namespace in context.prefill_scope:
        for *_resource, api_version, kind in CHILD_KINDS:
            try:
                selector = MANAGED_SELECTOR
                items = await kube_apply.list_objects(context.kube, api_version, kind, namespace, selector)
            except Exception as exc:  # only a head start: it must never keep the operator from starting
                log.warning("listing %ss before start failed (the watch brings them): %s", kind, exc)
                continue
            for item in items:
                found += context.children.child_event(api_version, kind, "ADDED", item) is not None
    return found


@kopf.on.login()
async def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """kopf's watches and patches use the credentials the operator's own client found (one
    reader of the kubeconfig or the service account); asked again after a 401, so a rotated
    service account token is read anew."""
    creds = context_of(memo).kube.creds
    return kopf.ConnectionInfo(
        server=creds.server,
        ca_path=str(creds.ca_file),
        certificate_path=str(creds.cert_file) if creds.cert_file else None,
        private_key_path=str(creds.key_file) if creds.key_file else None,
        token=creds.bearer(),
    )


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    context = context_of(memo)
    apply_settings(settings)
    log.info("%d children known before the first handler", await prefill(context))
    context.reconciles.resync_loop = asyncio.create_task(_resync_loop(context), name="pdwarden-resync")


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    context = context_of(memo)
    reconciles = context.reconciles
    if reconciles.resync_loop is not None:
        reconciles.resync_loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reconciles.resync_loop
    for task in list(reconciles.tasks):  # queued full reconciles: the next leader resumes every model
        task.cancel()
    await asyncio.gather(*reconciles.tasks, return_exceptions=True)
    await context.kube.aclose()


def _essence(body: Mapping[str, Any]) -> Hashable:
    """What of a model makes a full reconcile due when it changes: the object itself (its UID),
    its spec (the generation moves with it) and its labels and annotations (kopf's own left out).
    A status write changes none of these."""
    meta = body.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return (
        meta.get("uid"),
        meta.get("generation"),
        tuple(sorted((meta.get("labels") or {}).items())),
        tuple(sorted((k, v) for k, v in annotations.items() if not k.startswith(KOPF_PREFIX))),
    )


def _due(context: OperatorContext, key: ModelKey, body: Mapping[str, Any]) -> bool:
    """Whether the model's latest body asks for a full reconcile not yet handled, queued or running."""
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return False  # owner references delete its children
    essence = _essence(body)
    reconciles = context.reconciles
    return (
        key not in reconciles.queued
        and essence != reconciles.handled.get(key)
        and essence != reconciles.running.get(key)
    )


def _enqueue(context: OperatorContext, key: ModelKey) -> None:
    """Queue a full reconcile of the model (one at most waits per model: it reads the latest body
    when its turn comes). asyncio's semaphore is FIFO: models are handled in arrival order."""
    body = context.children.models.get(key)
    if body is None or not _due(context, key, body):
        return
    reconciles = context.reconciles
    reconciles.queued.add(key)
    task = asyncio.create_task(_reconcile_full(context, key), name=f"reconcile {key[0]}/{key[1]}")
    reconciles.tasks.add(task)
    task.add_done_callback(reconciles.tasks.discard)


def _retry(context: OperatorContext, key: ModelKey, delay: float) -> None:
    asyncio.get_running_loop().call_later(delay, _enqueue, context, key)


async def _reconcile_full(context: OperatorContext, key: ModelKey) -> None:
    loop = asyncio.get_running_loop()
    queued = loop.time()
    store, reconciles = context.children, context.reconciles
    try:
        async with reconciles.slots, store.lock(key):
            reconciles.queued.discard(key)  # from here on a newer change queues another pass
            body = store.models.get(key)
            if body is None or not _due(context, key, body):  # deleted, or handled while it waited
                return
            essence = _essence(body)
            reconciles.running[key] = essence
            started = loop.time()
            try:
                outcome = await run.reconcile(
                    context.reconcile_parts,
                    body,
                    store.children_of(key),
                    store.settled.get(key),
                    verify_secret=True,
                )
            except InvalidSpec as exc:
                reconciles.handled[key] = essence  # status says so; the next change of the spec reconciles
                log.warning("%s/%s: not reconciled: %s", key[0], key[1], exc)
                return
            except RetryLater as exc:
                log.warning("%s/%s: %s (retry in %.0fs)", key[0], key[1], exc, exc.delay)
                _retry(context, key, exc.delay)
                return
            except Exception:  # never let one bad object stop the others
                log.exception("%s/%s: reconcile failed (retry in %.0fs)", key[0], key[1], RETRY_MAX_S)
                _retry(context, key, RETRY_MAX_S)
                return
            finally:
                reconciles.running.pop(key, None)
            if key not in store.models:
                return  # deleted meanwhile
            reconciles.handled[key] = essence
            _note(context, key, outcome)
            log.info(
                "%s/%s: reconciled generation %s in %.2fs (waited %.2fs for a slot)",
                key[0],
                key[1],
                (body.get("metadata") or {}).get("generation"),
                loop.time() - started,
                started - queued,
            )
    finally:
        reconciles.queued.discard(key)


def _note(context: OperatorContext, key: ModelKey, outcome: run.PassResult) -> None:
    """What a pass applied, whether it settled, and the status it wrote: known to the store now."""
    context.children.note_applied(key, outcome.applied)
    context.children.note_settled(key, outcome.settled)
    context.children.note_status(key, outcome.status)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def model_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    context = context_of(memo)
    key = context.model_event(event.get("type"), body)
    if key is not None:
        context.children.record(body)
        _enqueue(context, key)


def child_event(
    context: OperatorContext, api_version: str, kind: str, event_type: str | None, body: Mapping[str, Any]
) -> ModelKey | None:
    """A child's watch event: into the store, and its model's resync due; returns its model
    (None: not ours)."""
    key = context.children.child_event(api_version, kind, event_type, body)
    if key is not None:
        context.resync.mark(key)
    return key


def _register_child_watch(group: str, version: str, plural: str, api_version: str, kind: str) -> None:
    async def on_child(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        child_event(context_of(memo), api_version, kind, event.get("type"), body)

    on_child.__name__ = on_child.__qualname__ = f"watch_{plural}"
    kopf.on.event(group, version, plural, labels=MANAGED, id=f"watch_{plural}")(on_child)


for _kind in CHILD_KINDS:
    _register_child_watch(*_kind)


async def _resync_one(context: OperatorContext, key: tuple[str, str], sem: asyncio.Semaphore) -> None:
    store, failures = context.children, context.reconciles.failures
    async with sem, store.lock(key):
        body = store.models.get(key)
        if body is None:
            return
        children = store.children_of(key)
        try:
            outcome = await run.reconcile(context.reconcile_parts, body, children, store.settled.get(key))
        except InvalidSpec:
            return  # status already says so; the next spec change reconciles
        except RetryLater as exc:
            uid = str((body.get("metadata") or {}).get("uid") or "")
            if not await kube_model_status.still_exists(context.kube, *key, uid):
                # its deletion never came as an event (a deleted namespace kopf stopped watching)
                log.info("%s/%s: forgotten: the model is gone", *key)
                context.registry.forget(*key)
                return
            failed = failures[key] = failures.get(key, 0) + 1
            delay = min(RETRY_MAX_S, exc.delay * 2 ** (failed - 1))
            log.warning("%s/%s: %s (retry %d in %.0fs)", key[0], key[1], exc, failed, delay)
            asyncio.get_running_loop().call_later(delay, context.resync.mark, key)
            return
        except Exception:  # never let one bad object stop the loop
            log.exception("%s/%s: resync failed", *key)
            return
        failures.pop(key, None)
        _note(context, key, outcome)
        if outcome.applied:
            # a new model can reach this pass before its create handler: nothing to restore yet
            verb = "restored" if children else "created"
            log.info("%s/%s: %s %s", key[0], key[1], verb, ", ".join(outcome.applied_names))


async def _resync_loop(context: OperatorContext) -> None:
    queue = context.resync
    sem = asyncio.Semaphore(RESYNC_CONCURRENCY)
    loop = asyncio.get_running_loop()
    next_pass = loop.time() + RESYNC_INTERVAL_S
    next_full = loop.time() + FULL_RESYNC_INTERVAL_S
    while True:
        timeout = max(0.0, next_pass - loop.time())
        with contextlib.suppress(TimeoutError):  # asyncio.timeout: it never swallows a cancel
            async with asyncio.timeout(timeout):
                await queue.wake.wait()
        full = loop.time() >= next_full
        if full:
            queue.mark_all()
            next_full = loop.time() + FULL_RESYNC_INTERVAL_S
            next_pass = loop.time() + RESYNC_INTERVAL_S
        elif loop.time() >= next_pass:
            queue.mark_unsettled()
            next_pass = loop.time() + RESYNC_INTERVAL_S
        await asyncio.sleep(DEBOUNCE_S)
        keys = queue.take_dirty()
        if keys:
            began, cpu = loop.time(), time.process_time()
            await asyncio.gather(*(_resync_one(context, k, sem) for k in keys))
            if full:  # what a settled fleet costs every FULL_RESYNC_INTERVAL_S (bench reconcile reads it)
                log.info(
                    "full resync: %d models in %.3fs, %.4f CPU-s",
                    len(keys),
                    loop.time() - began,
                    time.process_time() - cpu,
                )

"""kopf handlers: thin adapters from kopf's causes to reconcile.py.

- login -> the credentials of the operator's own client (kube/credentials.py);
- watch events of DisaggregatedModels and their children feed `cache.Cache`;
- a model this process has not handled yet (created, or found at start) or whose generation,
  labels or annotations changed -> a full `reconcile` (what differs is applied), queued in
  arrival order, RECONCILE_CONCURRENCY at once. Not kopf's create/update/resume handlers: those
  deep-copied every model event to diff it and patched every handled model with an annotation
  (a write per model, and its watch event), which is what a burst of new models paid most for;
  the generation says the same;
- one background loop resyncs models whose children changed (a deleted or edited child is
  restored, pod readiness reaches status), every model that is not settled and Ready every
  RESYNC_INTERVAL_S, and every model every FULL_RESYNC_INTERVAL_S.
No timers or daemons per object: those would make kopf put a finalizer on every resource,
and deletion needs nothing but owner-reference garbage collection.
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
from pdwarden_operator import namespace_deletions, reconcile, render
from pdwarden_operator.cache import CHILDREN, ModelKey
from pdwarden_operator.kube import apply as kube_apply
from pdwarden_operator.kube import model_status as kube_model_status
from pdwarden_operator.kube.client import get_client, group_version_plural

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
# Full reconciles (create, resume, spec change) running at once. kopf starts one per object; a
# burst of 100 new models would otherwise share the API server evenly and all finish at the end.
# Bounded, they finish in arrival order; 8 x 10 applies still keep the client pool busy.
RECONCILE_CONCURRENCY = 8
RETRY_MAX_S = 60.0
MANAGED = {contract.LABEL_MANAGED_BY: contract.MANAGED_BY}
KOPF_PREFIX = f"kopf.{GROUP}"

# (group, version, plural, apiVersion, kind) of each kind of child (render.CHILD_KINDS)
CHILD_KINDS = tuple(
    (*group_version_plural(api_version, kind), api_version, kind) for api_version, kind in render.CHILD_KINDS
)

cache = CHILDREN
# Where `configure` lists the children before kopf's handlers start (None: every namespace);
# the CLI narrows it to its --namespace list, or to nothing for globs (kopf resolves those).
_prefill_scope: list[str | None] = [None]
_failures: dict[tuple[str, str], int] = {}  # consecutive transient failures per model: backoff
_loop_task: asyncio.Task[None] | None = None
_reconcile_slots = asyncio.Semaphore(RECONCILE_CONCURRENCY)
# Full reconciles: per model, what of it the last one handled (`_essence`; a refused spec counts
# as handled until it changes), the ones queued and not started yet, and their tasks.
_handled: dict[ModelKey, Hashable] = {}
_queued: set[ModelKey] = set()
_running: dict[ModelKey, Hashable] = {}
_tasks: set[asyncio.Task[None]] = set()


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
        settings.watching.label_selectors[group, version, plural] = reconcile.MANAGED_SELECTOR


def is_glob(namespace: str) -> bool:
    """A --namespace pattern (kopf resolves `team-*` by listing namespaces), not a name."""
    return bool(set(namespace) & set("*?[!"))


def watch_scope(namespaces: list[str]) -> None:
    """The namespaces the operator watches (none: all of them), before kopf runs."""
    namespace_deletions.watch(namespaces, is_glob)
    globbed = any(is_glob(ns) for ns in namespaces)
    scope: list[str | None] = [*namespaces] if namespaces else [None]
    _prefill_scope[:] = [] if globbed else scope


async def prefill() -> int:
    """Fill the cache with every child before the first handler runs: kopf resumes models as
    soon as their own watch lists them, and a model whose children the watches have not
    brought yet would be applied again in full (a restarted operator over a thousand models
    sent thousands of needless applies). One LIST per kind and namespace; a failed one leaves
    that kind to its watch. Returns the children recorded."""
    found = 0
    for namespace in _prefill_scope:
        for *_resource, api_version, kind in CHILD_KINDS:
            try:
                selector = reconcile.MANAGED_SELECTOR
                items = await kube_apply.list_objects(api_version, kind, namespace, selector)
            except Exception as exc:  # only a head start: it must never keep the operator from starting
                log.warning("listing %ss before start failed (the watch brings them): %s", kind, exc)
                continue
            for item in items:
                found += cache.child_event(api_version, kind, "ADDED", item) is not None
    return found


@kopf.on.login()
async def login(**_: Any) -> kopf.ConnectionInfo:
    """kopf's watches and patches use the credentials the operator's own client found (one
    reader of the kubeconfig or the service account); asked again after a 401, so a rotated
    service account token is read anew."""
    creds = get_client().creds
    return kopf.ConnectionInfo(
        server=creds.server,
        ca_path=str(creds.ca_file),
        certificate_path=str(creds.cert_file) if creds.cert_file else None,
        private_key_path=str(creds.key_file) if creds.key_file else None,
        token=creds.bearer(),
    )


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    apply_settings(settings)
    get_client()  # fail at start, not at the first resource, when there is no cluster access
    log.info("%d children known before the first handler", await prefill())
    global _loop_task
    _loop_task = asyncio.create_task(_resync_loop(), name="pdwarden-resync")


@kopf.on.cleanup()
async def stop(**_: Any) -> None:
    if _loop_task is not None:
        _loop_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await _loop_task
    for task in list(_tasks):  # queued full reconciles: the next leader resumes every model
        task.cancel()
    await asyncio.gather(*_tasks, return_exceptions=True)
    await get_client().aclose()


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


def _due(key: ModelKey, body: Mapping[str, Any]) -> bool:
    """Whether the model's latest body asks for a full reconcile not yet handled, queued or running."""
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return False  # owner references delete its children
    essence = _essence(body)
    return key not in _queued and essence != _handled.get(key) and essence != _running.get(key)


def _enqueue(key: ModelKey) -> None:
    """Queue a full reconcile of the model (one at most waits per model: it reads the latest body
    when its turn comes). asyncio's semaphore is FIFO: models are handled in arrival order."""
    body = cache.models.get(key)
    if body is None or not _due(key, body):
        return
    _queued.add(key)
    task = asyncio.create_task(_reconcile_full(key), name=f"reconcile {key[0]}/{key[1]}")
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


def _retry(key: ModelKey, delay: float) -> None:
    asyncio.get_running_loop().call_later(delay, _enqueue, key)


async def _reconcile_full(key: ModelKey) -> None:
    loop = asyncio.get_running_loop()
    queued = loop.time()
    try:
        async with _reconcile_slots, cache.lock(key):
            _queued.discard(key)  # from here on a newer change queues another pass
            body = cache.models.get(key)
            if body is None or not _due(key, body):  # deleted, or handled while it waited
                return
            essence = _essence(body)
            _running[key] = essence
            started = loop.time()
            try:
                outcome = await reconcile.reconcile(
                    body, cache.children_of(key), cache.settled.get(key), verify_secret=True
                )
            except reconcile.InvalidSpec as exc:
                _handled[key] = essence  # status says so; the next change of the spec reconciles
                log.warning("%s/%s: not reconciled: %s", key[0], key[1], exc)
                return
            except reconcile.RetryLater as exc:
                log.warning("%s/%s: %s (retry in %.0fs)", key[0], key[1], exc, exc.delay)
                _retry(key, exc.delay)
                return
            except Exception:  # never let one bad object stop the others
                log.exception("%s/%s: reconcile failed (retry in %.0fs)", key[0], key[1], RETRY_MAX_S)
                _retry(key, RETRY_MAX_S)
                return
            finally:
                _running.pop(key, None)
            if key not in cache.models:
                return  # deleted meanwhile
            _handled[key] = essence
            cache.note_applied(key, outcome.applied)
            cache.note_settled(key, outcome.settled)
            cache.note_status(key, outcome.status)
            log.info(
                "%s/%s: reconciled generation %s in %.2fs (waited %.2fs for a slot)",
                key[0],
                key[1],
                (body.get("metadata") or {}).get("generation"),
                loop.time() - started,
                started - queued,
            )
    finally:
        _queued.discard(key)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def model_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
    key = (body.metadata.namespace or "", body.metadata.name or "")
    kind = namespace_deletions.model_event_type(event.get("type"), key[0])
    cache.model_event(kind, body)
    if kind == "DELETED":
        _handled.pop(key, None)
    else:
        _enqueue(key)


def _register_child_watch(group: str, version: str, plural: str, api_version: str, kind: str) -> None:
    async def child_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        cache.child_event(api_version, kind, event.get("type"), body)

    child_event.__name__ = child_event.__qualname__ = f"watch_{plural}"
    kopf.on.event(group, version, plural, labels=MANAGED, id=f"watch_{plural}")(child_event)


for _kind in CHILD_KINDS:
    _register_child_watch(*_kind)


def _forget_namespace(namespace: str) -> None:
    for key in cache.forget_namespace(namespace):
        _failures.pop(key, None)
        _handled.pop(key, None)
        log.info("%s/%s: forgotten: its namespace is being deleted", *key)


namespace_deletions.subscribe(_forget_namespace)


async def _resync_one(key: tuple[str, str], sem: asyncio.Semaphore) -> None:
    async with sem, cache.lock(key):
        body = cache.models.get(key)
        if body is None:
            return
        children = cache.children_of(key)
        try:
            outcome = await reconcile.reconcile(body, children, cache.settled.get(key))
        except reconcile.InvalidSpec:
            return  # status already says so; the next spec change reconciles
        except reconcile.RetryLater as exc:
            uid = str((body.get("metadata") or {}).get("uid") or "")
            if not await kube_model_status.still_exists(*key, uid):
                # its deletion never came as an event (a deleted namespace kopf stopped watching)
                log.info("%s/%s: forgotten: the model is gone", *key)
                cache.forget(key)
                _failures.pop(key, None)
                _handled.pop(key, None)
                return
            failures = _failures[key] = _failures.get(key, 0) + 1
            delay = min(RETRY_MAX_S, exc.delay * 2 ** (failures - 1))
            log.warning("%s/%s: %s (retry %d in %.0fs)", key[0], key[1], exc, failures, delay)
            asyncio.get_running_loop().call_later(delay, cache.mark, key)
            return
        except Exception:  # never let one bad object stop the loop
            log.exception("%s/%s: resync failed", *key)
            return
        _failures.pop(key, None)
        cache.note_applied(key, outcome.applied)
        cache.note_settled(key, outcome.settled)
        cache.note_status(key, outcome.status)
        if outcome.applied:
            # a new model can reach this pass before its create handler: nothing to restore yet
            verb = "restored" if children else "created"
            log.info("%s/%s: %s %s", key[0], key[1], verb, ", ".join(outcome.applied_names))


async def _resync_loop() -> None:
    sem = asyncio.Semaphore(RESYNC_CONCURRENCY)
    loop = asyncio.get_running_loop()
    next_pass = loop.time() + RESYNC_INTERVAL_S
    next_full = loop.time() + FULL_RESYNC_INTERVAL_S
    while True:
        timeout = max(0.0, next_pass - loop.time())
        with contextlib.suppress(TimeoutError):  # asyncio.timeout: it never swallows a cancel
            async with asyncio.timeout(timeout):
                await cache.wake.wait()
        full = loop.time() >= next_full
        if full:
            cache.mark_all()
            next_full = loop.time() + FULL_RESYNC_INTERVAL_S
            next_pass = loop.time() + RESYNC_INTERVAL_S
        elif loop.time() >= next_pass:
            cache.mark_unsettled()
            next_pass = loop.time() + RESYNC_INTERVAL_S
        await asyncio.sleep(DEBOUNCE_S)
        keys = cache.take_dirty()
        if keys:
            began, cpu = loop.time(), time.process_time()
            await asyncio.gather(*(_resync_one(k, sem) for k in keys))
            if full:  # what a settled fleet costs every FULL_RESYNC_INTERVAL_S (bench reconcile reads it)
                log.info(
                    "full resync: %d models in %.3fs, %.4f CPU-s",
                    len(keys),
                    loop.time() - began,
                    time.process_time() - cpu,
                )

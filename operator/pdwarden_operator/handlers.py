"""kopf handlers: thin adapters from kopf's causes to reconcile.py.

- login -> the credentials of the operator's own client (kube/credentials.py);
- create / resume / update of a DisaggregatedModel -> `reconcile` (what differs is applied);
- watch events of DisaggregatedModels and their children feed `cache.Cache`;
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
from typing import Any

import kopf

import pdwarden_contract as contract
from pdwarden_operator import namespace_deletions, reconcile, render
from pdwarden_operator.cache import CHILDREN
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


def apply_settings(settings: kopf.OperatorSettings) -> None:
    """pdwarden's kopf settings (pure: only mutates `settings`)."""
    # Progress and the last-handled spec live in kopf.pdwarden.io/ annotations (kopf ignores every
    # annotation under its own prefix, so it must not be pdwarden.io/ itself); status is ours alone.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
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
    await get_client().aclose()


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
async def reconcile_model(body: kopf.Body, **_: Any) -> None:
    key = (body.metadata.namespace or "", body.metadata.name or "")
    cache.model_event("MODIFIED", body)
    loop = asyncio.get_running_loop()
    queued = loop.time()
    async with _reconcile_slots, cache.lock(key):
        started = loop.time()
        try:
            outcome = await reconcile.reconcile(
                body, cache.children_of(key), cache.settled.get(key), verify_secret=True
            )
            cache.note_applied(key, outcome.applied)
            cache.note_settled(key, outcome.settled)
            cache.note_status(key, outcome.status)
            log.info(
                "%s/%s: reconciled generation %s in %.2fs (waited %.2fs for a slot)",
                key[0],
                key[1],
                body.metadata.get("generation"),
                loop.time() - started,
                started - queued,
            )
        except reconcile.InvalidSpec as exc:
            raise kopf.PermanentError(str(exc)) from exc
        except reconcile.RetryLater as exc:
            raise kopf.TemporaryError(str(exc), delay=exc.delay) from exc


@kopf.on.event(GROUP, VERSION, PLURAL)
async def model_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
    cache.model_event(
        namespace_deletions.model_event_type(event.get("type"), body.metadata.namespace or ""), body
    )


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
        if loop.time() >= next_full:
            cache.mark_all()
            next_full = loop.time() + FULL_RESYNC_INTERVAL_S
            next_pass = loop.time() + RESYNC_INTERVAL_S
        elif loop.time() >= next_pass:
            cache.mark_unsettled()
            next_pass = loop.time() + RESYNC_INTERVAL_S
        await asyncio.sleep(DEBOUNCE_S)
        keys = cache.take_dirty()
        if keys:
            await asyncio.gather(*(_resync_one(k, sem) for k in keys))

"""A model's watchdog ends with its model, whichever way the operator learns it is gone: a
deletion event, its namespace's deletion (with namespace patterns kopf delivers no deletion
for the models inside), a model of the same name with another UID, or a round's write that
finds the model gone. Nothing kept for the model stays behind."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, cast

import kopf
import pytest

import pdwarden_contract as contract
from pdwarden_operator import handlers, namespace_deletions
from pdwarden_operator.context import OperatorContext
from pdwarden_operator.kube import model_status
from pdwarden_operator.kube.client import KubeApiError, KubeClient
from pdwarden_operator.metrics import OperatorMetrics
from pdwarden_operator.watchdog import kopf_handlers, model_watchdog
from pdwarden_operator.watchdog.context import WatchdogContext
from pdwarden_operator.watchdog.latest_body import LatestBody
from pdwarden_operator.watchdog.model_watchdog import ModelWatchdog
from tests.support.kube_client import unreachable_client

pytestmark = pytest.mark.unit
OWNER_API = "pdwarden.io/v1alpha1"


def _body(namespace: str, name: str, uid: str) -> kopf.Body:
    return kopf.Body(cast(Any, {"metadata": {"namespace": namespace, "name": name, "uid": uid}, "spec": {}}))


# the handlers as plain coroutines (kopf types its decorated handlers with every kwarg it passes)
async def _track(context: OperatorContext, event: Any, body: kopf.Body) -> None:
    handler = cast(Callable[..., Awaitable[None]], kopf_handlers.track_model)
    await handler(event, body, memo=kopf.Memo({"operator": context}))


async def _namespace_event(context: OperatorContext, event: dict[str, Any]) -> None:
    handler = cast(Callable[..., Awaitable[None]], namespace_deletions._namespace_event)
    await handler(event, memo=kopf.Memo({"operator": context}))


class _Watchdogs:
    """Stands in for ModelWatchdog in the kopf wiring: records which models run, and ends a
    model's run when told (as the real one does when its model is gone)."""

    def __init__(self) -> None:
        self.started: list[tuple[str, str, str]] = []
        self.end: dict[str, asyncio.Event] = {}

    def __call__(self, namespace: str, name: str, uid: str, **_: Any) -> Any:
        self.started.append((namespace, name, uid))
        end = self.end.setdefault(uid, asyncio.Event())

        class _Run:
            async def run(self, _latest: Any) -> None:
                await end.wait()

        return _Run()


@pytest.fixture
def context() -> OperatorContext:
    """The operator's context, as kopf's memo carries it to the handlers."""
    return OperatorContext.build(OperatorMetrics(), kube=unreachable_client())


@pytest.fixture
def watchdogs(monkeypatch: pytest.MonkeyPatch, context: OperatorContext) -> Iterator[_Watchdogs]:
    fake = _Watchdogs()
    monkeypatch.setattr(kopf_handlers, "ModelWatchdog", fake)
    yield fake
    for key in list(context.watchdog.models.tasks):
        context.watchdog.models.forget(*key)


def _recording(into: list[tuple[str, str]]) -> Callable[[str, str], None]:
    return lambda namespace, name: into.append((namespace, name))


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_model_recreated_under_the_same_name_gets_a_watchdog_of_its_own(
    watchdogs: _Watchdogs, context: OperatorContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = context.watchdog.models
    await _track(context, {"type": "ADDED"}, _body("ns", "m", "uid-1"))
    first = models.tasks[("ns", "m")]
    await _track(context, {"type": "MODIFIED"}, _body("ns", "m", "uid-1"))
    assert models.tasks[("ns", "m")] is first, "one watchdog per model"
    forgotten: list[tuple[str, str]] = []
    monkeypatch.setattr(context.writer, "forget", _recording(forgotten))
    # deleted and created again while the deletion went unseen
    await _track(context, {"type": "ADDED"}, _body("ns", "m", "uid-2"))
    await _settle()
    assert first.cancelled()
    assert watchdogs.started == [("ns", "m", "uid-1"), ("ns", "m", "uid-2")]
    assert forgotten == [("ns", "m")], "the old model's status forgotten with it"


async def test_a_watchdog_that_ends_by_itself_leaves_nothing_behind(
    watchdogs: _Watchdogs, context: OperatorContext
) -> None:
    models = context.watchdog.models
    await _track(context, {"type": "ADDED"}, _body("ns", "m", "uid-1"))
    context.children.record(_body("ns", "m", "uid-1"))  # as the reconciler's handler keeps it
    assert ("ns", "m") in models.bodies
    watchdogs.end["uid-1"].set()  # its model is gone
    await _settle()
    assert ("ns", "m") not in models.tasks and ("ns", "m") not in models.bodies
    assert ("ns", "m") not in context.children.models, "the reconciler's store forgets it too"
    # a model created later under the name is watched again
    await _track(context, {"type": "ADDED"}, _body("ns", "m", "uid-2"))
    assert ("ns", "m", "uid-2") in watchdogs.started and not models.tasks[("ns", "m")].done()


async def test_a_namespace_being_deleted_stops_its_models_watchdogs_only(
    watchdogs: _Watchdogs, context: OperatorContext
) -> None:
    models = context.watchdog.models
    for ns, name in (("doomed", "a"), ("doomed", "b"), ("kept", "a")):
        await _track(context, {"type": "ADDED"}, _body(ns, name, f"{ns}-{name}"))
    tasks = dict(models.tasks)
    terminating = {"metadata": {"name": "doomed", "deletionTimestamp": "2026-12-03T16:00:00Z"}}
    await _namespace_event(context, {"type": "MODIFIED", "object": terminating})
    await _settle()
    assert set(models.tasks) == {("kept", "a")}
    assert tasks[("doomed", "a")].cancelled() and tasks[("doomed", "b")].cancelled()
    # a model event kopf delivers after the namespace's does not bring a watchdog back
    await _track(context, {"type": "MODIFIED"}, _body("doomed", "a", "doomed-a"))
    assert ("doomed", "a") not in models.tasks
    # once the namespace is gone, a namespace of that name is a new one
    await _namespace_event(context, {"type": "DELETED", "object": terminating})
    await _namespace_event(context, {"type": "ADDED", "object": {"metadata": {"name": "doomed"}}})
    await _track(context, {"type": "ADDED"}, _body("doomed", "a", "doomed-a2"))
    assert ("doomed", "a", "doomed-a2") in watchdogs.started
    # a namespace merely changed is not a deletion
    await _namespace_event(context, {"type": "MODIFIED", "object": {"metadata": {"name": "kept"}}})
    assert set(models.tasks) == {("kept", "a"), ("doomed", "a")}


def test_what_counts_as_a_namespace_being_deleted() -> None:
    assert namespace_deletions.deleting("DELETED", {"metadata": {"name": "x"}})
    assert namespace_deletions.deleting(
        "MODIFIED", {"metadata": {"deletionTimestamp": "2026-12-03T16:00:00Z"}}
    )
    assert not namespace_deletions.deleting("MODIFIED", {"metadata": {"name": "x"}})
    assert not namespace_deletions.deleting("ADDED", {})


def test_the_reconcilers_store_forgets_a_namespace_being_deleted() -> None:
    context = OperatorContext.build(OperatorMetrics(), kube=unreachable_client())
    cache, queue = context.children, context.resync
    for ns, name in (("doomed", "a"), ("kept", "b")):
        body = {"metadata": {"namespace": ns, "name": name, "uid": name}}
        cache.record(body)
        child = {
            "metadata": {
                "namespace": ns,
                "name": f"{name}-decode",
                "ownerReferences": [
                    {
                        "apiVersion": "pdwarden.io/v1alpha1",
                        "kind": "DisaggregatedModel",
                        "name": name,
                        "controller": True,
                    }
                ],
            }
        }
        handlers.child_event(context, "apps/v1", "Deployment", "ADDED", child)
    cache.note_settled(("doomed", "a"), "settled")
    assert context.forget_namespace("doomed") == [("doomed", "a")]
    assert set(cache.models) == {("kept", "b")} and set(cache.children) == {("kept", "b")}
    assert ("doomed", "a") not in cache.settled and queue.take_dirty() == [("kept", "b")]


@pytest.mark.parametrize("exists", [False, True])
async def test_a_round_that_finds_its_model_gone_ends_the_watchdog(
    monkeypatch: pytest.MonkeyPatch, exists: bool
) -> None:
    """A 404 from a round's write ends the watchdog only when the model is confirmed gone (a
    404 for anything else, or a model that is still there, is one failed round)."""
    monkeypatch.setattr(model_watchdog, "FIRST_ROUND_MIN_S", 0.0)
    monkeypatch.setattr(model_watchdog, "FIRST_ROUND_MAX_S", 0.0)
    asked: list[tuple[str, str, str]] = []

    async def still_exists(client: KubeClient, namespace: str, name: str, uid: str) -> bool:
        asked.append((namespace, name, uid))
        return exists

    monkeypatch.setattr(model_status, "still_exists", still_exists)

    async def round_(self: ModelWatchdog, body: Any) -> float:
        raise KubeApiError(404, "NotFound", "not found", method="PATCH", path="/status")

    monkeypatch.setattr(ModelWatchdog, "round", round_)
    watchdog = ModelWatchdog("ns", "m", "uid-1", context=WatchdogContext.build(kube=unreachable_client()))
    task = asyncio.create_task(watchdog.run(LatestBody({"metadata": {}})))
    await asyncio.sleep(0.2)  # one round (a failed round waits its interval before the next)
    ended = task.done()
    task.cancel()
    assert asked == [("ns", "m", "uid-1")]
    assert ended is not exists


async def test_each_round_is_timed_and_a_round_longer_than_its_interval_counts_late(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first round takes longer than the interval it returns (late), the second does not."""
    monkeypatch.setattr(model_watchdog, "FIRST_ROUND_MIN_S", 0.0)
    monkeypatch.setattr(model_watchdog, "FIRST_ROUND_MAX_S", 0.0)
    rounds: list[float] = []
    second = asyncio.Event()

    async def round_(self: ModelWatchdog, body: Any) -> float:
        rounds.append(0.0)
        if len(rounds) == 1:
            await asyncio.sleep(0.05)
            return 0.01
        second.set()
        return 30.0

    monkeypatch.setattr(ModelWatchdog, "round", round_)
    metrics = OperatorMetrics()
    watchdog = ModelWatchdog(
        "ns", "m", "uid-1", context=WatchdogContext.build(metrics, kube=unreachable_client())
    )
    task = asyncio.create_task(watchdog.run(LatestBody({"metadata": {}})))
    await asyncio.wait_for(second.wait(), 10)
    await asyncio.sleep(0)  # the second round's bookkeeping runs before its wait
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert metrics.registry.get_sample_value(f"{contract.METRIC_OPERATOR_ROUND_SECONDS}_count") == 2
    assert metrics.registry.get_sample_value(contract.METRIC_OPERATOR_ROUNDS_LATE_TOTAL) == 1


@pytest.mark.parametrize("interval", [None, 2.0, 10.0, 60.0])
def test_first_rounds_spread_over_the_whole_scrape_interval(interval: float | None) -> None:
    """Models' first rounds (and so their phases) cover the interval, not its first seconds."""
    rng = random.Random(7)
    delays = [model_watchdog.first_round_delay(interval, rng) for _ in range(2000)]
    upper = max(model_watchdog.FIRST_ROUND_MAX_S, interval or 0.0)
    assert min(delays) >= model_watchdog.FIRST_ROUND_MIN_S and max(delays) <= upper
    # the last tenth of the range is used as much as any other: a phase, not a start-up burst
    assert sum(d > upper - (upper - model_watchdog.FIRST_ROUND_MIN_S) / 10 for d in delays) > 100

"""Full reconciles are the operator's own queue, driven by the models' watch events: one for a
model this process has not handled yet, one when its generation, labels or annotations move,
none for a status write (its own, each pass), none again for a refused spec until it changes."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from typing import Any, cast

import kopf
import pytest

import pdwarden_contract as contract
from pdwarden_operator import handlers
from pdwarden_operator.context import OperatorContext
from pdwarden_operator.reconcile import run
from pdwarden_operator.reconcile.errors import InvalidSpec, RetryLater
from tests.support.kube_client import unreachable_client

pytestmark = pytest.mark.unit

MODEL: dict[str, Any] = {
    "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
    "kind": contract.KIND,
    "metadata": {"namespace": "team", "name": "llama", "uid": "u-1", "generation": 1},
    "spec": {},
}


def _body(**meta: Any) -> dict[str, Any]:
    body = copy.deepcopy(MODEL)
    body["metadata"].update(meta)
    return body


class Passes:
    """run.reconcile's stand-in: records each full pass, answers with `outcomes` in turn;
    `context`: the operator's context the handlers get in kopf's memo."""

    def __init__(self, *outcomes: BaseException | None) -> None:
        self.context = OperatorContext.build(kube=unreachable_client())
        self.calls: list[tuple[int, bool]] = []
        self.outcomes = list(outcomes)

    async def __call__(
        self, parts: Any, body: Any, children: Any, settled: Any, *, verify_secret: bool = False
    ) -> run.PassResult:
        self.calls.append((int(body["metadata"]["generation"]), verify_secret))
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if outcome is not None:
            raise outcome
        return run.PassResult(status={"observedGeneration": body["metadata"]["generation"]})


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> Passes:
    fake = Passes()
    monkeypatch.setattr(run, "reconcile", fake)
    return fake


async def _event(context: OperatorContext, kind: str, body: dict[str, Any]) -> None:
    handler = cast(Callable[..., Awaitable[None]], handlers.model_event)
    memo = kopf.Memo({"operator": context})
    await handler(event={"type": kind, "object": body}, body=kopf.Body(cast(Any, body)), memo=memo)


async def _drain(context: OperatorContext) -> None:
    tasks = context.reconciles.tasks
    while tasks:
        await asyncio.gather(*list(tasks))


async def _events(context: OperatorContext, *events: tuple[str, dict[str, Any]], settle: float = 0.0) -> None:
    for kind, body in events:
        await _event(context, kind, body)
        await _drain(context)
    if settle:
        await asyncio.sleep(settle)
        await _drain(context)


def test_a_new_model_is_reconciled_once_and_its_status_writes_queue_nothing(passes: Passes) -> None:
    status = _body()
    status["status"] = {"phase": "Ready"}
    kopf_note = _body(annotations={f"{handlers.KOPF_PREFIX}/last-handled-configuration": "{}"})
    asyncio.run(_events(passes.context, ("ADDED", _body()), ("MODIFIED", status), ("MODIFIED", kopf_note)))
    assert passes.calls == [(1, True)]  # verified like kopf's create and resume were


@pytest.mark.parametrize(
    "changed",
    [
        _body(generation=2),
        _body(annotations={"pdwarden.io/allow-fault-injection": "true"}),
        _body(labels={"a": "b"}),
    ],
    ids=["spec", "annotation", "label"],
)
def test_a_change_of_spec_labels_or_annotations_reconciles_again(
    passes: Passes, changed: dict[str, Any]
) -> None:
    asyncio.run(_events(passes.context, ("ADDED", _body()), ("MODIFIED", changed)))
    assert len(passes.calls) == 2


def test_a_refused_spec_is_not_retried_until_it_changes(passes: Passes) -> None:
    passes.outcomes = [InvalidSpec("spec.model: Field required")]
    asyncio.run(
        _events(passes.context, ("ADDED", _body()), ("MODIFIED", _body()), ("MODIFIED", _body(generation=2)))
    )
    assert passes.calls == [(1, True), (2, True)]


def test_a_transient_failure_is_queued_again_after_its_delay(passes: Passes) -> None:
    passes.outcomes = [RetryLater("API unavailable", delay=0.05)]
    asyncio.run(_events(passes.context, ("ADDED", _body()), settle=0.2))
    assert passes.calls == [(1, True), (1, True)]


def test_a_deleted_or_deleting_model_is_not_reconciled(passes: Passes) -> None:
    deleting = _body(deletionTimestamp="2026-01-01T00:00:00Z")
    asyncio.run(_events(passes.context, ("ADDED", deleting)))
    assert passes.calls == []
    # deleted, then created again under the same name: another model, reconciled anew
    asyncio.run(
        _events(passes.context, ("ADDED", _body()), ("DELETED", _body()), ("ADDED", _body(uid="u-2")))
    )
    assert passes.calls == [(1, True), (1, True)]
    assert passes.context.reconciles.handled == {("team", "llama"): handlers._essence(_body(uid="u-2"))}


def test_one_pass_waits_per_model_and_reads_the_latest_body(passes: Passes) -> None:
    async def burst() -> None:
        # three generations arrive while the first pass is queued: one pass, of the last one
        for generation in (1, 2, 3):
            await _event(passes.context, "MODIFIED", _body(generation=generation))
        await _drain(passes.context)

    asyncio.run(burst())
    assert passes.calls == [(3, True)]

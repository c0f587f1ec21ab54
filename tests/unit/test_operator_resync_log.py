"""What a resync pass says it applied: a new model's first children are created, not restored
(the periodic pass can reach a model before its create handler does)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import pdwarden_contract as contract
from pdwarden_operator import handlers
from pdwarden_operator.context import OperatorContext
from pdwarden_operator.reconcile import run
from pdwarden_operator.render.meta import Owner
from pdwarden_operator.render.network import router_service
from tests.support.kube_client import unreachable_client

pytestmark = pytest.mark.unit

MODEL: dict[str, Any] = {
    "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
    "kind": contract.KIND,
    "metadata": {"namespace": "team", "name": "llama", "uid": "u-1", "generation": 1},
    "spec": {},
}
# a real child, its controller reference as the operator writes it
ROUTER_SERVICE = router_service(Owner.from_body(MODEL))


@pytest.mark.parametrize(("children_known", "verb"), [(False, "created"), (True, "restored")])
def test_a_resync_pass_names_first_children_created_and_replaced_ones_restored(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, children_known: bool, verb: str
) -> None:
    context = OperatorContext.build(kube=unreachable_client())
    context.children.record(MODEL)
    if children_known:
        handlers.child_event(context, "v1", "Service", "ADDED", ROUTER_SERVICE)
    seen: list[dict[str, Any]] = []

    async def one_pass(
        parts: run.ReconcileParts, body: Any, children: dict[Any, Any], settled: Any
    ) -> run.PassResult:
        assert parts == context.reconcile_parts
        seen.append(children)
        return run.PassResult(status={}, applied=[ROUTER_SERVICE])

    monkeypatch.setattr(run, "reconcile", one_pass)
    with caplog.at_level(logging.INFO, logger="pdwarden.handlers"):
        asyncio.run(handlers._resync_one(context, ("team", "llama"), asyncio.Semaphore(1)))

    assert bool(seen[0]) is children_known  # the pass was given what the cache held
    assert f"team/llama: {verb} Service/llama-router" in caplog.text
    assert ("Service", "llama-router") in context.children.children["team", "llama"]  # known from now on

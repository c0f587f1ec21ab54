"""The operator's context: one per process, nothing shared between two, and a model that is gone
forgotten by every per-model store in one call (its registry)."""

from __future__ import annotations

import asyncio

import pytest

import pdwarden_contract as contract
from pdwarden_operator import handlers
from pdwarden_operator.context import MEMO_KEY, OperatorContext, context_of
from pdwarden_operator.watchdog.latest_body import LatestBody
from pdwarden_operator.watchdog.role_load import RoleLoad
from tests.support.kube_client import unreachable_client

pytestmark = pytest.mark.unit

KEY = ("team", "llama")


def _body(uid: str = "u-1", namespace: str = KEY[0], name: str = KEY[1]) -> dict:
    return {"metadata": {"namespace": namespace, "name": name, "uid": uid}, "spec": {}}


def _child() -> dict:
    owner = {
        "apiVersion": "pdwarden.io/v1alpha1",
        "kind": "DisaggregatedModel",
        "name": KEY[1],
        "controller": True,
    }
    return {"metadata": {"namespace": KEY[0], "name": f"{KEY[1]}-decode", "ownerReferences": [owner]}}


async def _known_everywhere(context: OperatorContext, uid: str = "u-1") -> asyncio.Task[None]:
    """The model as each store keeps it; returns its (stand-in) watchdog's task."""
    context.children.record(_body(uid))
    handlers.child_event(context, "apps/v1", "Deployment", "ADDED", _child())
    context.reconciles.handled[KEY] = ("essence",)
    context.reconciles.failures[KEY] = 2
    context.watchdog.brakes.expect(KEY)
    context.watchdog.brakes.report(KEY, 3, remediated=True)
    context.watchdog.role_loads.record(*KEY, "decode", RoleLoad(1, 1, None, None, observed_at=0.0))
    context.metrics.wedged_pods.labels(*KEY, "decode").set(1)
    models = context.watchdog.models
    models.bodies[KEY], models.uids[KEY] = LatestBody(_body(uid)), uid
    task = models.tasks[KEY] = asyncio.create_task(_forever())
    return task


async def _forever() -> None:
    await asyncio.Event().wait()


def _kept_anywhere(context: OperatorContext) -> list[str]:
    """The stores that still keep something of the model."""
    brakes = context.watchdog.brakes
    kept = {
        "child store": KEY in context.children.models or KEY in context.children.children,
        "resync queue": KEY in context.resync.dirty,
        "reconciles": KEY in context.reconciles.handled or KEY in context.reconciles.failures,
        "brakes": KEY in brakes._troubled or KEY in brakes._expected or KEY in brakes._reported,
        "role loads": bool(context.watchdog.role_loads.in_namespace(KEY[0], 0.0)),
        "metrics": context.metrics.registry.get_sample_value(
            contract.METRIC_OPERATOR_WEDGED_PODS, {"namespace": KEY[0], "model": KEY[1], "role": "decode"}
        )
        is not None,
        "watchdogs": KEY in context.watchdog.models.tasks or KEY in context.watchdog.models.uids,
    }
    return [store for store, present in kept.items() if present]


@pytest.mark.parametrize(
    "event",
    [
        ("DELETED", _body()),
        ("MODIFIED", {**_body(), "metadata": {**_body()["metadata"], "deletionTimestamp": "t"}}),
    ],
    ids=["deleted", "being-deleted"],
)
async def test_a_model_gone_is_forgotten_by_every_store_in_one_call(event: tuple[str, dict]) -> None:
    context = OperatorContext.build(kube=unreachable_client())
    task = await _known_everywhere(context)
    assert len(_kept_anywhere(context)) == 7  # the test sees each store keep it first
    assert context.model_event(*event) is None
    assert _kept_anywhere(context) == []
    await asyncio.sleep(0)
    assert task.cancelled(), "its watchdog ended"


async def test_a_model_replaced_under_its_name_leaves_nothing_of_the_old_one() -> None:
    context = OperatorContext.build(kube=unreachable_client())
    await _known_everywhere(context, uid="u-1")
    assert context.model_event("ADDED", _body(uid="u-2")) == KEY
    assert _kept_anywhere(context) == []
    # the same object again is no replacement
    await _known_everywhere(context, uid="u-2")
    assert context.model_event("MODIFIED", _body(uid="u-2")) == KEY
    assert len(_kept_anywhere(context)) == 7


async def test_a_namespace_being_deleted_forgets_its_models_only() -> None:
    context = OperatorContext.build(kube=unreachable_client())
    await _known_everywhere(context)
    context.children.record(_body(uid="u-9", namespace="kept", name="other"))
    assert context.forget_namespace(KEY[0]) == [KEY]
    assert _kept_anywhere(context) == [] and ("kept", "other") in context.children.models


def test_two_contexts_share_nothing() -> None:
    one, two = (
        OperatorContext.build(kube=unreachable_client()),
        OperatorContext.build(kube=unreachable_client()),
    )
    one.children.record(_body())
    one.reconciles.handled[KEY] = ("essence",)
    assert two.children.models == {} and two.reconciles.handled == {}
    for part in ("metrics", "writer", "children", "resync", "reconciles", "baseline", "watchdog", "registry"):
        assert getattr(one, part) is not getattr(two, part), part
    # the watchdogs write status through, and read the Deployments from, the reconciler's own
    assert one.watchdog.writer is one.writer and one.watchdog.children is one.children
    assert one.reconcile_parts.writer is one.writer
    # one API client for the whole process: the reconciler's and the watchdogs'
    assert one.watchdog.kube is one.kube and one.reconcile_parts.kube is one.kube


def test_the_handlers_find_the_context_in_kopfs_memo_or_say_it_is_missing() -> None:
    context = OperatorContext.build(kube=unreachable_client())
    assert context_of({MEMO_KEY: context}) is context
    with pytest.raises(RuntimeError, match="no operator context"):
        context_of({})

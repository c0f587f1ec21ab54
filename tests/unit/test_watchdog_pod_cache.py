"""The watchdog's pod cache: watch events, namespace listings (at most one per RELIST_AFTER_S),
and events that race a listing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import pdwarden_contract as contract
from pdwarden_operator.watchdog.pod_cache import RELIST_AFTER_S, PodCache, slim_pod

pytestmark = pytest.mark.unit

Obj = dict[str, Any]


def pod(name: str, model: str = "m", namespace: str = "ns", role: str = "prefill", rv: str = "1") -> Obj:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "labels": {contract.LABEL_MODEL: model, contract.LABEL_ROLE: role},
            "managedFields": [{"manager": "kubelet"}],
        },
        "spec": {
            "containers": [
                {"name": "runtime", "image": "x", "env": [{"name": "A"}], "ports": [{"containerPort": 1}]}
            ]
        },
        "status": {"podIP": "198.18.128.9", "phase": "Running"},
    }


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Lister:
    def __init__(self, *items: Obj) -> None:
        self.items = list(items)
        self.calls: list[str] = []
        self.during: Any = None  # run while "the LIST is on the wire"

    async def __call__(self, namespace: str) -> list[Obj]:
        self.calls.append(namespace)
        if self.during is not None:
            self.during()
        await asyncio.sleep(0)
        return [p for p in self.items if p["metadata"]["namespace"] == namespace]


def names(pods: list[Obj]) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods)


def test_a_namespace_is_listed_once_then_kept_by_events_until_it_is_old() -> None:
    clock, lister = Clock(), Lister(pod("a"), pod("b", model="other"), pod("c", namespace="elsewhere"))
    cache = PodCache(clock)

    async def run() -> None:
        assert names(await cache.pods("ns", "m", lister)) == ["a"]
        assert names(await cache.pods("ns", "other", lister)) == ["b"]
        assert lister.calls == ["ns"]  # one LIST for the namespace, every model
        cache.event("ADDED", pod("d"))
        cache.event("DELETED", pod("a"))
        assert names(await cache.pods("ns", "m", lister)) == ["d"]
        assert lister.calls == ["ns"]
        clock.now += RELIST_AFTER_S + 1  # a deletion the watch missed is gone after a listing
        lister.items = [pod("e")]
        assert names(await cache.pods("ns", "m", lister)) == ["e"]
        assert lister.calls == ["ns", "ns"]

    asyncio.run(run())


def test_events_during_a_listing_win_over_it() -> None:
    cache = PodCache(Clock())
    lister = Lister(pod("a"), pod("b"))

    def meanwhile() -> None:  # the watch reports these after the LIST's snapshot was taken
        cache.event("DELETED", pod("a"))
        cache.event("ADDED", pod("c"))
        cache.event("MODIFIED", pod("b", rv="7"))

    lister.during = meanwhile

    async def run() -> list[Obj]:
        return await cache.pods("ns", "m", lister)

    pods = asyncio.run(run())
    assert names(pods) == ["b", "c"]
    assert next(p for p in pods if p["metadata"]["name"] == "b")["metadata"]["resourceVersion"] == "7"


def test_a_pod_that_changes_model_or_leaves_the_selection_moves_or_goes() -> None:
    cache = PodCache(Clock())

    async def run() -> None:
        lister = Lister()
        await cache.pods("ns", "m", lister)
        cache.event(None, pod("a"))  # kopf's own initial listing reports with no type
        cache.event("MODIFIED", pod("a", model="n"))
        assert names(await cache.pods("ns", "m", lister)) == []
        assert names(await cache.pods("ns", "n", lister)) == ["a"]
        cache.event("DELETED", pod("a", model="n"))  # left the label selection
        assert names(await cache.pods("ns", "n", lister)) == []

    asyncio.run(run())


def test_concurrent_rounds_share_one_listing() -> None:
    cache, lister = PodCache(Clock()), Lister(pod("a"), pod("b", model="n"))

    async def run() -> None:
        await asyncio.gather(*(cache.pods("ns", m, lister) for m in ("m", "n", "m", "n")))

    asyncio.run(run())
    assert lister.calls == ["ns"]


def test_a_cached_pod_keeps_what_the_watchdog_reads_only() -> None:
    slim = slim_pod(pod("a"))
    assert "managedFields" not in slim["metadata"] and slim["metadata"]["uid"] == "uid-a"
    assert slim["spec"]["containers"] == [{"name": "runtime", "ports": [{"containerPort": 1}]}]
    assert slim["status"]["podIP"] == "198.18.128.9"


def test_an_event_without_namespace_or_uid_is_ignored() -> None:
    cache = PodCache(Clock())
    cache.event("ADDED", {"metadata": {"name": "x"}})

    async def run() -> list[Obj]:
        return await cache.pods("ns", "m", Lister())

    assert asyncio.run(run()) == []

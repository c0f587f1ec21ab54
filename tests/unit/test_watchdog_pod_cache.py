"""The watchdog's pod cache: watch events, namespace listings (after the watch listed the pods
again, else at most one per RELIST_AFTER_S), and events that race a listing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

import pdwarden_contract as contract
from pdwarden_operator.kube import scale as kube_scale
from pdwarden_operator.watchdog import gone_pods, group_health, pod_cache, targets
from pdwarden_operator.watchdog.ownership import Owners
from pdwarden_operator.watchdog.pod_cache import RELIST_AFTER_S, PodCache, share_parts, slim_pod

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
    """A namespace's pods in pages of `page_size`, as the API server serves a LIST in pages."""

    def __init__(self, *items: Obj, page_size: int = 2) -> None:
        self.items = list(items)
        self.page_size = page_size
        self.calls: list[str] = []
        self.during: Any = None  # run while "the LIST is on the wire", between its pages

    async def __call__(self, namespace: str) -> AsyncIterator[list[Obj]]:
        self.calls.append(namespace)
        listed = [p for p in self.items if p["metadata"]["namespace"] == namespace]
        for start in range(0, max(len(listed), 1), self.page_size):
            if self.during is not None:
                self.during()
            await asyncio.sleep(0)
            yield listed[start : start + self.page_size]


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


def test_a_listing_in_many_pages_keeps_every_pod_and_the_events_between_its_pages() -> None:
    cache = PodCache(Clock())
    lister = Lister(*(pod(f"p{i}") for i in range(5)), pod("q", model="n"), page_size=1)
    pages = 0

    def between_pages() -> None:  # a pod listed on the first page is deleted before the last
        nonlocal pages
        pages += 1
        if pages == 3:
            cache.event("DELETED", pod("p0"))
            cache.event("ADDED", pod("r"))

    lister.during = between_pages

    async def run() -> tuple[list[Obj], list[Obj]]:
        return await cache.pods("ns", "m", lister), await cache.pods("ns", "n", lister)

    m, n = asyncio.run(run())
    assert pages == 6 and lister.calls == ["ns"]
    assert names(m) == ["p1", "p2", "p3", "p4", "r"]
    assert names(n) == ["q"]


def test_a_pod_that_changes_model_or_leaves_the_selection_moves_or_goes() -> None:
    cache = PodCache(Clock())

    async def run() -> None:
        lister = Lister()
        await cache.pods("ns", "m", lister)
        cache.event("ADDED", pod("a"))
        cache.event("MODIFIED", pod("a", model="n"))
        assert names(await cache.pods("ns", "m", lister)) == []
        assert names(await cache.pods("ns", "n", lister)) == ["a"]
        cache.event("DELETED", pod("a", model="n"))  # left the label selection
        assert names(await cache.pods("ns", "n", lister)) == []

    asyncio.run(run())


def test_a_listing_by_the_watch_makes_the_next_round_list_the_namespace() -> None:
    """kopf lists the pods again when its watch's version expired, and its listing (events with
    no type) says nothing of a pod deleted in the gap: the cache lists the namespace itself."""
    clock, lister = Clock(), Lister(pod("a"), pod("b"))
    cache = PodCache(clock)

    async def run() -> None:
        assert names(await cache.pods("ns", "m", lister)) == ["a", "b"]
        cache.event("MODIFIED", pod("a", rv="2"))  # the watch going on: no listing
        clock.now += RELIST_AFTER_S - 1
        assert names(await cache.pods("ns", "m", lister)) == ["a", "b"]
        assert lister.calls == ["ns"]
        lister.items = [pod("a", rv="2")]  # b was deleted while the watch was away
        cache.event(None, pod("a", rv="2"))
        assert names(await cache.pods("ns", "m", lister)) == ["a"]
        assert lister.calls == ["ns", "ns"]
        assert names(await cache.pods("ns", "m", lister)) == ["a"]
        assert lister.calls == ["ns", "ns"]  # once per listing by the watch

    asyncio.run(run())


def test_a_failed_listing_is_tried_again_next_round() -> None:
    clock, lister = Clock(), Lister(pod("a"))
    cache = PodCache(clock)

    def api_down() -> None:
        raise ConnectionError("the API server is away")

    async def run() -> list[Obj]:
        await cache.pods("ns", "m", lister)
        cache.event(None, pod("a"))
        lister.during = api_down
        with pytest.raises(ConnectionError):
            await cache.pods("ns", "m", lister)
        lister.during = None
        lister.items = []
        return await cache.pods("ns", "m", lister)

    assert asyncio.run(run()) == []
    assert lister.calls == ["ns", "ns", "ns"]


def test_a_listing_by_the_watch_during_the_caches_own_asks_for_another() -> None:
    cache, lister = PodCache(Clock()), Lister(pod("a"))
    lister.during = lambda: cache.event(None, pod("a"))

    async def run() -> None:
        await cache.pods("ns", "m", lister)
        lister.during = None
        await cache.pods("ns", "m", lister)
        await cache.pods("ns", "m", lister)

    asyncio.run(run())
    assert lister.calls == ["ns", "ns"]


def test_a_listing_keeps_the_cached_copy_of_a_pod_whose_version_is_the_same() -> None:
    clock, lister = Clock(), Lister(pod("a"), pod("b"))
    cache = PodCache(clock)

    async def run() -> tuple[list[Obj], list[Obj]]:
        before = await cache.pods("ns", "m", lister)
        lister.items = [pod("a"), pod("b", rv="2")]
        clock.now += RELIST_AFTER_S + 1
        return before, await cache.pods("ns", "m", lister)

    before, after = asyncio.run(run())
    assert len(lister.calls) == 2
    old, new = ({p["metadata"]["name"]: p for p in pods} for pods in (before, after))
    assert new["a"] is old["a"]  # unchanged: no second copy
    assert new["b"] is not old["b"] and new["b"]["metadata"]["resourceVersion"] == "2"
    assert "managedFields" not in new["b"]["metadata"]  # a changed pod is slimmed as any other


def test_kopfs_listing_keeps_the_cached_copy_of_a_pod_whose_version_is_the_same() -> None:
    """A resourceVersion names one state of a pod, so a listed pod with the cached version is
    taken from the cache. (Seen here through a listed copy that, impossibly, differs at the
    same version: it is not taken. A watch event is always taken as sent.)"""
    cache, lister = PodCache(Clock()), Lister(pod("a"), pod("b"))

    async def run() -> dict[str, Obj]:
        return {p["metadata"]["name"]: p for p in await cache.pods("ns", "m", lister)}

    before = asyncio.run(run())
    cache.event(None, pod("a", role="decode"))  # kopf's listing: version 1 is cached
    cache.event(None, pod("b", role="decode", rv="2"))
    lister.items = [pod("a", role="decode"), pod("b", role="decode", rv="2")]
    after = asyncio.run(run())  # the cache's own listing, which kopf's asked for
    assert len(lister.calls) == 2
    assert after["a"] is before["a"] and after["a"]["metadata"]["labels"][contract.LABEL_ROLE] == "prefill"
    assert after["b"]["metadata"]["labels"][contract.LABEL_ROLE] == "decode"
    cache.event("MODIFIED", pod("a", role="decode"))
    assert asyncio.run(run())["a"]["metadata"]["labels"][contract.LABEL_ROLE] == "decode"


def test_concurrent_rounds_share_one_listing() -> None:
    cache, lister = PodCache(Clock()), Lister(pod("a"), pod("b", model="n"))

    async def run() -> None:
        await asyncio.gather(*(cache.pods("ns", m, lister) for m in ("m", "n", "m", "n")))

    asyncio.run(run())
    assert lister.calls == ["ns"]


def _full_pod(**status: Any) -> Obj:
    """A pod as the API server sends it, with fields the watchdog never reads."""
    return {
        "metadata": {
            "name": "m-prefill-0",
            "namespace": "ns",
            "uid": "uid-0",
            "resourceVersion": "9",
            "generateName": "m-prefill-",
            "creationTimestamp": "2026-12-01T00:00:00Z",
            "labels": {
                contract.LABEL_MODEL: "m",
                contract.LABEL_ROLE: contract.ROLE_QUARANTINED,
                contract.LABEL_QUARANTINED_ROLE: "prefill",
                contract.LABEL_GROUP: "0",
                contract.LABEL_POD_INDEX: "1",
            },
            "annotations": {
                contract.ANNOTATION_QUARANTINED_AT: "2026-12-01T00:01:00Z",
                kube_scale.POD_DELETION_COST: kube_scale.REMOVE_FIRST_COST,
                "kubectl.kubernetes.io/last-applied-configuration": "x" * 4000,
            },
            "ownerReferences": [{"apiVersion": "v1", "kind": contract.KIND, "name": "m", "uid": "model-uid"}],
            "managedFields": [{"manager": "kubelet"}],
        },
        "spec": {
            "nodeName": "n1",
            "containers": [
                {
                    "name": "runtime",
                    "image": "x",
                    "env": [{"name": "A", "value": "b"}],
                    "ports": [
                        {"name": "http", "containerPort": 30000},
                        {"name": contract.PORT_NAME_METRICS, "containerPort": 9500},
                    ],
                }
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": "2001:2::9",
            "podIPs": [{"ip": "2001:2::9"}, {"ip": "198.18.128.9"}],
            "hostIP": "198.18.0.1",
            "startTime": "2026-12-01T00:00:01Z",
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T00:00:05Z"},
                {"type": "PodScheduled", "status": "True", "lastProbeTime": None},
            ],
            "containerStatuses": [
                {
                    "name": "runtime",
                    "image": "x",
                    "imageID": "x@sha256:1",
                    "ready": True,
                    "restartCount": 2,
                    "state": {"running": {"startedAt": "2026-12-01T00:02:00Z"}},
                    "lastState": {
                        "terminated": {
                            "exitCode": 137,
                            "reason": "Error",
                            "finishedAt": "2026-12-01T00:01:30Z",
                        }
                    },
                }
            ],
            **status,
        },
    }


@pytest.mark.parametrize("deleting", [False, True])
def test_every_reader_answers_the_same_from_a_cached_pod_as_from_the_whole_one(deleting: bool) -> None:
    full = _full_pod()
    if deleting:
        full["metadata"]["deletionTimestamp"] = "2026-12-01T00:03:00Z"
        full["status"]["containerStatuses"][0]["state"] = {
            "terminated": {"exitCode": 0, "reason": "Completed"}
        }
    slim = slim_pod(full)
    view = targets.pod_view(full)
    assert view is not None and targets.pod_view(slim) == view
    assert targets.metrics_url(slim) == targets.metrics_url(full)
    assert targets.pod_addresses(slim) == targets.pod_addresses(full) == {"2001:2::9", "198.18.128.9"}
    assert gone_pods.seen(slim) == gone_pods.seen(full)
    owners = Owners("model-uid", "ns")
    assert owners.ours(slim) and owners.ours(full)
    nodes = {"prefill": 2}
    assert group_health.groups_of([(view, slim)], "m", nodes) == group_health.groups_of(
        [(view, full)], "m", nodes
    )
    assert group_health.unlabelled_ranks([slim]) == group_health.unlabelled_ranks([full])
    assert slim["metadata"]["annotations"] == {
        contract.ANNOTATION_QUARANTINED_AT: "2026-12-01T00:01:00Z",
        kube_scale.POD_DELETION_COST: kube_scale.REMOVE_FIRST_COST,
    }


def test_a_cached_pod_is_a_fraction_of_the_whole_one() -> None:
    full = _full_pod()
    slim = slim_pod(full)
    assert "managedFields" not in slim["metadata"] and "env" not in str(slim)
    assert slim["spec"]["containers"] == [
        {"name": "runtime", "ports": [{"name": contract.PORT_NAME_METRICS, "containerPort": 9500}]}
    ]
    assert len(json.dumps(slim)) * 4 < len(json.dumps(full))


def test_an_event_without_namespace_or_uid_is_ignored() -> None:
    cache = PodCache(Clock())
    cache.event("ADDED", {"metadata": {"name": "x"}})

    async def run() -> list[Obj]:
        return await cache.pods("ns", "m", Lister())

    assert asyncio.run(run()) == []


def _replica(name: str, ready: str = "True", restarts: Any = 0) -> Obj:
    """A pod of one ReplicaSet: its own name, uid and address, the set's labels and owner."""
    full = _full_pod()
    full["metadata"].update(name=name, uid=f"uid-{name}")
    full["status"].update(podIP=f"2001:2::{len(name)}", podIPs=[{"ip": f"2001:2::{len(name)}"}])
    full["status"]["conditions"][0]["status"] = ready
    full["status"]["containerStatuses"][0]["restartCount"] = restarts
    return full


def test_pods_of_one_replicaset_share_their_repeating_parts_and_nothing_of_their_own() -> None:
    cache, lister = PodCache(Clock()), Lister(_replica("a"), page_size=1)

    async def run() -> list[Obj]:
        return await cache.pods("ns", "m", lister)

    asyncio.run(run())  # the listing brings one pod, the watch the other
    cache.event("ADDED", _replica("bb"))

    a, b = sorted(asyncio.run(run()), key=lambda p: p["metadata"]["name"])
    for section, key in (
        ("metadata", "labels"),
        ("metadata", "ownerReferences"),
        ("metadata", "annotations"),
    ):
        assert a[section][key] is b[section][key]
    assert a["spec"]["containers"] is b["spec"]["containers"]
    assert a["status"]["conditions"] is b["status"]["conditions"]
    assert a["status"]["podIPs"] is not b["status"]["podIPs"]
    assert (a["metadata"]["name"], b["metadata"]["name"]) == ("a", "bb")
    assert a["status"]["podIPs"] != b["status"]["podIPs"]
    # one pod's change is its own: the other keeps what it had
    cache.event("MODIFIED", _replica("bb", ready="False"))
    a, b = sorted(asyncio.run(run()), key=lambda p: p["metadata"]["name"])
    assert [c["status"] for c in a["status"]["conditions"]] == ["True", "True"]
    assert [c["status"] for c in b["status"]["conditions"]] == ["False", "True"]


def test_parts_equal_only_across_json_types_are_not_shared() -> None:
    table: dict[Any, Any] = {}
    one = share_parts(slim_pod(_replica("a", restarts=1)), table)
    true = share_parts(slim_pod(_replica("b", restarts=True)), table)
    assert one["status"]["containerStatuses"][0]["restartCount"] == 1
    assert true["status"]["containerStatuses"][0]["restartCount"] is True


def test_the_table_of_shared_parts_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pod_cache, "MAX_SHARED_PARTS", 8)
    table: dict[Any, Any] = {}
    for i in range(50):
        share_parts(slim_pod(_replica(f"p{i}", restarts=i)), table)
        assert len(table) <= 8 + len(pod_cache._SHARED)

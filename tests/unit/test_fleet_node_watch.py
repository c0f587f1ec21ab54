"""The fleet node's pod watch resumes where the last watch ended and lists again only after an
error; a failed status write is written again. Against a scripted API (the loop's logic; the
fleet against the real API server is tests/e2e/test_fleet.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

import pdwarden_contract as contract
from pdwarden_localcluster.kubeapi import ApiError
from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.fleet import node as fleet_node
from pdwarden_testkit.fleet.node import FleetNode

pytestmark = pytest.mark.unit


def _pod(name: str, version: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": version,
            "labels": {contract.LABEL_ROLE: contract.ROLE_PREFILL},
        },
        "status": {"phase": "Pending"},
    }


class ScriptedApi:
    """Listings (of the pods named, as their last status write left them) and watch streams in
    the order the script gives them; status writes applied, the first `failing_writes` of them
    refused with a 500."""

    def __init__(
        self, pods: list[dict[str, Any]], listings: list[list[str]], streams: list[list[Any]]
    ) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.listings = list(listings)
        self.streams = list(streams)
        self.listed = 0
        self.watched_from: list[str] = []
        self.writes: list[str] = []
        self.failing_writes = 0
        self.ran_out = threading.Event()  # the script has run out: the watch waits for `release`
        self.release = threading.Event()
        self.stop = threading.Event()  # then set (the node's own stop)
        self.lock = threading.Lock()

    def get(self, path: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.listed += 1
        with self.lock:
            items = [self.pods[name] for name in self.listings.pop(0)]
        return {"items": items, "metadata": {"resourceVersion": str(10 * self.listed)}}

    def watch(
        self, path: str, params: dict[str, Any], timeout_seconds: int = 60
    ) -> Iterator[tuple[str, Any]]:
        self.watched_from.append(params["resourceVersion"])
        if not self.streams:
            self.ran_out.set()
            self.release.wait(10)
            self.stop.set()
            return
        for etype, name_or_obj in self.streams.pop(0):
            yield etype, self.pods[name_or_obj] if isinstance(name_or_obj, str) else name_or_obj

    def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        name = path.split("/")[-2]
        with self.lock:
            self.writes.append(name)
            if self.failing_writes:
                self.failing_writes -= 1
                raise ApiError(500, "etcd leader changed")
            self.pods[name] = {**self.pods[name], "status": body["status"]}
        return {}


def test_the_watch_resumes_from_the_last_version_and_lists_again_only_after_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fleet_node, "RETRY_WRITE_S", 0.01)
    api = ScriptedApi(
        [_pod("a", "5"), _pod("b", "11")],
        listings=[["a"], ["b"]],
        streams=[
            # then the watch's timeout: resumed from the bookmark, not listed
            [("ADDED", "b"), ("BOOKMARK", {"metadata": {"resourceVersion": "15"}})],
            [("ERROR", {"code": 410, "reason": "Expired"})],  # listed again
        ],
    )
    api.failing_writes = 1  # the first status write is refused once: written again
    node = FleetNode(api, "2001:2::/120")  # type: ignore[arg-type]
    api.stop = node._stop
    watcher = threading.Thread(target=node._watch, daemon=True)
    watcher.start()
    assert api.ran_out.wait(10)
    # from the listing, the bookmark, the listing after the 410
    assert api.watched_from == ["10", "15", "20"] and api.listed == 2
    # each pod marked running once, one of them twice (its first write refused)
    wait_for(lambda: len(api.writes) >= 3 or None, 10, "three status writes", 0.01)
    api.release.set()
    watcher.join(timeout=10)
    assert not watcher.is_alive()
    node._writers.shutdown(wait=True)
    assert sorted(api.writes) in (["a", "a", "b"], ["a", "b", "b"]), api.writes
    assert all(p["status"]["phase"] == "Running" for p in api.pods.values())
    # the second listing held b only: a is forgotten
    assert node.pods() == 1 and node.pod_at(api.pods["b"]["status"]["podIP"]) is not None

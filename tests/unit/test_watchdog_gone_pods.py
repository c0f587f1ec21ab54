"""Which runtime pods' processes are gone (the decodes' proof for held pages). Pure."""

from __future__ import annotations

import json

import pytest

import pdwarden_contract as contract
from pdwarden_operator.watchdog.gone_pods import (
    KEEP_SECONDS,
    MAX_ENTRIES,
    GonePod,
    GonePods,
    Seen,
    from_json,
    published,
    seen,
    to_json,
)

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0


def pod(uid: str, phase: str = "Running", ip: str = "198.18.0.7") -> dict:
    return {"metadata": {"uid": uid, "name": f"m-prefill-{uid}"}, "status": {"phase": phase, "podIP": ip}}


def listed(*pods: dict) -> list[Seen]:
    return [s for p in pods if (s := seen(p)) is not None]


def test_a_pod_missing_from_the_list_is_gone_only_once_a_read_by_name_says_so() -> None:
    gone = GonePods()
    assert gone.observe(listed(pod("a"), pod("b")), [], T0) is False
    # `b` is not listed any more (deleted, or relabelled by someone): ask by name first
    assert [s.uid for s in gone.missing(listed(pod("a")))] == ["b"]
    assert gone.observe(listed(pod("a")), [], T0 + 10) is False  # the read found it alive
    assert gone.entries() == []
    assert gone.observe(listed(pod("a")), ["b"], T0 + 20) is True
    # last seen alive in the round before it went missing
    assert [(e.uid, e.name, e.ip, e.gone_at, e.last_seen) for e in gone.entries()] == [
        ("b", "m-prefill-b", "198.18.0.7", T0 + 20, T0)
    ]


def test_a_pod_that_ended_is_gone_while_still_listed() -> None:
    gone = GonePods()
    gone.observe(listed(pod("a")), [], T0)
    assert gone.observe(listed(pod("a", phase="Failed")), [], T0 + 5) is True
    assert [(e.uid, e.last_seen) for e in gone.entries()] == [("a", T0)]
    assert gone.missing(listed()) == []  # not asked about again


def test_only_pods_seen_alive_can_be_confirmed_gone() -> None:
    gone = GonePods()
    assert gone.observe(listed(), ["never-seen"], T0) is False
    assert gone.entries() == []


def test_the_list_is_kept_an_hour_and_bounded() -> None:
    gone = GonePods()
    pods = [pod(f"p{i}") for i in range(MAX_ENTRIES + 10)]
    gone.observe(listed(*pods), [], T0)
    gone.observe(listed(), [f"p{i}" for i in range(MAX_ENTRIES + 10)], T0 + 1)
    assert len(gone.entries()) == MAX_ENTRIES
    gone.observe(listed(), [], T0 + KEEP_SECONDS + 2)
    assert gone.entries() == []


def test_the_document_round_trips_and_garbage_reads_as_nothing() -> None:
    gone = GonePods()
    gone.observe(listed(pod("a")), [], T0)
    gone.observe(listed(), ["a"], T0 + 1)
    text = to_json(gone.entries())
    assert json.loads(text)["gone"][0]["uid"] == "a"
    assert from_json(text) == gone.entries()
    for garbage in (None, "", "{", "[]", '{"gone": 1}', '{"gone": [{"uid": 3}, {"uid": "x"}]}'):
        assert from_json(garbage) == []
    restored = GonePods(from_json(text))  # a restarted operator keeps what it had published
    assert [e.uid for e in restored.entries()] == ["a"]


def configmap(controller_uid: str | None, document: str = '{"gone": []}') -> dict:
    refs = (
        [] if controller_uid is None else [{"kind": contract.KIND, "uid": controller_uid, "controller": True}]
    )
    return {
        "metadata": {"name": "m-gone-pods", "ownerReferences": refs},
        "data": {contract.GONE_PODS_KEY: document},
    }


def test_the_list_is_read_and_written_only_where_the_model_controls_its_configmap() -> None:
    forged = to_json([GonePod("live-prefill", "m-prefill-0", "198.18.0.7", T0, T0)])
    assert published(None, "model-uid") == (True, None)  # the name is free: the watchdog creates it
    assert published(configmap("model-uid", forged), "model-uid") == (True, forged)
    # someone else's ConfigMap of that name: its list is never believed, and never written over
    assert published(configmap("other-uid", forged), "model-uid") == (False, None)
    assert published(configmap(None, forged), "model-uid") == (False, None)
    # the model among its owners but not its controller is not enough
    merely_owned = configmap(None, forged)
    merely_owned["metadata"]["ownerReferences"] = [{"kind": contract.KIND, "uid": "model-uid"}]
    assert published(merely_owned, "model-uid") == (False, None)

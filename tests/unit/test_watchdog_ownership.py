"""The watchdog acts only on pods the model controls: through its Deployment's ReplicaSet, its
group's StatefulSet, or (quarantined) the model itself; labels alone are not enough."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import pdwarden_contract as contract
from pdwarden_operator.watchdog.ownership import Owners

pytestmark = pytest.mark.unit

MODEL_UID = "model-uid"
NS = "ns"


def _ref(kind: str, name: str, uid: str, controller: bool = True) -> dict[str, Any]:
    api = f"{contract.API_GROUP}/{contract.API_VERSION}" if kind == contract.KIND else "apps/v1"
    return {"apiVersion": api, "kind": kind, "name": name, "uid": uid, "controller": controller}


def _obj(name: str, uid: str, *refs: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid, "namespace": NS, "ownerReferences": list(refs)}}


CLUSTER = {
    ("Deployment", "web-prefill"): _obj("web-prefill", "dep-uid", _ref(contract.KIND, "web", MODEL_UID)),
    ("ReplicaSet", "web-prefill-abc"): _obj(
        "web-prefill-abc", "rs-uid", _ref("Deployment", "web-prefill", "dep-uid")
    ),
    ("StatefulSet", "web-decode-0"): _obj("web-decode-0", "sts-uid", _ref(contract.KIND, "web", MODEL_UID)),
    # another team's: a Deployment of their own, and a ReplicaSet named like ours under it
    ("Deployment", "theirs"): _obj("theirs", "their-dep", _ref(contract.KIND, "other", "other-model")),
    ("ReplicaSet", "web-prefill-xyz"): _obj(
        "web-prefill-xyz", "their-rs", _ref("Deployment", "theirs", "their-dep")
    ),
    ("ReplicaSet", "bare"): _obj("bare", "bare-rs"),
}


class Reads:
    def __init__(self) -> None:
        self.count = 0

    async def __call__(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        assert namespace == NS
        self.count += 1
        return CLUSTER.get((kind, name))


def _pod(name: str, *refs: dict[str, Any]) -> dict[str, Any]:
    return _obj(name, f"{name}-uid", *refs)


POD_OF_DEPLOYMENT = _pod("p1", _ref("ReplicaSet", "web-prefill-abc", "rs-uid"))
POD_OF_GROUP = _pod("p2", _ref("StatefulSet", "web-decode-0", "sts-uid"))
QUARANTINED = _pod("p3", _ref(contract.KIND, "web", MODEL_UID, controller=False))
# the drain's patch landed, the ReplicaSet has not let it go yet
QUARANTINING = _pod(
    "p4",
    _ref("ReplicaSet", "web-prefill-abc", "rs-uid"),
    _ref(contract.KIND, "web", MODEL_UID, controller=False),
)


@pytest.mark.parametrize(
    ("pod", "ours"),
    [
        (POD_OF_DEPLOYMENT, True),
        (POD_OF_GROUP, True),
        (QUARANTINED, True),
        (QUARANTINING, True),
        (_pod("model-controlled", _ref(contract.KIND, "web", MODEL_UID)), True),
        (
            _pod("another-models-quarantine", _ref(contract.KIND, "web", "other-model", controller=False)),
            False,
        ),
        (
            _pod(
                "their-rs-claiming-us",
                _ref("ReplicaSet", "web-prefill-xyz", "their-rs"),
                _ref(contract.KIND, "web", MODEL_UID, controller=False),
            ),
            False,
        ),
        (_pod("bare"), False),
        (_pod("uncontrolled", _ref("ReplicaSet", "web-prefill-abc", "rs-uid", controller=False)), False),
        (_pod("forged-uid", _ref("ReplicaSet", "web-prefill-abc", "not-the-rs")), False),
        (_pod("their-rs", _ref("ReplicaSet", "web-prefill-xyz", "their-rs")), False),
        (_pod("orphan-rs", _ref("ReplicaSet", "bare", "bare-rs")), False),
        (_pod("gone-rs", _ref("ReplicaSet", "web-prefill-old", "gone")), False),
        (_pod("another-model", _ref(contract.KIND, "web", "other-model")), False),
        (_pod("a-job", _ref("Job", "web-prefill", "job")), False),
        (
            _pod(
                "odd-api", {**_ref("ReplicaSet", "web-prefill-abc", "rs-uid"), "apiVersion": "x.example/v1"}
            ),
            False,
        ),
    ],
    ids=lambda v: v["metadata"]["name"] if isinstance(v, dict) else str(v),
)
def test_only_pods_the_model_controls_are_its_own(pod: dict[str, Any], ours: bool) -> None:
    owners = Owners(MODEL_UID, NS)
    asyncio.run(owners.learn([pod], Reads()))
    assert owners.ours(pod) is ours


def test_each_controller_is_read_once() -> None:
    owners, reads = Owners(MODEL_UID, NS), Reads()
    pods = [POD_OF_DEPLOYMENT, POD_OF_GROUP, QUARANTINED]
    asyncio.run(owners.learn(pods, reads))
    first = reads.count
    assert first == 3  # ReplicaSet, its Deployment, the StatefulSet
    asyncio.run(owners.learn(pods, reads))
    assert reads.count == first
    assert all(owners.ours(p) for p in pods)


def test_a_pod_never_learnt_about_is_not_ours() -> None:
    assert not Owners(MODEL_UID, NS).ours(POD_OF_DEPLOYMENT)

"""The worker key's Secret (pure parts): its object, where the model's pods mount it, and which
one a model uses, found from its own children."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from pdwarden_operator import worker_key_secret
from pdwarden_operator.models import parse_spec
from pdwarden_operator.render import Owner, render_children, worker_key_secret_object
from pdwarden_operator.worker_key_secret import KeyUse

pytestmark = pytest.mark.unit

OWNER = Owner(name="m1", namespace="ns1", uid="u-1")


def test_the_secret_is_named_by_the_api_server_owned_by_the_model_and_immutable() -> None:
    key = worker_key_secret.new_key()
    obj = worker_key_secret_object(OWNER, key)
    meta = obj["metadata"]
    assert "name" not in meta and meta["generateName"] == "m1-worker-key-"
    assert meta["namespace"] == "ns1"
    [ref] = meta["ownerReferences"]
    assert ref["uid"] == "u-1" and ref["controller"] is True
    assert obj["immutable"] is True and obj["type"] == "Opaque"
    assert base64.b64decode(obj["data"]["key"]).decode() == key
    assert len(key) == 43 and key != worker_key_secret.new_key()


def _children(secret: str | None, enabled: bool = True) -> list[dict[str, Any]]:
    spec = parse_spec({"model": {"path": "p"}, "engine": "synthetic", "workerKey": {"enabled": enabled}})
    return render_children(
        Owner(name="m1", namespace="ns1", uid="u-1", worker_key=None if secret is None else KeyUse(secret)),
        spec,
    )


def test_the_secret_in_use_is_read_from_the_models_own_workloads() -> None:
    assert worker_key_secret.in_use(_children("m1-worker-key-ab12c"), "m1") == "m1-worker-key-ab12c"
    assert worker_key_secret.in_use(_children(None, enabled=False), "m1") is None
    assert worker_key_secret.in_use([], "m1") is None
    # the stand-in is a name too: it is found, and reconcile treats it as "none yet"
    assert worker_key_secret.in_use(_children(None), "m1") == worker_key_secret.pending("m1")


def test_a_volume_naming_another_models_or_a_foreign_secret_is_not_taken_for_the_key() -> None:
    children = _children("m1-worker-key-ab12c")
    for child in children:
        for vol in child.get("spec", {}).get("template", {}).get("spec", {}).get("volumes", []):
            if vol["name"] == "worker-key":
                vol["secret"]["secretName"] = "someone-elses-secret"
    assert worker_key_secret.in_use(children, "m1") is None
    assert worker_key_secret.in_use(_children("m1-worker-key-ab12c"), "m2") is None


def test_the_router_says_which_secret_when_workloads_disagree_mid_roll() -> None:
    children = _children("m1-worker-key-old00")
    router = next(c for c in children if c["kind"] == "Deployment" and c["metadata"]["name"] == "m1-router")
    [vol] = [v for v in router["spec"]["template"]["spec"]["volumes"] if v["name"] == "worker-key"]
    vol["secret"]["secretName"] = "m1-worker-key-new11"
    assert worker_key_secret.in_use(children, "m1") == "m1-worker-key-new11"


def test_the_stand_in_can_never_be_a_generated_name() -> None:
    # generated names end in 5 characters; the stand-in's suffix has 7
    assert len(worker_key_secret.pending("m1").removeprefix(worker_key_secret.generate_name("m1"))) == 7


S = "m1-worker-key-ab12c"
PENDING = worker_key_secret.pending("m1")
DONE = {"observedGeneration": 1, "updatedReplicas": 1, "readyReplicas": 1, "replicas": 1}
ROLLING = {"observedGeneration": 1, "updatedReplicas": 1, "readyReplicas": 1, "replicas": 2}


def _workloads(
    router: KeyUse | None,
    workers: KeyUse | None,
    router_status: dict[str, int],
    workers_status: dict[str, int],
) -> list[dict[str, Any]]:
    """The model's three Deployments as the watches hold them: the router's rendered with
    `router`, the workers' with `workers`, each with a status."""
    spec = parse_spec(
        {"model": {"path": "p"}, "engine": "synthetic", "prefill": {"replicas": 1}, "decode": {"replicas": 1}}
    )
    out = []
    for use, status, roles in (
        (router, router_status, ("router",)),
        (workers, workers_status, ("prefill", "decode")),
    ):
        for child in render_children(Owner(name="m1", namespace="ns1", uid="u-1", worker_key=use), spec):
            if child["kind"] == "Deployment" and child["metadata"]["labels"]["pdwarden.io/role"] in roles:
                if use is None:  # rendered without any key: drop the spec's default stand-in
                    child = _strip_key(child)
                out.append({**child, "metadata": {**child["metadata"], "generation": 1}, "status": status})
    return out


def _strip_key(child: dict[str, Any]) -> dict[str, Any]:
    pod = child["spec"]["template"]["spec"]
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "worker-key"]
    return child


OFF = None
ON = KeyUse(S)


@pytest.mark.parametrize(
    ("case", "children", "enabled", "expected"),
    [
        ("a new model: everyone at once", [], True, KeyUse(PENDING)),
        (
            "an upgrade: the router first",
            _workloads(OFF, OFF, DONE, DONE),
            True,
            KeyUse(PENDING, workers=False),
        ),
        ("the router still rolling", _workloads(ON, OFF, ROLLING, DONE), True, KeyUse(S, workers=False)),
        ("the router rolled: the workers", _workloads(ON, OFF, DONE, DONE), True, KeyUse(S)),
        ("the workers already require it", _workloads(ON, ON, ROLLING, ROLLING), True, KeyUse(S)),
        ("off: the workers first", _workloads(ON, ON, DONE, DONE), False, KeyUse(S, workers=False)),
        (
            "off: the workers still rolling",
            _workloads(ON, OFF, DONE, ROLLING),
            False,
            KeyUse(S, workers=False),
        ),
        ("off: the workers rolled, the router", _workloads(ON, OFF, DONE, DONE), False, None),
        ("off and never on", _workloads(OFF, OFF, DONE, DONE), False, None),
    ],
)
def test_the_key_is_switched_on_router_first_and_off_workers_first(
    case: str, children: list[dict[str, Any]], enabled: bool, expected: KeyUse | None
) -> None:
    assert worker_key_secret.plan_use(children, "m1", enabled) == expected, case


def test_a_workload_is_rolled_out_only_when_every_pod_runs_its_current_template() -> None:
    base = {"kind": "Deployment", "metadata": {"generation": 2}, "spec": {"replicas": 2}}
    done = {"observedGeneration": 2, "updatedReplicas": 2, "readyReplicas": 2, "replicas": 2}
    assert worker_key_secret.rolled_out({**base, "status": done})
    assert not worker_key_secret.rolled_out({**base, "status": {**done, "observedGeneration": 1}})
    assert not worker_key_secret.rolled_out({**base, "status": {**done, "replicas": 3}})  # an old pod left
    assert not worker_key_secret.rolled_out({**base, "status": {**done, "updatedReplicas": 1}})
    assert not worker_key_secret.rolled_out({**base, "status": {**done, "readyReplicas": 1}})
    assert not worker_key_secret.rolled_out({**base})
    sts = {**base, "kind": "StatefulSet"}
    assert not worker_key_secret.rolled_out(
        {**sts, "status": {**done, "currentRevision": "a", "updateRevision": "b"}}
    )
    assert worker_key_secret.rolled_out(
        {**sts, "status": {**done, "currentRevision": "b", "updateRevision": "b"}}
    )
    zero = {"kind": "Deployment", "metadata": {"generation": 1}, "spec": {"replicas": 0}}
    assert worker_key_secret.rolled_out({**zero, "status": {"observedGeneration": 1}})

"""The worker key's Secret (pure parts): its object, where the model's pods mount it, and which
one a model uses, found from its own children."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from pdwarden_operator import worker_key_secret
from pdwarden_operator.models import parse_spec
from pdwarden_operator.render import Owner, render_children, worker_key_secret_object

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
    return render_children(Owner(name="m1", namespace="ns1", uid="u-1", worker_key_secret=secret), spec)


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

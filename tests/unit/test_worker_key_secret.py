"""The worker key's Secret (pure parts): its object, where the model's pods mount it, and which
one a model uses, found from its own children."""

from __future__ import annotations

import base64
import itertools
from typing import Any

import pytest

from pdwarden_operator import worker_key_secret
from pdwarden_operator.models import parse_spec
from pdwarden_operator.render.children import render_children
from pdwarden_operator.render.meta import Owner
from pdwarden_operator.render.worker_key import worker_key_secret_object
from pdwarden_operator.worker_key_secret import KeyUse
from pdwarden_runtime.hardening.side_channel import SideKeys

pytestmark = pytest.mark.unit

OWNER = Owner(name="m1", namespace="ns1", uid="u-1")


def test_the_secret_is_named_by_the_api_server_owned_by_the_model_and_immutable() -> None:
    key = worker_key_secret.new_key()
    obj = worker_key_secret_object(OWNER, parse_spec({"model": {"path": "p"}}), key)
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
        Owner(
            name="m1", namespace="ns1", uid="u-1", worker_key=None if secret is None else KeyUse.final(secret)
        ),
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
S2 = "m1-worker-key-r2-xy34z"
PENDING = worker_key_secret.pending("m1")
DONE = {"observedGeneration": 1, "updatedReplicas": 1, "readyReplicas": 1, "replicas": 1}
ROLLING = {"observedGeneration": 1, "updatedReplicas": 1, "readyReplicas": 1, "replicas": 2}
SPEC = parse_spec(
    {"model": {"path": "p"}, "engine": "synthetic", "prefill": {"replicas": 1}, "decode": {"replicas": 1}}
)


def _workloads(
    use: KeyUse | None, status: dict[str, int] = DONE, decode: KeyUse | str | None = "same"
) -> list[dict[str, Any]]:
    """The model's three Deployments as the watches hold them, rendered with `use` (the
    decode's with `decode` when it differs: an apply cut short), each with `status`."""
    out = []
    for role, rendered_with in (
        ("router", use),
        ("prefill", use),
        ("decode", use if decode == "same" else decode),
    ):
        with_use = rendered_with if isinstance(rendered_with, KeyUse) else None
        owner = Owner(name="m1", namespace="ns1", uid="u-1", worker_key=with_use)
        spec = SPEC if with_use is not None else parse_spec({**_SPEC_BODY, "workerKey": {"enabled": False}})
        [child] = [
            c
            for c in render_children(owner, spec)
            if c["kind"] == "Deployment" and c["metadata"]["labels"]["pdwarden.io/role"] == role
        ]
        out.append({**child, "metadata": {**child["metadata"], "generation": 1}, "status": status})
    return out


_SPEC_BODY = {
    "model": {"path": "p"},
    "engine": "synthetic",
    "prefill": {"replicas": 1},
    "decode": {"replicas": 1},
}


def _walk(start: KeyUse | None, enabled: bool, rotation: int = 0, created: str = S2) -> list[KeyUse | None]:
    """Uses the plan goes through from `start`, every pod rolling out between steps (a Secret
    the plan asks for is created as `created`), until it stays put."""
    seen: list[KeyUse | None] = [start]
    for _ in range(10):
        use = worker_key_secret.plan_use(_workloads(seen[-1]), "m1", enabled, rotation)
        if use is not None:
            use = use.renamed(PENDING, created)
        if use == seen[-1]:
            return seen
        seen.append(use)
    raise AssertionError(f"no end: {seen}")


FINAL = KeyUse.final(S)


def test_switching_the_key_on_goes_router_first_then_workers_lenient_then_strict() -> None:
    assert _walk(None, True, created=S) == [
        None,
        KeyUse(router=S),
        KeyUse(router=S, sign=S, lenient=True),
        FINAL,
    ]


def test_switching_the_key_off_goes_workers_lenient_then_keyless_then_the_router() -> None:
    assert _walk(FINAL, False) == [FINAL, KeyUse(S, S, lenient=True), KeyUse(router=S), None]


def test_a_rotation_accepts_the_new_key_then_presents_it_then_signs_with_it_then_drops_the_old() -> None:
    assert _walk(FINAL, True, rotation=2) == [
        FINAL,
        KeyUse(router=S, sign=S, accept=S2),
        KeyUse(router=S2, sign=S, accept=S2),
        KeyUse(router=S2, sign=S2, accept=S),
        KeyUse.final(S2),
    ]
    assert worker_key_secret.plan_use(_workloads(KeyUse.final(S2)), "m1", True, 1) == KeyUse.final(
        S2
    )  # lowered


def _side_keys(use: KeyUse | None) -> SideKeys:
    """The runtime's keys for a worker rendered with `use` (a Secret's name stands for its key)."""
    if use is None or use.sign is None:
        return SideKeys()
    accept = [use.accept] if use.accept is not None else []
    return SideKeys.derive(use.sign * 2, [a * 2 for a in accept], use.lenient)


def _http_keys(use: KeyUse | None) -> set[str] | None:
    """The keys a worker's HTTP port takes (None: any request)."""
    if use is None or use.sign is None:
        return None
    return {use.sign, *([use.accept] if use.accept else [])}


@pytest.mark.parametrize(
    ("start", "enabled", "rotation"),
    [(None, True, 0), (FINAL, False, 0), (FINAL, True, 2), (KeyUse(router=S, sign=S, accept=S2), False, 0)],
)
def test_pods_of_neighbouring_uses_always_understand_each_other(
    start: KeyUse | None, enabled: bool, rotation: int
) -> None:
    """What the runtime does with each use: the router's key is taken by every worker of both
    uses, and each worker takes what a worker of the other signs."""
    frames = [b"NixlMsgGuard", b"7"]
    walk = _walk(start, enabled, rotation, created=S if start is None else S2)
    for old, new in itertools.pairwise(walk):
        for router_use in (old, new):  # router pods of either use, while they roll
            presented = None if router_use is None else router_use.router
            for worker in (old, new):
                accepted = _http_keys(worker)
                assert accepted is None or presented in accepted, (old, new)
        for a, b in ((old, new), (new, old)):
            assert _side_keys(b).open(_side_keys(a).sign(frames)) == frames, (a, b)


@pytest.mark.parametrize(
    ("case", "children", "expected"),
    [
        ("the router still rolling", _workloads(KeyUse(router=S), ROLLING), KeyUse(router=S)),
        (
            "an apply cut short: the later use, held until applied",
            _workloads(KeyUse(router=S), decode=KeyUse(router=S, sign=S, lenient=True)),
            KeyUse(router=S, sign=S, lenient=True),
        ),
        ("a new model: everyone at once", [], KeyUse.final(PENDING)),
        ("settled", _workloads(FINAL), FINAL),
    ],
)
def test_the_plan_holds_a_step_until_every_pod_runs_it(
    case: str, children: list[dict[str, Any]], expected: KeyUse
) -> None:
    assert worker_key_secret.plan_use(children, "m1", True) == expected, case


def test_a_secrets_rotation_is_read_from_its_name() -> None:
    assert worker_key_secret.rotation_of(S, "m1") == 0
    assert worker_key_secret.rotation_of(S2, "m1") == 2
    assert worker_key_secret.rotation_of("m2-worker-key-ab12c", "m1") is None
    assert worker_key_secret.generate_name("m1", 3) == "m1-worker-key-r3-"
    assert worker_key_secret.newest([S, S2], "m1") == S2


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


def test_status_says_where_the_key_stands_at_every_step_of_a_rotation() -> None:
    states = []
    for use in _walk(FINAL, True, rotation=2):
        found = worker_key_secret.progress(_workloads(use), "m1", True, 2)
        states.append((found["state"], found.get("rotation")))
        assert (found["message"] is not None) is (found["state"] != "On"), found
    assert states == [("Rotating", 0), ("Rotating", 0), ("Rotating", 2), ("Rotating", 2), ("On", 2)]
    rolling = worker_key_secret.progress(_workloads(KeyUse(S, S, S2), ROLLING), "m1", True, 2)
    assert rolling["state"] == "Rotating" and "waiting for every pod" in rolling["message"]
    off = {"state": "Off", "rotation": None, "message": None}  # None: removed by the merge patch
    assert worker_key_secret.progress(_workloads(None), "m1", False) == off
    assert worker_key_secret.progress(_workloads(FINAL), "m1", False)["state"] == "SwitchingOff"
    assert worker_key_secret.progress(_workloads(KeyUse(router=S)), "m1", True)["state"] == "SwitchingOn"
    on = {"state": "On", "rotation": 0, "message": None}
    assert worker_key_secret.progress(_workloads(FINAL), "m1", True) == on

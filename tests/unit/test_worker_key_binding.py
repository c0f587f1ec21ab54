"""A pass that creates the worker key's Secret renders its children once: over the placeholder
(`worker_key_secret.pending`), then `bind_created_key` puts the created Secret's name where the
placeholder stands (`with_worker_key`, the executor's). Bound, the render is the render over
the created name, digest and all."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import replace
from typing import Any

import pytest

from pdwarden_operator import plan, podtemplate, worker_key_secret
from pdwarden_operator.kube import apply as kube_apply
from pdwarden_operator.kube.client import KubeClient
from pdwarden_operator.models import parse_spec
from pdwarden_operator.reconcile.executor import with_worker_key
from pdwarden_operator.render.children import child_key, render_children
from pdwarden_operator.render.meta import Owner
from pdwarden_operator.render.worker_key import bind_created_key
from pdwarden_operator.worker_key_secret import KeyUse
from tests.support.kube_client import unreachable_client

pytestmark = pytest.mark.unit

Obj = dict[str, Any]
OWNER = Owner(name="m1", namespace="ns1", uid="u-1")
PLACEHOLDER = worker_key_secret.pending("m1")
CREATED = "m1-worker-key-r1-x7k2p"
OLD = "m1-worker-key-b4c5d"
SPEC: dict[str, Any] = {"model": {"path": "p"}, "engine": "synthetic"}
GROUPED = {"replicas": 1, "nodesPerReplica": 2, "tensorParallel": 2}

# key use over the placeholder, the spec: every case where a pass creates the Secret
CASES: dict[str, tuple[KeyUse, dict[str, Any]]] = {
    "a new model": (KeyUse.final(PLACEHOLDER), SPEC),
    "a new model, a role in groups": (KeyUse.final(PLACEHOLDER), {**SPEC, "prefill": GROUPED}),
    "the Secret gone": (KeyUse.final(PLACEHOLDER), {**SPEC, "workerKey": {"rotation": 1}}),
    "a rotation's first step": (
        KeyUse(router=OLD, sign=OLD, accept=PLACEHOLDER),
        {**SPEC, "workerKey": {"rotation": 1}},
    ),
}


def _render(use: KeyUse, spec: dict[str, Any]) -> list[Obj]:
    return plan.stamped(render_children(replace(OWNER, worker_key=use), parse_spec(spec)))


def _secret_names(objs: list[Obj]) -> set[str]:
    return {
        volume["secret"]["secretName"]
        for obj in objs
        for volume in ((obj.get("spec") or {}).get("template") or {}).get("spec", {}).get("volumes", [])
        if "secret" in volume
    }


@pytest.mark.parametrize(("use", "spec"), CASES.values(), ids=CASES.keys())
def test_the_bound_render_is_the_render_over_the_created_name(use: KeyUse, spec: dict[str, Any]) -> None:
    rendered = _render(use, spec)
    before = copy.deepcopy(rendered)
    bound = plan.stamped(bind_created_key(rendered, PLACEHOLDER, CREATED))
    assert bound == _render(use.renamed(PLACEHOLDER, CREATED), spec)
    assert PLACEHOLDER in _secret_names(rendered) and PLACEHOLDER not in _secret_names(bound)
    assert rendered == before, "pure: the render it was given is left as it was"


def test_a_render_without_the_placeholder_comes_back_as_it_was() -> None:
    rendered = _render(KeyUse.final(OLD), SPEC)
    assert all(
        a is b for a, b in zip(bind_created_key(rendered, PLACEHOLDER, CREATED), rendered, strict=True)
    )


def test_only_a_key_volume_naming_the_placeholder_is_bound() -> None:
    """The placeholder's text elsewhere (a volume of the author's, an env value) is not the key's."""
    [workload] = [
        o for o in _render(KeyUse.final(PLACEHOLDER), SPEC) if child_key(o) == ("Deployment", "m1-prefill")
    ]
    pod = workload["spec"]["template"]["spec"]
    pod["volumes"].append({"name": "theirs", "secret": {"secretName": PLACEHOLDER}})
    pod["containers"][0].setdefault("env", []).append({"name": "X", "value": PLACEHOLDER})
    [bound] = bind_created_key([workload], PLACEHOLDER, CREATED)
    volumes = {
        v["name"]: v.get("secret", {}).get("secretName") for v in bound["spec"]["template"]["spec"]["volumes"]
    }
    assert volumes[podtemplate.WORKER_KEY_VOLUME] == CREATED and volumes["theirs"] == PLACEHOLDER
    assert {"name": "X", "value": PLACEHOLDER} in bound["spec"]["template"]["spec"]["containers"][0]["env"]


@pytest.mark.parametrize(("use", "spec"), CASES.values(), ids=CASES.keys())
def test_a_pass_that_creates_the_secret_applies_the_render_over_its_name(
    monkeypatch: pytest.MonkeyPatch, use: KeyUse, spec: dict[str, Any]
) -> None:
    """`with_worker_key` binds the pass's one render to the Secret it created, and gets what a
    second render over the created name would."""
    created: list[Obj] = []

    async def create(client: KubeClient, obj: Obj, *, dry_run: bool = False) -> Obj:
        assert not dry_run
        created.append(obj)
        return {**obj, "metadata": {**obj["metadata"], "name": CREATED}}

    monkeypatch.setattr(kube_apply, "create", create)
    owner = replace(OWNER, worker_key=use)
    kube = unreachable_client()  # its one call, the create, is the recorder's
    _, objs, secret = asyncio.run(with_worker_key(kube, parse_spec(spec), owner, _render(use, spec)))
    assert objs == _render(use.renamed(PLACEHOLDER, CREATED), spec)
    assert secret is not None and secret["metadata"]["name"] == CREATED and len(created) == 1

"""The podTemplate merge and the owned-field rules: one list, enforced by the CRD and the models."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from pdwarden_operator import plan, podtemplate
from pdwarden_operator.crd import build_crd
from pdwarden_operator.models import parse_spec
from pdwarden_operator.render.children import render_children
from pdwarden_operator.render.meta import Owner

pytestmark = pytest.mark.unit


def test_maps_merge_scalars_replace_and_null_removes() -> None:
    base = {"spec": {"securityContext": {"runAsUser": 1000, "fsGroup": 1000}, "nodeSelector": {"a": "1"}}}
    frag = {"spec": {"securityContext": {"runAsUser": 0, "fsGroup": None}, "nodeSelector": {"b": "2"}}}
    assert podtemplate.merge(base, frag) == {
        "spec": {"securityContext": {"runAsUser": 0}, "nodeSelector": {"a": "1", "b": "2"}}
    }


def test_keyed_lists_merge_by_key_and_append_new_items() -> None:
    base = {"containers": [{"name": "runtime", "image": "i", "env": [{"name": "A", "value": "1"}]}]}
    frag = {
        "containers": [
            {"name": "runtime", "env": [{"name": "A", "value": "2"}, {"name": "B", "value": "3"}]},
            {"name": "side", "image": "s"},
        ]
    }
    out = podtemplate.merge(base, frag)
    assert out["containers"] == [
        {"name": "runtime", "image": "i", "env": [{"name": "A", "value": "2"}, {"name": "B", "value": "3"}]},
        {"name": "side", "image": "s"},
    ]


def test_appended_lists_and_replaced_lists() -> None:
    base = {"tolerations": [{"key": "a"}], "volumeMounts": [{"name": "x"}], "args": ["1"]}
    frag = {"tolerations": [{"key": "b"}], "volumeMounts": [{"name": "y"}], "args": ["2"]}
    out = podtemplate.merge(base, frag)
    assert out == {
        "tolerations": [{"key": "a"}, {"key": "b"}],
        "volumeMounts": [{"name": "x"}, {"name": "y"}],
        "args": ["2"],
    }


def test_merge_modifies_neither_input() -> None:
    base = {"spec": {"containers": [{"name": "runtime", "env": [{"name": "A"}]}]}}
    frag = {"spec": {"containers": [{"name": "runtime", "env": [{"name": "B"}]}]}}
    before = (copy.deepcopy(base), copy.deepcopy(frag))
    podtemplate.merge(base, frag)
    assert (base, frag) == before


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(fragment=st.dictionaries(st.sampled_from(["metadata", "spec", "x"]), json_values, max_size=3))
def test_owned_check_and_merge_never_crash_on_garbage(fragment: dict[str, Any]) -> None:
    for main in (podtemplate.RUNTIME_CONTAINER, podtemplate.ROUTER_CONTAINER):
        assert isinstance(podtemplate.owned_violations(fragment, main), list)
    podtemplate.merge({"metadata": {}, "spec": {"containers": []}}, fragment)


@pytest.mark.parametrize("field", sorted(podtemplate.OWNED_CONTAINER_FIELDS))
def test_every_owned_container_field_is_refused_by_the_models_naming_it(field: str) -> None:
    frag = {"spec": {"containers": [{"name": "runtime", field: ["x"]}]}}
    with pytest.raises(ValidationError) as info:
        parse_spec({"model": {"path": "m"}, "decode": {"podTemplate": frag}})
    assert f"spec.containers[0].{field}: owned by pdwarden" in str(info.value)
    # The same field on a sidecar is the sidecar's own business.
    side = {"spec": {"containers": [{"name": "side", "image": "i", field: ["x"]}]}}
    parse_spec({"model": {"path": "m"}, "decode": {"podTemplate": side}})


def test_router_owns_its_service_account() -> None:
    frag = {"spec": {"serviceAccountName": "other"}}
    with pytest.raises(ValidationError, match=r"spec\.serviceAccountName: owned by pdwarden"):
        parse_spec({"model": {"path": "m"}, "router": {"podTemplate": frag}})
    # A runtime pod may run as another ServiceAccount (e.g. for cloud storage access).
    parse_spec({"model": {"path": "m"}, "prefill": {"podTemplate": frag}})


def _validations(node: Any) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    if isinstance(node, dict):
        out += node.get("x-kubernetes-validations", [])
        for value in node.values():
            out += _validations(value)
    elif isinstance(node, list):
        for value in node:
            out += _validations(value)
    return out


def test_the_crd_has_a_rule_for_every_owned_field_of_every_role() -> None:
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for role, main in (("prefill", "runtime"), ("decode", "runtime"), ("router", "router")):
        template = spec["properties"][role]["properties"]["podTemplate"]
        assert template["x-kubernetes-preserve-unknown-fields"] is True
        assert "strategic-merge" in template["description"]
        rules = " ".join(r["rule"] for r in _validations(template))
        for field in podtemplate.OWNED_CONTAINER_FIELDS:
            assert f"self.name != '{main}' || !has(self.{field})" in rules
        for field in podtemplate.OWNED_POD_FIELDS[main]:
            assert f"!has(self.{field})" in rules
        for key in (*podtemplate.OWNED_LABELS, *podtemplate.OWNED_ANNOTATIONS):
            assert f"'{key}' in self" in rules
        for name in podtemplate.OWNED_VOLUMES:
            assert f"'{name}'" in rules


def test_a_disabled_network_policy_is_deleted_and_nothing_else() -> None:
    owner = Owner(name="m1", namespace="ns", uid="u")
    on = render_children(owner, parse_spec({"model": {"path": "m"}}))
    off = render_children(owner, parse_spec({"model": {"path": "m"}, "networkPolicy": {"enabled": False}}))
    observed = {(o["kind"], o["metadata"]["name"]): o for o in on}
    assert [(o["kind"], o["metadata"]["name"]) for o in plan.to_delete(off, observed)] == [
        ("NetworkPolicy", "m1-router"),
        ("NetworkPolicy", "m1-runtime"),
    ]
    assert plan.to_delete(on, observed) == []


@pytest.mark.parametrize("volume", podtemplate.MAIN_ONLY_VOLUMES)
@pytest.mark.parametrize(("role", "main"), [("router", "router"), ("decode", "runtime")])
def test_no_sidecar_mounts_the_main_containers_secrets(volume: str, role: str, main: str) -> None:
    """The worker key, the Hugging Face token and the router's API token are the main
    container's: a sidecar or an init container that mounts one is refused, naming it."""
    for part in ("containers", "initContainers"):
        frag = {
            "spec": {
                part: [{"name": "side", "image": "i", "volumeMounts": [{"name": volume, "mountPath": "/k"}]}]
            }
        }
        with pytest.raises(ValidationError) as info:
            parse_spec({"model": {"path": "m"}, role: {"podTemplate": frag}})
        assert f"spec.{part}[0].volumeMounts[0].name: {volume} is {main}'s alone" in str(info.value)
    # the main container may mount what is its own wherever it likes
    own = {"spec": {"containers": [{"name": main, "volumeMounts": [{"name": volume, "mountPath": "/k"}]}]}}
    parse_spec({"model": {"path": "m"}, role: {"podTemplate": own}})


@pytest.mark.parametrize("role", ["router", "prefill"])
def test_no_pod_shares_its_process_namespace(role: str) -> None:
    frag = {"spec": {"shareProcessNamespace": True}}
    with pytest.raises(ValidationError, match=r"spec\.shareProcessNamespace: owned by pdwarden"):
        parse_spec({"model": {"path": "m"}, role: {"podTemplate": frag}})

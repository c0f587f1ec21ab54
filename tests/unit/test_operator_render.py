"""Rendered children of a DisaggregatedModel, compared with golden YAML.

Regenerate after an intended change: PDWARDEN_UPDATE_GOLDEN=1 pytest tests/unit/test_operator_render.py
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdwarden_operator.models import parse_spec
from pdwarden_operator.render import Owner, child_key, render_children
from pdwarden_runtime import contract

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).parent / "golden"
UID = "6f1c2d3e-0000-4000-8000-000000000001"

CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # name: (spec, metadata annotations)
    "synthetic-basic": (
        {"model": {"path": "synthetic/tiny"}, "engine": "synthetic", "router": {"policy": "round_robin"}},
        {},
    ),
    "synthetic-fault-injection": (
        {
            "model": {"path": "synthetic/tiny", "servedName": "tiny"},
            "engine": "synthetic",
            "prefill": {"replicas": 3, "args": ["--kv-bytes", "65536"]},
            "decode": {"replicas": 0},
            "router": {"replicas": 0},
        },
        {contract.ANNOTATION_ALLOW_FAULT_INJECTION: "true"},
    ),
    "sglang-gpu": (
        {
            "model": {"path": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama-8b"},
            "image": "registry.example/pdwarden-runtime:1.2.3",
            "engine": "sglang",
            "transfer": {"ucxTransports": "rc,cuda_copy", "inflightDeadlineSeconds": 120},
            "prefill": {
                "replicas": 2,
                "tensorParallel": 2,
                "gpus": 2,
                "resources": {"requests": {"cpu": 8, "memory": "64Gi"}},
                "args": ["--mem-fraction-static", "0.85"],
                "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}],
            },
            "decode": {"replicas": 4, "gpus": 1},
            "router": {"replicas": 2, "policy": "cache_aware", "image": "registry.example/router:0.3.2"},
            "watchdog": {"maxUnavailable": 2},
        },
        {},
    ),
}


def _render(name: str) -> list[dict[str, Any]]:
    spec, annotations = CASES[name]
    owner = Owner(name="m1", namespace="ns1", uid=UID, annotations=annotations)
    return render_children(owner, parse_spec(spec))


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_children_match_golden(case: str) -> None:
    text = yaml.safe_dump_all(_render(case), sort_keys=False, width=100)
    path = GOLDEN / f"{case}.yaml"
    if os.environ.get("PDWARDEN_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"missing {path}: run with PDWARDEN_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path} differs: review, then regenerate with PDWARDEN_UPDATE_GOLDEN=1"


def _by_key(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {child_key(o): o for o in objs}


def _container(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]["containers"][0]


def test_every_child_is_owned_labelled_and_named_deterministically() -> None:
    objs = _render("sglang-gpu")
    assert sorted(child_key(o) for o in objs) == sorted(
        [
            ("Deployment", "m1-prefill"),
            ("Deployment", "m1-decode"),
            ("Deployment", "m1-router"),
            ("ServiceAccount", "m1-router"),
            ("Role", "m1-router"),
            ("RoleBinding", "m1-router"),
            ("Service", "m1-router"),
            ("PodDisruptionBudget", "m1-prefill"),
            ("PodDisruptionBudget", "m1-decode"),
            ("PodDisruptionBudget", "m1-router"),
        ]
    )
    for o in objs:
        meta = o["metadata"]
        assert meta["namespace"] == "ns1"
        [ref] = meta["ownerReferences"]
        assert ref["uid"] == UID and ref["controller"] is True and ref["kind"] == contract.KIND
        assert meta["labels"][contract.LABEL_MODEL] == "m1"
        assert meta["labels"][contract.LABEL_MANAGED_BY] == contract.MANAGED_BY
    assert objs == _render("sglang-gpu"), "rendering must be deterministic"


def test_runtime_pod_follows_interface_1() -> None:
    objs = _by_key(_render("sglang-gpu"))
    prefill = objs[("Deployment", "m1-prefill")]
    c = _container(prefill)
    cmd = c["command"]
    assert cmd[:3] == ["pdwarden", "runtime", "serve"]
    assert cmd[cmd.index("--role") + 1] == "prefill"
    assert cmd[cmd.index("--engine") + 1] == "sglang"
    assert cmd[cmd.index("--host") + 1] == "$(POD_IP)"
    assert cmd[cmd.index("--port") + 1] == "30000"
    assert cmd[cmd.index("--bootstrap-port") + 1] == "8998"
    assert cmd[cmd.index("--metrics-port") + 1] == "9400"
    assert "--allow-fault-injection" not in cmd
    tail = cmd[cmd.index("--") + 1 :]
    assert tail == [
        "--model-path",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--served-model-name",
        "llama-8b",
        "--tp",
        "2",
        "--mem-fraction-static",
        "0.85",
    ]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {
        "http": 30000,
        "bootstrap": 8998,
        "metrics": 9400,
    }
    pod_ip = next(e for e in c["env"] if e["name"] == "POD_IP")
    assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    pod_meta = prefill["spec"]["template"]["metadata"]
    assert pod_meta["annotations"][contract.ANNOTATION_BOOTSTRAP_PORT] == "8998"
    assert prefill["spec"]["selector"]["matchLabels"] == {
        contract.LABEL_MODEL: "m1",
        contract.LABEL_ROLE: "prefill",
    }


def test_fault_injection_flag_follows_the_annotation() -> None:
    objs = _by_key(_render("synthetic-fault-injection"))
    for role in ("prefill", "decode"):
        cmd = _container(objs[("Deployment", f"m1-{role}")])["command"]
        assert "--allow-fault-injection" in cmd
        assert "--" not in cmd, "the synthetic engine takes no sglang args"
    assert _container(objs[("Deployment", "m1-prefill")])["command"][-2:] == ["--kv-bytes", "65536"]
    plain = _by_key(_render("synthetic-basic"))
    assert "--allow-fault-injection" not in _container(plain[("Deployment", "m1-prefill")])["command"]


def test_router_discovers_this_models_pods() -> None:
    objs = _by_key(_render("sglang-gpu"))
    router = objs[("Deployment", "m1-router")]
    cmd = _container(router)["command"]
    assert cmd[:3] == ["python", "-m", "sglang_router.launch_router"]
    for flag in ("--pd-disaggregation", "--service-discovery"):
        assert flag in cmd
    i = cmd.index("--prefill-selector")
    assert cmd[i + 1 : i + 3] == ["pdwarden.io/model=m1", "pdwarden.io/role=prefill"]
    i = cmd.index("--decode-selector")
    assert cmd[i + 1 : i + 3] == ["pdwarden.io/model=m1", "pdwarden.io/role=decode"]
    assert cmd[cmd.index("--service-discovery-port") + 1] == "30000"
    assert cmd[cmd.index("--host") + 1] == "$(POD_IP)"
    assert _container(router)["image"] == "registry.example/router:0.3.2"
    assert router["spec"]["template"]["spec"]["serviceAccountName"] == "m1-router"
    role = objs[("Role", "m1-router")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = objs[("RoleBinding", "m1-router")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "m1-router", "namespace": "ns1"}]
    svc = objs[("Service", "m1-router")]
    assert svc["spec"]["selector"] == {contract.LABEL_MODEL: "m1", contract.LABEL_ROLE: "router"}


def test_pdb_per_role_uses_watchdog_max_unavailable() -> None:
    objs = _by_key(_render("sglang-gpu"))
    for role in ("prefill", "decode", "router"):
        pdb = objs[("PodDisruptionBudget", f"m1-{role}")]
        assert pdb["spec"]["maxUnavailable"] == 2
        assert pdb["spec"]["selector"]["matchLabels"][contract.LABEL_ROLE] == role


def test_scaling_one_role_changes_only_that_roles_deployment() -> None:
    spec = dict(CASES["sglang-gpu"][0])
    before = _by_key(_render("sglang-gpu"))
    scaled_spec = {**spec, "prefill": {**spec["prefill"], "replicas": 5}}
    owner = Owner(name="m1", namespace="ns1", uid=UID)
    after = _by_key(render_children(owner, parse_spec(scaled_spec)))
    changed = sorted(k for k in before if before[k] != after[k])
    assert changed == [("Deployment", "m1-prefill")]
    assert after[("Deployment", "m1-prefill")]["spec"]["replicas"] == 5

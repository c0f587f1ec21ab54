"""Rendered children of a DisaggregatedModel, compared with golden YAML.

Regenerate after an intended change: PDWARDEN_UPDATE_GOLDEN=1 pytest tests/unit/test_operator_render.py
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

import pdwarden_contract as contract
from pdwarden_operator import plan
from pdwarden_operator.models import parse_spec
from pdwarden_operator.render.children import child_key, render_children
from pdwarden_operator.render.meta import Owner
from pdwarden_operator.worker_key_secret import KeyUse

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
            "prefill": {"replicas": 3, "args": ["--page-bytes", "65536"]},
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
    # One golden per new field of the pod: a GPU user's template, model storage, RDMA, policy.
    "pod-template": (
        {
            "model": {"path": "m"},
            "engine": "sglang",
            "prefill": {
                "gpus": 1,
                "podTemplate": {
                    "metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"}},
                    "spec": {
                        "tolerations": [
                            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                        ],
                        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                        "priorityClassName": "inference",
                        "imagePullSecrets": [{"name": "registry"}],
                        "securityContext": {"runAsUser": 2000, "fsGroup": None},
                        "topologySpreadConstraints": [
                            {
                                "maxSkew": 1,
                                "topologyKey": "kubernetes.io/hostname",
                                "whenUnsatisfiable": "DoNotSchedule",
                            }
                        ],
                        "containers": [
                            {
                                "name": "runtime",
                                "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
                                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                            },
                            {"name": "sidecar", "image": "busybox:1.36", "command": ["sleep", "inf"]},
                        ],
                        "volumes": [{"name": "scratch", "emptyDir": {}}],
                    },
                },
            },
            "decode": {"replicas": 0},
            "router": {
                "replicas": 1,
                "resources": {"limits": {"memory": "8Gi"}},
                "podTemplate": {"spec": {"nodeSelector": {"pool": "cpu"}}},
            },
        },
        {},
    ),
    "model-pvc": (
        {
            "model": {
                "path": "Llama-3.1-70B-Instruct",
                "persistentVolumeClaim": {"claimName": "weights", "subPath": "meta-llama"},
            },
            "engine": "sglang",
            "prefill": {"gpus": 8, "tensorParallel": 8, "sharedMemory": "64Gi"},
            "decode": {"gpus": 8, "tensorParallel": 8, "sharedMemory": "0"},
        },
        {},
    ),
    "model-host-path": (
        {"model": {"path": ".", "hostPath": {"path": "/mnt/models/llama-8b"}}, "engine": "sglang"},
        {},
    ),
    "model-hugging-face": (
        {
            "model": {
                "path": "meta-llama/Llama-3.1-8B-Instruct",
                "huggingFace": {"tokenSecretRef": {"name": "hf"}, "cache": {"claimName": "hf-cache"}},
            },
            "engine": "sglang",
            "prefill": {"gpus": 1, "env": [{"name": "HF_HOME", "value": "/elsewhere"}]},
            "decode": {"gpus": 1},
        },
        {},
    ),
    "rdma-host-network": (
        {
            "model": {"path": "m"},
            "engine": "sglang",
            "transfer": {
                "rdma": {"resourceName": "rdma/ib", "count": 2, "ibDevices": ["mlx5_0", "mlx5_1"]},
                "hostNetwork": True,
                "hostPortOffset": 1000,
            },
            "prefill": {"gpus": 1},
            "decode": {"gpus": 1},
        },
        {},
    ),
    "network-policy": (
        {
            "model": {"path": "synthetic/tiny"},
            "engine": "synthetic",
            "networkPolicy": {"enabled": True},
        },
        {},
    ),
    # Multi-node replicas: a synthetic model with 2-pod groups, and SGLang over 4 nodes.
    "groups-2-synthetic": (
        {
            "model": {"path": "synthetic/tiny"},
            "engine": "synthetic",
            "prefill": {"replicas": 1, "nodesPerReplica": 2, "tensorParallel": 2},
            "decode": {"replicas": 2, "nodesPerReplica": 2, "tensorParallel": 2},
        },
        {},
    ),
    "groups-4-sglang": (
        {
            "model": {"path": "deepseek-ai/DeepSeek-V3", "servedName": "dsv3"},
            "engine": "sglang",
            "prefill": {"replicas": 1, "nodesPerReplica": 4, "gpus": 8, "tensorParallel": 32},
            "decode": {"replicas": 1, "nodesPerReplica": 2, "gpus": 8, "tensorParallel": 16},
            "transfer": {"hostNetwork": True, "hostPortOffset": 100},
        },
        {},
    ),
}


def _render(name: str) -> list[dict[str, Any]]:
    spec, annotations = CASES[name]
    owner = Owner(
        name="m1", namespace="ns1", uid=UID, annotations=annotations, worker_key=KeyUse.final(KEY_SECRET)
    )
    return render_children(owner, parse_spec(spec))


def _smg(router: dict[str, Any]) -> list[str]:
    """smg's own command in the router's: after the gate's `--` when the worker key is on."""
    cmd = list(_container(router)["command"])
    return cmd[cmd.index("--") + 1 :] if cmd[0] == "pdwarden" else cmd


KEY_SECRET = "m1-worker-key-x7k2p"


def _pod(objs: dict[tuple[str, str], dict[str, Any]], role: str) -> dict[str, Any]:
    """The role's pod spec: its Deployment's, or its first group's StatefulSet's."""
    obj = objs.get(("Deployment", f"m1-{role}")) or objs[("StatefulSet", f"m1-{role}-0")]
    return dict(obj["spec"]["template"]["spec"])


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
            ("ServiceAccount", "m1-runtime"),
            ("ServiceAccount", "m1-router"),
            ("Role", "m1-router"),
            ("RoleBinding", "m1-router"),
            ("Service", "m1-router"),
            ("PodDisruptionBudget", "m1-prefill"),
            ("PodDisruptionBudget", "m1-decode"),
            ("PodDisruptionBudget", "m1-router"),
            ("NetworkPolicy", "m1-runtime"),
            ("NetworkPolicy", "m1-router"),
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


def test_runtime_pods_run_as_the_models_own_account_without_a_token() -> None:
    objs = _by_key(_render("sglang-gpu"))
    account = objs[("ServiceAccount", "m1-runtime")]
    assert account["automountServiceAccountToken"] is False
    for role in contract.RUNTIME_ROLES:
        pod = objs[("Deployment", f"m1-{role}")]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "m1-runtime"
        assert pod["automountServiceAccountToken"] is False


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
    assert _container(objs[("Deployment", "m1-prefill")])["command"][-2:] == ["--page-bytes", "65536"]
    plain = _by_key(_render("synthetic-basic"))
    assert "--allow-fault-injection" not in _container(plain[("Deployment", "m1-prefill")])["command"]


def test_router_discovers_this_models_pods() -> None:
    objs = _by_key(_render("sglang-gpu"))
    router = objs[("Deployment", "m1-router")]
    gate = _container(router)["command"]
    assert gate[:3] == ["pdwarden", "runtime", "router"]
    assert gate[gate.index("--host") + 1] == "$(POD_IP)" and gate[gate.index("--port") + 1] == "8000"
    assert gate[gate.index("--worker-key-file") + 1] == "/var/run/pdwarden/worker-key/key"
    cmd = _smg(router)
    assert cmd[:3] == ["python", "-m", "smg.launch_router"]
    for flag in ("--pd-disaggregation", "--service-discovery"):
        assert flag in cmd
    i = cmd.index("--prefill-selector")
    assert cmd[i + 1 : i + 3] == ["pdwarden.io/model=m1", "pdwarden.io/role=prefill"]
    i = cmd.index("--decode-selector")
    assert cmd[i + 1 : i + 3] == ["pdwarden.io/model=m1", "pdwarden.io/role=decode"]
    assert cmd[cmd.index("--service-discovery-port") + 1] == "30000"
    # smg on loopback, behind the gate; the key is the gate's to add (never in the pod spec)
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--port") + 1] == gate[gate.index("--router-port") + 1] == "28000"
    assert "--api-key" not in cmd
    assert _container(router)["image"] == "registry.example/router:0.3.2"

    assert router["spec"]["template"]["spec"]["serviceAccountName"] == "m1-router"
    role = objs[("Role", "m1-router")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = objs[("RoleBinding", "m1-router")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "m1-router", "namespace": "ns1"}]
    svc = objs[("Service", "m1-router")]
    assert svc["spec"]["selector"] == {contract.LABEL_MODEL: "m1", contract.LABEL_ROLE: "router"}


def test_router_command_is_one_smg_parses_with_explicit_retries_and_breaker() -> None:
    """The rendered command goes through smg's own argument parser (the pinned release), and
    sets retries and the circuit breaker explicitly: a retry is a new PD attempt (a new
    bootstrap_room), two failed attempts open their workers' breakers for a second so that
    retries go to another pair, and the retries' backoff outlasts that second; smg's own health
    checks and its removal of workers are off (the pods' readiness and the watchdog decide)."""
    from smg.launch_router import parse_router_args

    for case in ("sglang-gpu", "groups-2-synthetic", "synthetic-basic"):
        router = _by_key(_render(case))[("Deployment", "m1-router")]
        cmd = [
            {"$(POD_IP)": "198.18.0.9", "$(POD_NAMESPACE)": "default"}.get(arg, arg) for arg in _smg(router)
        ]
        assert cmd[:3] == ["python", "-m", "smg.launch_router"]
        args = parse_router_args(cmd[3:])
        assert args.pd_disaggregation and args.service_discovery
        assert args.retry_max_retries == 5 and not args.disable_retries
        assert not args.disable_circuit_breaker
        assert args.cb_failure_threshold == 2 and args.cb_success_threshold == 1
        assert args.cb_timeout_duration_secs == 1
        backoff_s = (
            sum(
                min(
                    args.retry_initial_backoff_ms * args.retry_backoff_multiplier**k,
                    args.retry_max_backoff_ms,
                )
                * (1 - args.retry_jitter_factor)
                for k in range(args.retry_max_retries - 1)
            )
            / 1000
        )
        assert backoff_s > args.cb_timeout_duration_secs, backoff_s  # the retries outlast an open breaker
        assert args.prometheus_port == 29000
        assert args.disable_health_check and args.remove_unhealthy_workers is False


def test_pdb_per_role_uses_watchdog_max_unavailable() -> None:
    objs = _by_key(_render("sglang-gpu"))
    for role in ("prefill", "decode", "router"):
        pdb = objs[("PodDisruptionBudget", f"m1-{role}")]
        assert pdb["spec"]["maxUnavailable"] == 2
        assert pdb["spec"]["selector"]["matchLabels"][contract.LABEL_ROLE] == role


def _owner(deployed: dict[str, int] | None = None) -> Owner:
    return Owner(
        name="m1", namespace="ns1", uid=UID, worker_key=KeyUse.final(KEY_SECRET), deployed=deployed or {}
    )


def _budgets(spec: dict[str, Any], deployed: dict[str, int] | None = None) -> set[str]:
    return {
        o["metadata"]["name"]
        for o in render_children(_owner(deployed), parse_spec(spec))
        if o["kind"] == "PodDisruptionBudget"
    }


def test_a_role_scaled_to_zero_has_no_disruption_budget_and_loses_it_when_scaled_down() -> None:
    spec = dict(CASES["sglang-gpu"][0])
    assert _budgets(spec) == {"m1-prefill", "m1-decode", "m1-router"}
    idle = {**spec, "decode": {**spec["decode"], "replicas": 0}, "router": {"replicas": 0}}
    assert _budgets(idle) == {"m1-prefill"}
    # what reconcile deletes once the role is scaled to zero, and only that
    owner = _owner()
    observed = _by_key(render_children(owner, parse_spec(spec)))
    gone = plan.to_delete(render_children(owner, parse_spec(idle)), observed)
    assert [child_key(o) for o in gone] == [
        ("PodDisruptionBudget", "m1-decode"),
        ("PodDisruptionBudget", "m1-router"),
    ]
    # an autoscaled role always has its floor's pods, so its budget, whatever its Deployment says
    scaled = {**idle, "decode": {"replicas": 0, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}}}
    assert _budgets(scaled, deployed={"decode": 3}) == {"m1-prefill", "m1-decode"}
    assert _budgets(scaled, deployed={"decode": 0}) == {"m1-prefill", "m1-decode"}


def test_scaling_one_role_changes_only_that_roles_deployment() -> None:
    spec = dict(CASES["sglang-gpu"][0])
    before = _by_key(_render("sglang-gpu"))
    scaled_spec = {**spec, "prefill": {**spec["prefill"], "replicas": 5}}
    owner = _owner()
    after = _by_key(render_children(owner, parse_spec(scaled_spec)))
    changed = sorted(k for k in before if before[k] != after[k])
    assert changed == [("Deployment", "m1-prefill")]
    assert after[("Deployment", "m1-prefill")]["spec"]["replicas"] == 5


def test_every_pod_has_the_safe_defaults() -> None:
    for case in CASES:
        objs = _by_key(_render(case))
        for role in ("prefill", "decode", "router"):
            pod = _pod(objs, role)
            if case != "pod-template":
                assert pod["securityContext"]["runAsNonRoot"] is True
                assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            main = pod["containers"][0]
            sc = main["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
            added = sc["capabilities"].get("add", [])
            assert added == (["IPC_LOCK"] if case == "rdma-host-network" and role != "router" else [])
            # no pod gets a token for every container; the router's is its own container's
            assert pod["automountServiceAccountToken"] is False
            token_mounts = [
                (container["name"], mount["mountPath"])
                for container in pod["containers"] + pod.get("initContainers", [])
                for mount in container.get("volumeMounts", [])
                if mount["name"] == "router-token"
            ]
            expected = (
                [("router", "/var/run/secrets/kubernetes.io/serviceaccount")] if role == "router" else []
            )
            assert token_mounts == expected, (case, role)
        router = _container(objs[("Deployment", "m1-router")])
        assert router["resources"]["requests"] and router["resources"]["limits"]["memory"]


def test_shared_memory_follows_gpus_and_the_role_field() -> None:
    def shm(case: str, role: str) -> Any:
        pod = _pod(_by_key(_render(case)), role)
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        mounts = {m["mountPath"] for m in pod["containers"][0].get("volumeMounts", [])}
        assert ("dshm" in vols) == ("/dev/shm" in mounts)
        return vols.get("dshm", {}).get("emptyDir")

    assert shm("sglang-gpu", "prefill") == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert shm("synthetic-basic", "prefill") is None, "no GPUs: no shm"
    assert shm("model-pvc", "prefill") == {"medium": "Memory", "sizeLimit": "64Gi"}
    assert shm("model-pvc", "decode") is None, "0 turns it off"


def test_pod_template_merges_with_strategic_merge_semantics() -> None:
    objs = _by_key(_render("pod-template"))
    pod = _pod(objs, "prefill")
    meta = objs[("Deployment", "m1-prefill")]["spec"]["template"]["metadata"]
    assert meta["labels"]["team"] == "a" and meta["labels"][contract.LABEL_ROLE] == "prefill"
    assert meta["annotations"] == {contract.ANNOTATION_BOOTSTRAP_PORT: "8998", "note": "x"}
    assert [c["name"] for c in pod["containers"]] == ["runtime", "sidecar"]
    runtime = pod["containers"][0]
    assert runtime["command"][:3] == ["pdwarden", "runtime", "serve"], "owned fields stay"
    assert runtime["env"][-1] == {"name": "NCCL_DEBUG", "value": "INFO"}
    mounts = [m["mountPath"] for m in runtime["volumeMounts"]]
    assert mounts == [
        "/etc/pdwarden/gone-pods",
        "/tmp",
        "/var/run/pdwarden/worker-key",
        "/dev/shm",
        "/scratch",
    ], "appended"
    assert [v["name"] for v in pod["volumes"]] == ["gone-pods", "tmp", "worker-key", "dshm", "scratch"]
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["securityContext"]["runAsUser"] == 2000 and "fsGroup" not in pod["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True, "maps merge key by key"
    [spread] = pod["topologySpreadConstraints"]
    assert spread["whenUnsatisfiable"] == "DoNotSchedule" and "labelSelector" in spread
    router = _pod(objs, "router")
    assert router["nodeSelector"] == {"pool": "cpu"}
    assert router["containers"][0]["resources"] == {
        "requests": {"cpu": "500m", "memory": "512Mi", "ephemeral-storage": "64Mi"},
        "limits": {"cpu": "2", "memory": "8Gi"},
    }


def test_model_storage_mounts_the_weights_and_passes_the_mounted_path() -> None:
    def runtime(case: str) -> tuple[dict[str, Any], list[str]]:
        pod = _pod(_by_key(_render(case)), "prefill")
        c = pod["containers"][0]
        return pod, c["command"][c["command"].index("--model-path") + 1 :][:1]

    pod, path = runtime("model-pvc")
    assert path == ["/models/Llama-3.1-70B-Instruct"]
    model = next(v for v in pod["volumes"] if v["name"] == "model")
    assert model["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model")
    assert mount == {"name": "model", "mountPath": "/models", "readOnly": True, "subPath": "meta-llama"}
    pod, path = runtime("model-host-path")
    assert path == ["/models"]
    assert pod["volumes"][-1]["hostPath"] == {"path": "/mnt/models/llama-8b", "type": "Directory"}
    pod, path = runtime("model-hugging-face")
    assert path == ["meta-llama/Llama-3.1-8B-Instruct"]
    cache = next(v for v in pod["volumes"] if v["name"] == "model-cache")
    assert cache["persistentVolumeClaim"] == {"claimName": "hf-cache"}
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["HF_HOME"]["value"] == "/elsewhere", "the role's env replaces pdwarden's by name"
    assert "HF_TOKEN" not in env, "a token in the environment shows in every process listing"
    assert env["HF_TOKEN_PATH"]["value"] == "/var/run/secrets/huggingface/token"
    token = next(v for v in pod["volumes"] if v["name"] == "hf-token")
    assert token["secret"] == {"secretName": "hf", "items": [{"key": "token", "path": "token"}]}
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "hf-token")
    assert mount == {"name": "hf-token", "mountPath": "/var/run/secrets/huggingface", "readOnly": True}
    names = [e["name"] for e in pod["containers"][0]["env"]]
    assert len(names) == len(set(names)), "one entry per name (server-side apply refuses duplicates)"


def test_rdma_and_host_network() -> None:
    objs = _by_key(_render("rdma-host-network"))
    for role in ("prefill", "decode"):
        pod = _pod(objs, role)
        c = pod["containers"][0]
        assert c["resources"]["limits"] == {"nvidia.com/gpu": "1", "rdma/ib": "2"}
        assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
        ports = {p["name"]: (p["containerPort"], p["hostPort"]) for p in c["ports"]}
        assert ports == {"http": (31000, 31000), "bootstrap": (9998, 9998), "metrics": (10400, 10400)}
        cmd = c["command"]
        assert cmd[cmd.index("--port") + 1] == "31000"
        assert cmd[cmd.index("--disaggregation-ib-device") + 1] == "mlx5_0,mlx5_1"
    prefill = objs[("Deployment", "m1-prefill")]["spec"]["template"]["metadata"]
    assert prefill["annotations"][contract.ANNOTATION_BOOTSTRAP_PORT] == "9998"
    router = _container(objs[("Deployment", "m1-router")])["command"]
    assert router[router.index("--service-discovery-port") + 1] == "31000"
    assert "hostNetwork" not in _pod(objs, "router")


def test_network_policy_admits_router_peers_and_scrapers_only() -> None:
    objs = _by_key(_render("network-policy"))
    policy = objs[("NetworkPolicy", "m1-runtime")]
    selector = policy["spec"]["podSelector"]
    assert selector["matchLabels"] == {contract.LABEL_MODEL: "m1"}
    assert selector["matchExpressions"][0]["values"] == ["prefill", "decode", "quarantined"]
    router, peers, metrics = policy["spec"]["ingress"]
    assert router["from"] == [
        {"podSelector": {"matchLabels": {contract.LABEL_MODEL: "m1", contract.LABEL_ROLE: "router"}}}
    ]
    assert router["ports"] == [{"protocol": "TCP", "port": "http"}]
    assert peers == {"from": [{"podSelector": selector}]}
    assert metrics["ports"] == [{"protocol": "TCP", "port": "metrics"}]
    assert len(metrics["from"]) == 2
    front, router_metrics = objs[("NetworkPolicy", "m1-router")]["spec"]["ingress"]
    assert objs[("NetworkPolicy", "m1-router")]["spec"]["podSelector"] == router["from"][0]["podSelector"]
    assert front == {"ports": [{"protocol": "TCP", "port": "http"}]}, "the front door is open to clients"
    assert router_metrics == metrics
    assert ("NetworkPolicy", "m1-runtime") in _by_key(_render("synthetic-basic")), "on by default"


def test_every_container_has_a_read_only_root_a_tmp_volume_and_an_ephemeral_storage_request() -> None:
    objs = _by_key(_render("sglang-gpu"))
    for role in ("prefill", "decode", "router"):
        pod = _pod(objs, role)
        [main] = pod["containers"]
        assert main["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"name": "tmp", "mountPath": "/tmp"} in main["volumeMounts"]
        assert {"name": "tmp", "emptyDir": {}} in pod["volumes"]
        assert "ephemeral-storage" in main["resources"]["requests"]


def test_gpu_pods_tolerate_the_gpu_taint_and_cpu_pods_do_not() -> None:
    objs = _by_key(_render("sglang-gpu"))
    gpu_toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert _pod(objs, "prefill")["tolerations"] == [gpu_toleration]
    assert "tolerations" not in _pod(objs, "router"), "the router needs no GPU node"
    cpu = _by_key(_render("synthetic-basic"))
    assert all("tolerations" not in _pod(cpu, role) for role in ("prefill", "decode", "router"))


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        # a template toleration for the GPU key replaces the default one (no duplicate)
        (
            {"spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "h100"}]}},
            [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "h100"}],
        ),
        # other tolerations are appended to it
        (
            {"spec": {"tolerations": [{"key": "pool", "operator": "Exists"}]}},
            [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "pool", "operator": "Exists"},
            ],
        ),
    ],
)
def test_a_pod_template_overrides_the_gpu_toleration(template: dict[str, Any], expected: Any) -> None:
    spec = {"model": {"path": "m"}, "engine": "sglang", "prefill": {"gpus": 1, "podTemplate": template}}
    pod = _pod(
        _by_key(render_children(Owner(name="m1", namespace="ns1", uid=UID), parse_spec(spec))), "prefill"
    )
    assert pod.get("tolerations") == expected


GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (None, None),
        # the template's tolerations stay as written, one for the GPU key included
        (
            {"spec": {"tolerations": [{"key": "pool", "operator": "Exists"}]}},
            [{"key": "pool", "operator": "Exists"}],
        ),
        (
            {"spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "h100"}]}},
            [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "h100"}],
        ),
    ],
)
def test_gpu_toleration_false_adds_no_gpu_toleration(template: dict[str, Any] | None, expected: Any) -> None:
    spec = {
        "model": {"path": "m"},
        "engine": "sglang",
        "prefill": {"gpus": 1, "gpuToleration": False, "podTemplate": template},
        "decode": {"gpus": 1},
    }
    objs = _by_key(render_children(Owner(name="m1", namespace="ns1", uid=UID), parse_spec(spec)))
    assert _pod(objs, "prefill").get("tolerations") == expected
    assert _pod(objs, "decode")["tolerations"] == [GPU_TOLERATION], "a role's own choice"


@pytest.mark.parametrize("wanted", [True, False])
def test_gpu_toleration_reaches_every_group_of_a_multi_node_role(wanted: bool) -> None:
    prefill = {"replicas": 2, "nodesPerReplica": 2, "gpus": 8, "tensorParallel": 16, "gpuToleration": wanted}
    spec = {"model": {"path": "m"}, "engine": "sglang", "prefill": prefill, "decode": {"replicas": 0}}
    objs = render_children(Owner(name="m1", namespace="ns1", uid=UID), parse_spec(spec))
    groups = [
        o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"].startswith("m1-prefill-")
    ]
    assert len(groups) == 2
    for group in groups:
        assert group["spec"]["template"]["spec"].get("tolerations") == ([GPU_TOLERATION] if wanted else None)


def test_the_worker_key_is_mounted_into_the_router_and_every_worker_and_required_by_them() -> None:
    import click

    from pdwarden_runtime.cli import runtime

    for case in ("sglang-gpu", "groups-2-synthetic", "synthetic-basic"):
        objs = _by_key(_render(case))
        workloads = [o for o in objs.values() if o["kind"] in ("Deployment", "StatefulSet")]
        for obj in workloads:
            pod = obj["spec"]["template"]["spec"]
            [volume] = [v for v in pod["volumes"] if v["name"] == "worker-key"]
            assert volume["secret"]["secretName"] == KEY_SECRET
            assert volume["secret"]["defaultMode"] == 0o440
            mount = {m["name"]: m for m in _container(obj)["volumeMounts"]}["worker-key"]
            assert mount == {
                "name": "worker-key",
                "mountPath": "/var/run/pdwarden/worker-key",
                "readOnly": True,
            }
            cmd = _container(obj)["command"]
            assert cmd[cmd.index("--worker-key-file") + 1] == "/var/run/pdwarden/worker-key/key"
            assert not any("Bearer" in str(e) for e in _container(obj).get("env", [])), (
                "never in the environment"
            )
        # the runtime's CLI parses the router's command up to smg's own arguments
        gate = _container(objs[("Deployment", "m1-router")])["command"]
        sub = runtime.get_command(click.Context(runtime), gate[2])
        assert sub is not None
        parsed = sub.make_context("router", [a.replace("$(POD_IP)", "198.18.0.9") for a in gate[3:]])
        assert parsed.params["router_port"] == 28000 and parsed.params["port"] == 8000
        assert parsed.params["router_args"][:3] == ("python", "-m", "smg.launch_router")
        # smg routes by model under discovery: the gate names the served name where a body has none
        served = CASES[case][0]["model"].get("servedName", "m1")
        assert parsed.params["served_model_name"] == served


def test_without_the_worker_key_nothing_mounts_it_and_smg_still_listens_behind_the_gate() -> None:
    spec = {**CASES["synthetic-basic"][0], "workerKey": {"enabled": False}}
    objs = _by_key(render_children(Owner(name="m1", namespace="ns1", uid=UID), parse_spec(spec)))
    router = objs[("Deployment", "m1-router")]
    cmd = _container(router)["command"]
    gate, smg = cmd[: cmd.index("--")], cmd[cmd.index("--") + 1 :]
    # the gate on the pod's address keeps smg's control plane from clients, key or no key
    assert gate[:3] == ["pdwarden", "runtime", "router"]
    assert gate[gate.index("--host") + 1] == "$(POD_IP)" and gate[gate.index("--port") + 1] == "8000"
    assert smg[:3] == ["python", "-m", "smg.launch_router"]
    assert smg[smg.index("--host") + 1] == "127.0.0.1"
    for obj in objs.values():
        if obj["kind"] in ("Deployment", "StatefulSet"):
            assert all(v["name"] != "worker-key" for v in obj["spec"]["template"]["spec"]["volumes"])
            assert "--worker-key-file" not in _container(obj)["command"]


def test_a_model_whose_secret_is_not_known_yet_renders_with_the_stand_in() -> None:
    objs = _by_key(
        render_children(Owner(name="m1", namespace="ns1", uid=UID), parse_spec(CASES["synthetic-basic"][0]))
    )
    pod = objs[("Deployment", "m1-decode")]["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "worker-key"]
    assert volume["secret"]["secretName"] == "m1-worker-key-pending"

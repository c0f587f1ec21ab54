"""Pure logic of the process kubelet's isolation: back-off, refusals, securityContext, volumes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pdwarden_localcluster.kubelet import cgroups, envvars, refusal, security, volumes
from pdwarden_localcluster.kubelet.backoff import BackOff

pytestmark = pytest.mark.unit


def _pod(containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {"containers": containers, **spec},
    }


def test_back_off_doubles_from_10s_to_a_300s_cap_and_resets_after_10_minutes_of_running() -> None:
    b = BackOff()
    delays, count = [], 0
    for _ in range(8):
        delay, count = b.next(count, ran_for=1.0)
        delays.append(delay)
    assert delays == [10, 20, 40, 80, 160, 300, 300, 300]
    assert b.next(count, ran_for=601.0) == (10, 1)


def _c(**fields: Any) -> dict[str, Any]:
    return {"containers": [{"name": "c", **fields}]}


def _v(volume: dict[str, Any]) -> dict[str, Any]:
    return {"containers": [{"name": "c"}], "volumes": [{"name": "v", **volume}]}


C0 = "spec.containers[0]"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (_c(ports=[{"containerPort": 80, "hostPort": 8080}]), f"{C0}.ports[0].hostPort"),
        (_c(readinessProbe={"grpc": {"port": 9}}), f"{C0}.readinessProbe.grpc"),
        (_v({"nfs": {"server": "x"}}), "spec.volumes[0].nfs"),
        (_v({"emptyDir": {"medium": "HugePages"}}), "spec.volumes[0].emptyDir.medium"),
        (_c(securityContext={"privileged": True}), f"{C0}.securityContext.privileged"),
        (_c(securityContext={"seLinuxOptions": {"level": "s0"}}), f"{C0}.securityContext.seLinuxOptions"),
        (_c(lifecycle={"preStop": {"exec": {"command": ["x"]}}}), f"{C0}.lifecycle.preStop"),
        (
            _c(volumeMounts=[{"name": "v", "mountPath": "/x", "subPathExpr": "$(A)"}]),
            f"{C0}.volumeMounts[0].subPathExpr",
        ),
    ],
)
def test_what_the_kubelet_cannot_honour_is_refused_naming_the_field(spec: dict[str, Any], field: str) -> None:
    found = refusal.refusals({"spec": spec})
    assert [r.field for r in found] == [field]
    assert str(found[0]).startswith(field + ": ")


def test_what_the_kubelet_honours_is_not_refused() -> None:
    pod = _pod(
        [
            {
                "name": "c",
                "ports": [{"containerPort": 80, "hostPort": 80}],
                "readinessProbe": {"httpGet": {"port": 80}},
                "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm", "subPath": "a"}],
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "privileged": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
                },
            }
        ],
        hostNetwork=True,
        securityContext={
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        volumes=[
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
            {"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
            {"name": "m", "persistentVolumeClaim": {"claimName": "w", "readOnly": True}},
        ],
    )
    assert refusal.refusals(pod) == []


def test_security_context_merges_pod_defaults_and_keeps_only_what_is_asked() -> None:
    pod = _pod([], securityContext={"runAsUser": 1000, "runAsGroup": 2000, "fsGroup": 3000})
    container = {
        "securityContext": {
            "runAsUser": 1001,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["CAP_IPC_LOCK"]},
        }
    }
    sec = security.effective(pod, container, "spec.containers[0]")
    assert (sec.uid, sec.gid, sec.groups) == (1001, 2000, (3000,))
    assert sec.caps == ("IPC_LOCK",) and sec.no_new_privs and not sec.read_only_root
    default = security.effective(_pod([]), {}, "spec.containers[0]")
    assert default.uid == 0 and set(default.caps) == security.DEFAULT_CAPS and not default.no_new_privs
    dropped = security.effective(_pod([]), {"securityContext": {"capabilities": {"drop": ["NET_RAW"]}}}, "c")
    assert "NET_RAW" not in dropped.caps and "CHOWN" in dropped.caps


@pytest.mark.parametrize("ctx", [{"runAsNonRoot": True}, {"runAsNonRoot": True, "runAsUser": 0}])
def test_run_as_non_root_refuses_a_root_user(ctx: dict[str, Any]) -> None:
    with pytest.raises(security.SecurityError, match="runAsNonRoot and image will run as root"):
        security.effective(_pod([], securityContext=ctx), {}, "spec.containers[0]")


def test_an_unknown_capability_is_an_error_naming_the_field() -> None:
    c = {"securityContext": {"capabilities": {"add": ["FLY"]}}}
    with pytest.raises(
        security.SecurityError, match=r"spec.containers\[0\].securityContext.capabilities.add"
    ):
        security.effective(_pod([]), c, "spec.containers[0]")


def test_mount_plan_binds_each_mount_read_only_where_asked_or_by_kind() -> None:
    vols = [
        {"name": "tmp", "emptyDir": {}},
        {"name": "cfg", "configMap": {"name": "x"}},
        {"name": "w", "persistentVolumeClaim": {"claimName": "w", "readOnly": True}},
        {"name": "h", "hostPath": {"path": "/data"}},
    ]
    sources = {"tmp": "/s/tmp", "cfg": "/s/cfg", "w": "/pv", "h": "/data"}
    container = {
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "cfg", "mountPath": "/etc/app"},
            {"name": "w", "mountPath": "/models"},
            {"name": "h", "mountPath": "/in", "subPath": "sub/dir", "readOnly": True},
        ]
    }
    plan = volumes.mount_plan(container, vols, sources, "spec.containers[0]")
    assert [(m.source, m.target, m.read_only) for m in plan] == [
        ("/s/tmp", "/tmp", False),
        ("/s/cfg", "/etc/app", True),
        ("/pv", "/models", True),
        ("/data/sub/dir", "/in", True),
    ]
    bad = {"volumeMounts": [{"name": "h", "mountPath": "/x", "subPath": "../etc"}]}
    with pytest.raises(ValueError, match=r"spec.containers\[0\].volumeMounts\[0\].subPath"):
        volumes.mount_plan(bad, vols, sources, "spec.containers[0]")


def test_atomic_writer_swaps_data_whole_and_drops_removed_keys(tmp_path: Path) -> None:
    d = tmp_path / "v"
    assert volumes.write_atomic(d, {"a": (b"1", 0o644), "b": (b"2", 0o600)}, None)
    assert (d / "a").read_text() == "1" and (d / "..data").is_symlink()
    assert not volumes.write_atomic(d, {"a": (b"1", 0o644), "b": (b"2", 0o600)}, None)
    assert volumes.write_atomic(d, {"a": (b"3", 0o644)}, None)
    assert (d / "a").read_text() == "3" and not (d / "b").exists()
    assert os.stat(d / "a").st_mode & 0o777 == 0o644
    assert len([c for c in d.iterdir() if c.name.startswith("..") and c.name != "..data"]) == 1


def test_quantities_and_limits() -> None:
    assert cgroups.quantity("64Mi") == 64 * 2**20 and cgroups.quantity("500m") == 0.5
    limits = cgroups.Limits.of({"resources": {"limits": {"memory": "1Gi", "cpu": "250m"}}})
    assert limits == cgroups.Limits(memory_bytes=2**30, cpu_millis=250)
    assert cgroups.Limits.of({}) == cgroups.Limits(None, None)
    with pytest.raises(ValueError, match="not a quantity"):
        cgroups.quantity("lots")


def test_service_env_points_at_the_api_server_as_pods_reach_it() -> None:
    env = envvars.service_env("https://198.18.0.1:40106")
    assert env["KUBERNETES_SERVICE_HOST"] == "198.18.0.1" and env["KUBERNETES_SERVICE_PORT"] == "40106"


def test_a_mounted_configmap_follows_its_object_as_a_kubelet_syncs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running pod's configMap volume is rewritten when the object changes (every
    REFRESH_S), an optional one that appears later included; the worker's set-up call on every
    step must not keep postponing that."""
    objects: dict[str, Any] = {}
    pod = _pod([{"name": "c"}], volumes=[{"name": "cfg", "configMap": {"name": "cm", "optional": True}}])
    ctx = envvars.PodContext(pod, "198.18.0.9", "127.0.0.1", "node-0")
    vols = volumes.PodVolumes(tmp_path, objects.get, lambda path, body: {}, ctx)
    clock = [1000.0]
    monkeypatch.setattr(volumes.time, "monotonic", lambda: clock[0])
    vols.prepare()
    source = Path(vols.sources["cfg"])
    assert not (source / "k").exists()  # optional and absent: an empty volume
    objects["/api/v1/namespaces/ns/configmaps/cm"] = {"data": {"k": "v1"}}
    for _ in range(10):  # the worker's steps: set-up and refresh each time
        clock[0] += volumes.REFRESH_S / 5
        vols.prepare()
        vols.refresh()
    assert (source / "k").read_text() == "v1"
    objects["/api/v1/namespaces/ns/configmaps/cm"] = {"data": {"k": "v2"}}
    clock[0] += volumes.REFRESH_S + 1
    vols.prepare()
    vols.refresh()
    assert (source / "k").read_text() == "v2"

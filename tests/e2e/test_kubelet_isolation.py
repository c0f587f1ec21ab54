"""The process kubelet isolates a pod as a node would: its volumes at their mount paths in a
mount namespace of its own, securityContext, memory limits through cgroups, the service
account's token, and a loud refusal of what it cannot honour."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.kubectl import Kubectl

from .test_localcluster import cluster_logs, container_status, pod, pod_phase

pytestmark = pytest.mark.e2e


def python(name: str, script: str, *args: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "x", "command": ["python", "-c", script, *args], **extra}


def finished(kubectl: Kubectl, ns: str, name: str) -> str:
    wait_for(lambda: pod_phase(kubectl, ns, name) in ("Succeeded", "Failed"), 90, f"{name} to finish")
    return pod_phase(kubectl, ns, name)


def report(name: str, ns: str) -> dict[str, Any]:
    line = next(ln for ln in cluster_logs(name, ns).splitlines() if ln.startswith("{"))
    return dict(json.loads(line))


WRITE_PROBE = """
import json, os, sys
out = {"uid": os.getuid()}
for path in sys.argv[1:]:
    try:
        with open(path, "w") as f:
            f.write("x")
        out[path] = "written"
    except OSError as exc:
        out[path] = exc.strerror
out["data"] = open("/data/weights.txt").read() if os.path.exists("/data/weights.txt") else None
print(json.dumps(out))
"""


def test_a_read_only_root_refuses_writes_but_its_volumes_take_them(kubectl: Kubectl, namespace: str) -> None:
    ctx = {
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    on_root = f"/var/pdwarden-{namespace}"
    mounts = [{"name": "tmp", "mountPath": "/tmp"}]
    container = python("c", WRITE_PROBE, "/tmp/ok", on_root, securityContext=ctx, volumeMounts=mounts)
    spec = {
        "restartPolicy": "Never",
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000},
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}}],
    }
    kubectl.apply(pod("rofs", [container], **spec), namespace)
    assert finished(kubectl, namespace, "rofs") == "Succeeded"
    seen = report("rofs", namespace)
    assert seen["uid"] == 1000
    assert seen["/tmp/ok"] == "written"
    assert seen[on_root] == "Read-only file system"
    assert not Path(on_root).exists()


def test_a_persistent_volume_of_files_is_mounted_read_only_where_asked(
    kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    weights = tmp_path / "pv"
    weights.mkdir()
    (weights / "weights.txt").write_text("w1")
    storage_class = f"{namespace}-manual"
    pv: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{namespace}-weights"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": storage_class,
            "hostPath": {"path": str(weights), "type": "Directory"},
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "weights"},
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": storage_class,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    kubectl.apply(pv, None)
    try:
        kubectl.apply(pvc, namespace)
        mounts = [{"name": "w", "mountPath": "/data", "readOnly": True}, {"name": "tmp", "mountPath": "/tmp"}]
        spec = {
            "restartPolicy": "Never",
            "volumes": [
                {"name": "w", "persistentVolumeClaim": {"claimName": "weights"}},
                {"name": "tmp", "emptyDir": {}},
            ],
        }
        kubectl.apply(
            pod("reader", [python("c", WRITE_PROBE, "/data/new", volumeMounts=mounts)], **spec), namespace
        )
        assert finished(kubectl, namespace, "reader") == "Succeeded"
        seen = report("reader", namespace)
        assert seen["data"] == "w1"
        assert seen["/data/new"] == "Read-only file system"
        assert not (weights / "new").exists()
    finally:
        kubectl("delete", "pod", "reader", "-n", namespace, "--wait=true", check=False)
        kubectl("delete", "persistentvolume", pv["metadata"]["name"], "--wait=false", check=False)


FILES_PROBE = """
import json, os, urllib.request, ssl
sa = "/var/run/secrets/kubernetes.io/serviceaccount/"
out = {
    "mode": open("/etc/app/mode").read(),
    "password": open("/etc/creds/password").read(),
    "name": open("/etc/podinfo/name").read(),
    "namespace": open(sa + "namespace").read(),
    "projected": sorted(n for n in os.listdir("/var/run/aud") if not n.startswith("..")),
}
body = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode()
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
req = urllib.request.Request(
    f"https://{host}:{port}/apis/authentication.k8s.io/v1/selfsubjectreviews", data=body,
    headers={"Authorization": "Bearer " + open(sa + "token").read(), "Content-Type": "application/json"},
)
ctx = ssl.create_default_context(cafile=sa + "ca.crt")
with urllib.request.urlopen(req, context=ctx) as resp:
    out["user"] = json.load(resp)["status"]["userInfo"]["username"]
print(json.dumps(out))
"""


def test_configmap_secret_downward_api_and_the_service_account_token_are_mounted(
    kubectl: Kubectl, namespace: str
) -> None:
    kubectl("create", "configmap", "app", "--from-literal=mode=fast", "-n", namespace)
    kubectl("create", "secret", "generic", "creds", "--from-literal=password=s3cret", "-n", namespace)
    mounts = [
        {"name": "app", "mountPath": "/etc/app"},
        {"name": "creds", "mountPath": "/etc/creds"},
        {"name": "podinfo", "mountPath": "/etc/podinfo"},
        {"name": "aud", "mountPath": "/var/run/aud"},
    ]
    spec = {
        "restartPolicy": "Never",
        "volumes": [
            {"name": "app", "configMap": {"name": "app"}},
            {"name": "creds", "secret": {"secretName": "creds", "defaultMode": 0o400}},
            {
                "name": "podinfo",
                "downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]},
            },
            {
                "name": "aud",
                "projected": {
                    "sources": [
                        {"serviceAccountToken": {"path": "vault-token", "audience": "vault"}},
                        {"configMap": {"name": "app", "items": [{"key": "mode", "path": "conf/mode"}]}},
                    ]
                },
            },
        ],
    }
    kubectl.apply(pod("files", [python("c", FILES_PROBE, volumeMounts=mounts)], **spec), namespace)
    assert finished(kubectl, namespace, "files") == "Succeeded", cluster_logs("files", namespace)
    seen = report("files", namespace)
    assert (seen["mode"], seen["password"], seen["name"]) == ("fast", "s3cret", "files")
    assert seen["namespace"] == namespace
    assert seen["projected"] == ["conf", "vault-token"]
    # the mounted token authenticates the pod as its ServiceAccount, with no kubeconfig anywhere
    assert seen["user"] == f"system:serviceaccount:{namespace}:default"


def test_a_container_over_its_memory_limit_is_oom_killed_and_restarted_with_back_off(
    kubectl: Kubectl, namespace: str
) -> None:
    hog = python(
        "hog",
        "import time\nprint('allocating', flush=True)\nblob = bytearray(256 * 2**20)\ntime.sleep(60)",
        resources={"limits": {"memory": "64Mi"}, "requests": {"memory": "64Mi"}},
    )
    kubectl.apply(pod("hog", [hog]), namespace)
    status = wait_for(
        lambda: (s := container_status(kubectl, namespace, "hog")) and s["restartCount"] >= 1 and s,
        120,
        "the container to be restarted once",
    )
    last = status["lastState"]["terminated"]
    assert (last["reason"], last["exitCode"]) == ("OOMKilled", 137)
    waiting = wait_for(
        lambda: ((container_status(kubectl, namespace, "hog") or {}).get("state") or {}).get("waiting"),
        120,
        "the container to wait in back-off",
    )
    assert waiting["reason"] == "CrashLoopBackOff" and "back-off" in waiting["message"]


def _events(kubectl: Kubectl, ns: str, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in kubectl.items("events", ns)
        if (e.get("involvedObject") or {}).get("name") == name and e.get("type") == "Warning"
    ]


@pytest.mark.parametrize(
    ("name", "extra", "field"),
    [
        (
            "hostport",
            {"ports": [{"containerPort": 8080, "hostPort": 18080}]},
            "spec.containers[0].ports[0].hostPort",
        ),
        ("grpc", {"livenessProbe": {"grpc": {"port": 9000}}}, "spec.containers[0].livenessProbe.grpc"),
    ],
)
def test_an_unsupported_feature_fails_loudly_naming_the_field(
    kubectl: Kubectl, namespace: str, name: str, extra: dict[str, Any], field: str
) -> None:
    kubectl.apply(pod(name, [python("c", "print('ran')", **extra)]), namespace)
    waiting = wait_for(
        lambda: (
            (w := ((container_status(kubectl, namespace, name) or {}).get("state") or {}).get("waiting"))
            and w.get("reason") == "CreateContainerConfigError"
            and w
        ),
        60,
        "CreateContainerConfigError",
    )
    assert field in waiting["message"]
    event = wait_for(lambda: _events(kubectl, namespace, name), 60, "a Warning event")[0]
    assert event["reason"] == "Failed" and field in event["message"]
    status = container_status(kubectl, namespace, name) or {}
    assert "containerID" not in status and not status.get("lastState")  # it never ran


def test_run_as_non_root_refuses_a_container_that_would_run_as_root(kubectl: Kubectl, namespace: str) -> None:
    spec = {"securityContext": {"runAsNonRoot": True}}
    kubectl.apply(pod("rooty", [python("c", "print('ran')")], **spec), namespace)
    waiting = wait_for(
        lambda: (
            (w := ((container_status(kubectl, namespace, "rooty") or {}).get("state") or {}).get("waiting"))
            and w.get("reason") == "CreateContainerConfigError"
            and w
        ),
        60,
        "CreateContainerConfigError",
    )
    assert "runAsNonRoot and image will run as root" in waiting["message"]


SHM_PROBE = """
import json
fs = {ln.split()[4]: ln.split(" - ")[1].split()[0] for ln in open("/proc/self/mountinfo")}
out = {"fs": fs.get("/dev/shm")}
try:
    with open("/dev/shm/blob", "wb") as f:
        f.write(b"x" * (4 * 2**20))
    out["write"] = "written"
except OSError as exc:
    out["write"] = exc.strerror
print(json.dumps(out))
"""


def test_a_memory_empty_dir_is_a_tmpfs_of_its_size_limit(kubectl: Kubectl, namespace: str) -> None:
    spec = {
        "restartPolicy": "Never",
        "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}],
    }
    mounts = [{"name": "shm", "mountPath": "/dev/shm"}]
    kubectl.apply(pod("shm", [python("c", SHM_PROBE, volumeMounts=mounts)], **spec), namespace)
    assert finished(kubectl, namespace, "shm") == "Succeeded"
    seen = report("shm", namespace)
    assert seen == {"fs": "tmpfs", "write": "No space left on device"}


KEYCTL_PROBE = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
# keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0): needs no capability, and a
# runtime's default seccomp profile refuses it
ret = libc.syscall(250, 0, -3, 0)
print(json.dumps({"keyctl": "allowed" if ret >= 0 else os.strerror(ctypes.get_errno())}))
"""


@pytest.mark.parametrize(
    ("profile", "seen"), [("RuntimeDefault", "Operation not permitted"), ("Unconfined", "allowed")]
)
def test_seccomp_runtime_default_refuses_what_a_runtime_refuses(
    kubectl: Kubectl, namespace: str, profile: str, seen: str
) -> None:
    name = f"seccomp-{profile.lower()}"
    spec = {"restartPolicy": "Never", "securityContext": {"seccompProfile": {"type": profile}}}
    kubectl.apply(pod(name, [python("c", KEYCTL_PROBE)], **spec), namespace)
    assert finished(kubectl, namespace, name) == "Succeeded", cluster_logs(name, namespace)
    assert report(name, namespace)["keyctl"] == seen


FILL_PROBE = """
import time
with open("/scratch/blob", "wb") as f:
    f.write(b"x" * (3 * 2**20))
    f.flush()
time.sleep(3600)  # a kubelet's eviction, not this process, ends it
"""


def test_a_disk_empty_dir_over_its_size_limit_gets_the_pod_evicted(kubectl: Kubectl, namespace: str) -> None:
    spec = {"volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}]}
    mounts = [{"name": "scratch", "mountPath": "/scratch"}]
    kubectl.apply(pod("filler", [python("c", FILL_PROBE, volumeMounts=mounts)], **spec), namespace)
    wait_for(lambda: pod_phase(kubectl, namespace, "filler") == "Failed", 120, "the pod evicted")
    status = (kubectl.get("pod", "filler", namespace) or {})["status"]
    assert status["reason"] == "Evicted"
    assert status["message"].startswith('Usage of EmptyDir volume "scratch" exceeds the limit "1Mi"')
    events = kubectl("get", "events", "-n", namespace, "--field-selector", "involvedObject.name=filler")
    assert "Evicted" in events.stdout

"""The embedded local cluster, end to end: real apiserver, controllers, scheduler and the
process kubelet running real processes."""

from __future__ import annotations

import ipaddress
import json
import signal
import subprocess
import sys
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from pdwarden_localcluster import build, reserved_ports
from pdwarden_localcluster.cluster import ClusterInfo, admin_api, ports
from pdwarden_localcluster.waits import pod_ready, wait_for
from pdwarden_testkit.kubectl import Kubectl
from tests.support.kube_objects import deployment

pytestmark = pytest.mark.e2e

PDWARDEN = str(Path(sys.executable).parent / "pdwarden")


def http_server_container(name: str = "web", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": "python:3.11-slim",
        "command": ["python", "-m", "http.server", "8080", "--bind", "$(POD_IP)"],
        "ports": [{"name": "http", "containerPort": 8080}],
        **extra,
    }


def pod(name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"test": name}},
        "spec": {"terminationGracePeriodSeconds": 5, "containers": containers, **spec},
    }


def answers_http(ip: str, port: int = 8080) -> bool:
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/", timeout=10) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def ready_pods(kubectl: Kubectl, ns: str, selector: str, count: int) -> list[dict[str, Any]] | None:
    pods = [p for p in kubectl.items("pods", ns, selector) if not p["metadata"].get("deletionTimestamp")]
    ready = [p for p in pods if pod_ready(p)]
    return ready if len(ready) == count and len(pods) == count else None


def container_status(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any] | None:
    obj = kubectl.get("pod", name, ns)
    statuses = ((obj or {}).get("status") or {}).get("containerStatuses") or []
    return statuses[0] if statuses else None


def pod_phase(kubectl: Kubectl, ns: str, name: str) -> str:
    obj = kubectl.get("pod", name, ns)
    return str(((obj or {}).get("status") or {}).get("phase", ""))


def cluster_logs(name: str, ns: str) -> str:
    return subprocess.run(
        [PDWARDEN, "cluster", "logs", name, "-n", ns], capture_output=True, text=True, timeout=30, check=True
    ).stdout


def test_deployment_replicas_run_ready_on_distinct_ips_and_answer_http(
    kubectl: Kubectl, namespace: str
) -> None:
    kubectl.apply(deployment("web", 2, http_server_container()), namespace)
    pods = wait_for(lambda: ready_pods(kubectl, namespace, "app=web", 2), 60, "2 Ready web pods")
    ips = [p["status"]["podIP"] for p in pods]
    assert len(set(ips)) == 2
    subnet = ipaddress.ip_network(ports().net.node_subnet(0))
    for ip in ips:
        assert ipaddress.ip_address(ip) in subnet
        wait_for(partial(answers_http, ip), 30, f"HTTP from {ip}")
    assert {p["spec"]["nodeName"] for p in pods} == {"pdwarden-node-0"}
    assert all(p["status"]["phase"] == "Running" for p in pods)


def test_a_deleted_pod_is_replaced_and_its_process_stops(kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(deployment("web", 1, http_server_container()), namespace)
    (first,) = wait_for(lambda: ready_pods(kubectl, namespace, "app=web", 1), 60, "a Ready web pod")
    old_name, old_ip = first["metadata"]["name"], first["status"]["podIP"]
    kubectl("delete", "pod", old_name, "-n", namespace, "--wait=true", timeout=60)
    (second,) = wait_for(lambda: ready_pods(kubectl, namespace, "app=web", 1), 60, "a replacement pod")
    assert second["metadata"]["name"] != old_name
    wait_for(lambda: answers_http(second["status"]["podIP"]), 30, "HTTP from the replacement")
    assert not answers_http(old_ip)  # the deleted pod's server is gone


def test_deleting_the_deployment_garbage_collects_replicasets_and_pods(
    kubectl: Kubectl, namespace: str
) -> None:
    kubectl.apply(deployment("web", 2, http_server_container()), namespace)
    pods = wait_for(lambda: ready_pods(kubectl, namespace, "app=web", 2), 60, "2 Ready web pods")
    assert len(kubectl.items("replicasets", namespace)) == 1
    kubectl("delete", "deployment", "web", "-n", namespace)
    wait_for(
        lambda: not kubectl.items("replicasets", namespace) and not kubectl.items("pods", namespace),
        60,
        "garbage collection of the ReplicaSet and its pods",
    )
    assert not any(answers_http(p["status"]["podIP"]) for p in pods)


def test_readiness_follows_the_probe(kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    flag = tmp_path / "ready"
    probe = {"exec": {"command": ["test", "-f", str(flag)]}, "periodSeconds": 1, "failureThreshold": 1}
    kubectl.apply(pod("gated", [http_server_container(readinessProbe=probe)]), namespace)
    wait_for(lambda: pod_phase(kubectl, namespace, "gated") == "Running", 60, "the pod Running")
    # the container runs and is probed (several periods pass) but is not Ready without the file
    wait_for(lambda: (container_status(kubectl, namespace, "gated") or {}).get("started"), 30, "started")
    status = container_status(kubectl, namespace, "gated")
    assert status is not None and status["ready"] is False
    flag.write_text("ok")
    wait_for(
        lambda: pod_ready(kubectl.get("pod", "gated", namespace) or {}), 30, "Ready once the probe passes"
    )
    flag.unlink()
    wait_for(lambda: not pod_ready(kubectl.get("pod", "gated", namespace) or {}), 30, "not Ready again")
    assert (container_status(kubectl, namespace, "gated") or {}).get("restartCount") == 0


def test_a_failing_liveness_probe_restarts_the_container(kubectl: Kubectl, namespace: str) -> None:
    probe = {"httpGet": {"path": "/", "port": 8081}, "periodSeconds": 1, "failureThreshold": 1}
    kubectl.apply(pod("sick", [http_server_container(livenessProbe=probe)]), namespace)
    status = wait_for(
        lambda: (s := container_status(kubectl, namespace, "sick")) and s["restartCount"] >= 2 and s,
        90,
        "restartCount >= 2",
    )
    terminated = status["lastState"]["terminated"]
    assert terminated["exitCode"] == 128 + signal.SIGTERM  # killed by the kubelet's SIGTERM
    assert "Liveness probe failed" in terminated.get("message", "")


def test_a_missing_command_is_a_failed_container_with_start_error(kubectl: Kubectl, namespace: str) -> None:
    container = {"name": "bad", "image": "none", "command": ["pdwarden-no-such-binary", "--flag"]}
    kubectl.apply(pod("bad", [container], restartPolicy="Never"), namespace)
    wait_for(lambda: pod_phase(kubectl, namespace, "bad") == "Failed", 60, "the pod Failed")
    status = container_status(kubectl, namespace, "bad")
    assert status is not None
    terminated = status["state"]["terminated"]
    assert terminated["reason"] == "StartError"
    assert "pdwarden-no-such-binary" in terminated["message"]


def test_env_is_resolved_like_the_kubelet_does(kubectl: Kubectl, namespace: str) -> None:
    kubectl("create", "secret", "generic", "creds", "--from-literal=token=s3cret", "-n", namespace)
    kubectl("create", "configmap", "settings", "--from-literal=mode=fast", "-n", namespace)
    env = [
        {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "MY_LABEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['test']"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
        {"name": "COMBINED", "value": "$(MODE)-$(MY_NAME)"},
    ]
    names = [
        "MY_NAME",
        "MY_NS",
        "MY_IP",
        "POD_IP",
        "TOKEN",
        "MODE",
        "COMBINED",
        "MY_LABEL",
        "PATH",
        "KUBECONFIG",
        "KUBERNETES_SERVICE_HOST",
        "KUBERNETES_SERVICE_PORT",
    ]
    script = f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {names!r}}}))"
    container = {
        "name": "env",
        "image": "x",
        "command": ["python", "-c", script],
        "env": env,
        "workingDir": "/tmp",
    }
    kubectl.apply(pod("envpod", [container], restartPolicy="Never"), namespace)
    wait_for(lambda: pod_phase(kubectl, namespace, "envpod") == "Succeeded", 60, "the pod Succeeded")
    line = next(ln for ln in cluster_logs("envpod", namespace).splitlines() if ln.startswith("{"))
    seen = json.loads(line)
    ip = (kubectl.get("pod", "envpod", namespace) or {})["status"]["podIP"]
    assert seen["MY_NAME"] == "envpod" and seen["MY_NS"] == namespace and seen["MY_LABEL"] == "envpod"
    assert seen["MY_IP"] == seen["POD_IP"] == ip
    assert seen["TOKEN"] == "s3cret" and seen["MODE"] == "fast" and seen["COMBINED"] == "fast-envpod"
    assert seen["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    # in-cluster identity as on a cluster: the `kubernetes` Service's variables, no kubeconfig
    assert seen["KUBECONFIG"] is None
    assert seen["KUBERNETES_SERVICE_HOST"] and seen["KUBERNETES_SERVICE_PORT"].isdigit()


def test_deletion_sends_sigterm_before_killing(kubectl: Kubectl, namespace: str) -> None:
    script = (
        "import signal, sys, time\n"
        "def bye(*_):\n    print('got SIGTERM', flush=True); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\nprint('up', flush=True)\n"
        "while True: time.sleep(0.1)\n"
    )
    kubectl.apply(
        pod("graceful", [{"name": "main", "image": "x", "command": ["python", "-c", script]}]), namespace
    )
    wait_for(lambda: "up" in cluster_logs("graceful", namespace), 60, "the container to start")
    kubectl("delete", "pod", "graceful", "-n", namespace, "--wait=true", timeout=60)
    assert "got SIGTERM" in cluster_logs("graceful", namespace)


def test_rbac_applies_to_a_pods_service_account(kubectl: Kubectl, namespace: str) -> None:
    kubectl("create", "serviceaccount", "reader", "-n", namespace)
    lister = {"name": "list", "image": "x", "command": ["kubectl", "get", "pods", "-n", namespace]}
    kubectl.apply(pod("denied", [lister], restartPolicy="Never", serviceAccountName="reader"), namespace)
    wait_for(lambda: pod_phase(kubectl, namespace, "denied") == "Failed", 60, "kubectl in the pod to fail")
    assert "Forbidden" in cluster_logs("denied", namespace)
    assert f"system:serviceaccount:{namespace}:reader" in cluster_logs("denied", namespace)

    kubectl("create", "role", "pod-reader", "--verb=get,list", "--resource=pods", "-n", namespace)
    kubectl(
        "create",
        "rolebinding",
        "reader",
        "--role=pod-reader",
        f"--serviceaccount={namespace}:reader",
        "-n",
        namespace,
    )
    kubectl.apply(pod("allowed", [lister], restartPolicy="Never", serviceAccountName="reader"), namespace)
    wait_for(
        lambda: pod_phase(kubectl, namespace, "allowed") == "Succeeded", 60, "kubectl in the pod to succeed"
    )
    assert "denied" in cluster_logs("allowed", namespace)  # it listed the other pod


def test_kubectl_version_reports_the_pinned_server_version(kubectl: Kubectl, cluster: ClusterInfo) -> None:
    versions = json.loads(kubectl("version", "-o", "json").stdout)
    assert versions["serverVersion"]["gitVersion"] == build.kubernetes_version() == cluster.kubernetes_version
    assert versions["clientVersion"]["minor"] == "35"


def test_up_twice_is_harmless(cluster: ClusterInfo) -> None:
    proc = subprocess.run([PDWARDEN, "cluster", "up", "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["started"] is False and info["processes"] == cluster.processes | info["processes"]
    assert info["processes"]["kube-apiserver"] == cluster.processes["kube-apiserver"]
    # the `pdwarden` script's interpreter is the session's environment: the kubelet (and every
    # pod of the tests beside this one) keeps running
    assert info["processes"]["kubelet"] == cluster.processes["kubelet"]
    # no outgoing connection can take a port of the cluster's (a kubelet endpoint that cannot
    # bind fails every `kubectl logs` and `exec` on its node)
    assert set(ports().listening(len(info["nodes"]))) <= reserved_ports.reserved()


def test_cluster_build_finds_every_binary_in_the_cache(cluster: ClusterInfo) -> None:
    """What `make test` runs before pytest: after the session's cluster started, every binary is
    cached, so it builds nothing and names the directories the cluster runs from."""
    proc = subprocess.run(
        [sys.executable, "-m", "pdwarden_localcluster.build"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(build.bin_dir()), str(build.monitoring_bin_dir())]
    assert "go build" not in proc.stderr and "waiting for the build lock" not in proc.stderr
    assert build.is_built(build.bin_dir())
    assert build.coredns_binary().exists() and build.network_policies_binary().exists()


def test_kubectl_logs_shows_the_current_and_previous_run(
    kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran-once"
    script = (
        "import pathlib, sys, time\n"
        f"m = pathlib.Path({str(marker)!r})\n"
        "if not m.exists():\n    m.write_text('x'); print('first', flush=True); sys.exit(3)\n"
        "print('second', flush=True)\n"
        "while True: time.sleep(1)\n"
    )
    container = {"name": "crash", "image": "x", "command": ["python", "-c", script]}
    kubectl.apply(pod("crasher", [container], restartPolicy="OnFailure"), namespace)
    wait_for(
        lambda: kubectl("logs", "crasher", "-n", namespace, check=False).stdout == "second\n",
        180,  # two starts and the kubelet's back-off between them, on a busy machine
        "the second run's output from kubectl logs",
    )
    assert kubectl("logs", "crasher", "-n", namespace, "--previous").stdout == "first\n"
    status = container_status(kubectl, namespace, "crasher") or {}
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 3
    # exec reaches the running (second) container
    assert kubectl("exec", "crasher", "-n", namespace, "--", "echo", "inside").stdout == "inside\n"


def test_eviction_stops_the_pod_gracefully(kubectl: Kubectl, namespace: str) -> None:
    script = (
        "import signal, sys, time\n"
        "def bye(*_):\n    print('evicted politely', flush=True); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\nprint('up', flush=True)\n"
        "while True: time.sleep(0.1)\n"
    )
    kubectl.apply(
        pod("evictee", [{"name": "main", "image": "x", "command": ["python", "-c", script]}]), namespace
    )
    wait_for(lambda: "up" in cluster_logs("evictee", namespace), 60, "the container to start")
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "evictee", "namespace": namespace},
    }
    admin_api().post(f"/api/v1/namespaces/{namespace}/pods/evictee/eviction", eviction)
    wait_for(lambda: kubectl.get("pod", "evictee", namespace) is None, 60, "the evicted pod to be gone")
    assert "evicted politely" in cluster_logs("evictee", namespace)

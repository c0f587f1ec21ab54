"""The local cluster's network, end to end: pod namespaces, addresses, routes, Services."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import urllib.request
from typing import Any

import pytest

from pdwarden_localcluster import network
from pdwarden_localcluster.cluster import ClusterInfo, ports
from pdwarden_localcluster.waits import pod_ready, wait_for
from pdwarden_testkit.kubectl import Kubectl
from pdwarden_testkit.ports import free_port
from tests.support.kube_objects import deployment, http_server_script

pytestmark = pytest.mark.e2e

# a pod's own script: fetch a URL until it answers, print the answer's first line, then idle
FETCH = (
    "import sys, time, urllib.request\n"
    "while True:\n"
    "    try:\n"
    "        body = urllib.request.urlopen(sys.argv[1], timeout=3).read().decode()\n"
    "        print('FETCHED', body.splitlines()[0] if body else '', flush=True)\n"
    "        break\n"
    "    except OSError as exc:\n"
    "        print('retry', exc, flush=True)\n"
    "        time.sleep(0.5)\n"
    "time.sleep(3600)\n"
)
# answers GET with a line naming the pod (so a test sees which replica served it)
SERVE = http_server_script(8080, "('served-by ' + os.environ['POD_NAME'] + '\\n').encode()")
POD_NAME_ENV = {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}


def server(name: str = "web", bind: str = "0.0.0.0") -> dict[str, Any]:
    return {
        "name": name,
        "image": "python:3.11-slim",
        "command": ["python", "-c", SERVE],
        "env": [POD_NAME_ENV, {"name": "BIND", "value": bind}],
        "ports": [{"name": "http", "containerPort": 8080}],
        # the kubelet probes from the node: a server on the pod's loopback is checked from inside
        "readinessProbe": {"periodSeconds": 1}
        | (
            {
                "exec": {
                    "command": [
                        "python",
                        "-c",
                        "import socket; socket.create_connection(('127.0.0.1', 8080))",
                    ]
                }
            }
            if bind == "127.0.0.1"
            else {"tcpSocket": {"port": 8080}}
        ),
    }


def fetcher(url: str, name: str = "client") -> dict[str, Any]:
    return {"name": name, "image": "python:3.11-slim", "command": ["python", "-c", FETCH, url]}


def pod(
    name: str, containers: list[dict[str, Any]], labels: dict[str, str] | None = None, **spec: Any
) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"test": name}},
        "spec": {"terminationGracePeriodSeconds": 2, "containers": containers, **spec},
    }


def ready_pod(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any] | None:
    obj = kubectl.get("pod", name, ns)
    return obj if obj and pod_ready(obj) and obj["status"].get("podIP") else None


def fetched(kubectl: Kubectl, ns: str, name: str, container: str = "client") -> str | None:
    """The line a fetcher container printed once its request succeeded, if it has."""
    out = kubectl("logs", name, "-c", container, "-n", ns, check=False).stdout
    lines = [ln for ln in out.splitlines() if ln.startswith("FETCHED")]
    return lines[0].removeprefix("FETCHED ").strip() if lines else None


def test_the_host_blackholes_the_benchmarking_range_and_routes_the_cluster_through_its_link(
    cluster: ClusterInfo,
) -> None:
    net = ports().net
    assert network.blackhole_present()
    present = set(network.leftovers(net))
    assert {f"link {net.host_link}", f"route {net.pod_cidr}", f"route {net.service_cidr}"} <= present
    assert f"netns {net.gateway_netns}" in present


def test_pods_get_addresses_of_their_node_subnet_and_reach_each_other(
    kubectl: Kubectl, namespace: str
) -> None:
    kubectl.apply(pod("web", [server()]), namespace)
    web = wait_for(lambda: ready_pod(kubectl, namespace, "web"), 60, "the web pod Ready")
    ip = web["status"]["podIP"]
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(ports().net.node_subnet(0))
    kubectl.apply(pod("caller", [fetcher(f"http://{ip}:8080/")]), namespace)
    answer = wait_for(lambda: fetched(kubectl, namespace, "caller"), 60, "the caller's answer from web")
    assert answer == "served-by web"


def test_containers_of_a_pod_share_localhost_and_other_pods_do_not(kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(
        pod("pair", [server(bind="127.0.0.1"), fetcher("http://localhost:8080/", name="sidecar")]), namespace
    )
    wait_for(lambda: ready_pod(kubectl, namespace, "pair"), 60, "the pair pod Ready")
    answer = wait_for(lambda: fetched(kubectl, namespace, "pair", "sidecar"), 60, "the sidecar's answer")
    assert answer == "served-by pair"
    # another pod's localhost is its own: the server bound to loopback is not there
    kubectl.apply(pod("stranger", [fetcher("http://localhost:8080/")]), namespace)
    wait_for(
        lambda: "retry" in kubectl("logs", "stranger", "-n", namespace, check=False).stdout,
        60,
        "the stranger's failed attempt",
    )
    assert fetched(kubectl, namespace, "stranger") is None


def test_a_host_network_pod_keeps_the_node_address(kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(pod("hostnet", [fetcher("http://127.0.0.1:1/")], hostNetwork=True), namespace)
    obj = wait_for(lambda: ready_pod(kubectl, namespace, "hostnet"), 60, "the hostNetwork pod Ready")
    assert obj["status"]["podIP"] == obj["status"]["hostIP"]


def test_a_pod_reaches_the_api_server_with_its_service_account(kubectl: Kubectl, namespace: str) -> None:
    whoami = {
        "name": "whoami",
        "image": "bitnami/kubectl",
        "command": ["kubectl", "auth", "whoami", "-o", "json"],
    }
    kubectl.apply(pod("whoami", [whoami], restartPolicy="Never"), namespace)
    wait_for(
        lambda: (kubectl.get("pod", "whoami", namespace) or {}).get("status", {}).get("phase") == "Succeeded",
        60,
        "kubectl in the pod to finish",
    )
    review = json.loads(kubectl("logs", "whoami", "-n", namespace).stdout)
    assert review["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:default"


# --- Services, DNS, exec, port-forward --------------------------------------------------------


def service(name: str, port: int = 80, headless: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"app": name},
        "ports": [{"name": "http", "port": port, "targetPort": 8080}],
    }
    if headless:
        spec["clusterIP"] = "None"
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec}


def ready_endpoints(kubectl: Kubectl, ns: str, svc: str) -> set[str]:
    slices = kubectl.items("endpointslices", ns, f"kubernetes.io/service-name={svc}")
    return {
        addr
        for s in slices
        for ep in s.get("endpoints") or []
        if (ep.get("conditions") or {}).get("ready")
        for addr in ep.get("addresses") or []
    }


def get_text(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(resp.read().decode().strip())
    except OSError:
        return None


def served_by(url: str, tries: int) -> set[str]:
    """The replicas that answered `tries` requests (connections are not reused)."""
    return {text.removeprefix("served-by ") for _ in range(tries) if (text := get_text(url))}


def test_a_cluster_ip_service_routes_from_the_host_and_traffic_follows_scaling(
    kubectl: Kubectl, namespace: str
) -> None:
    kubectl.apply(deployment("web", 2, server(), grace_seconds=2), namespace)
    kubectl.apply(service("web"), namespace)
    pods = wait_for(lambda: ready_web_pods(kubectl, namespace, 2), 90, "2 Ready web pods")
    ips = {p["status"]["podIP"] for p in pods}
    wait_for(
        lambda: ready_endpoints(kubectl, namespace, "web") == ips, 60, "the EndpointSlice naming both pods"
    )
    svc = kubectl.json("get", "service", "web", "-n", namespace)
    cluster_ip = svc["spec"]["clusterIP"]
    assert ipaddress.ip_address(cluster_ip) in ipaddress.ip_network(ports().net.service_cidr)
    url = f"http://{cluster_ip}/"
    names = {p["metadata"]["name"] for p in pods}
    wait_for(lambda: served_by(url, 10) == names, 60, "both replicas answering through the ClusterIP")

    kubectl("scale", "deployment", "web", "--replicas=3", "-n", namespace)
    pods = wait_for(lambda: ready_web_pods(kubectl, namespace, 3), 90, "3 Ready web pods")
    names = {p["metadata"]["name"] for p in pods}
    wait_for(lambda: len(ready_endpoints(kubectl, namespace, "web")) == 3, 60, "3 endpoints")
    wait_for(lambda: served_by(url, 15) == names, 60, "all 3 replicas answering")

    kubectl("scale", "deployment", "web", "--replicas=1", "-n", namespace)
    (last,) = wait_for(lambda: ready_web_pods(kubectl, namespace, 1), 90, "1 web pod left")
    wait_for(
        lambda: ready_endpoints(kubectl, namespace, "web") == {last["status"]["podIP"]}, 60, "1 endpoint"
    )
    wait_for(lambda: served_by(url, 10) == {last["metadata"]["name"]}, 60, "only the last replica answering")


def ready_web_pods(kubectl: Kubectl, ns: str, count: int) -> list[dict[str, Any]] | None:
    pods = [p for p in kubectl.items("pods", ns, "app=web") if not p["metadata"].get("deletionTimestamp")]
    ready = [p for p in pods if pod_ready(p)]
    return ready if len(ready) == count == len(pods) else None


def test_pods_reach_a_service_by_its_dns_names(kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(deployment("web", 1, server(), grace_seconds=2), namespace)
    kubectl.apply(service("web"), namespace)
    wait_for(lambda: ready_web_pods(kubectl, namespace, 1), 90, "a Ready web pod")
    kubectl.apply(pod("short", [fetcher("http://web/")]), namespace)
    kubectl.apply(pod("qualified", [fetcher(f"http://web.{namespace}.svc/")]), namespace)
    for name in ("short", "qualified"):
        answer = wait_for(lambda n=name: fetched(kubectl, namespace, n), 90, f"{name}'s answer through DNS")  # type: ignore[misc]
        assert answer is not None and answer.startswith("served-by web-")


def test_a_headless_services_per_pod_name_resolves(kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(service("db", port=8080, headless=True), namespace)
    kubectl.apply(pod("db-0", [server()], labels={"app": "db"}, hostname="db-0", subdomain="db"), namespace)
    wait_for(lambda: ready_pod(kubectl, namespace, "db-0"), 60, "the db-0 pod Ready")
    kubectl.apply(pod("asker", [fetcher(f"http://db-0.db.{namespace}.svc.cluster.local:8080/")]), namespace)
    assert wait_for(lambda: fetched(kubectl, namespace, "asker"), 90, "the per-pod name answering") == (
        "served-by db-0"
    )


def test_kubectl_exec_runs_in_the_pods_namespaces_with_its_environment(
    kubectl: Kubectl, namespace: str
) -> None:
    kubectl.apply(pod("web", [server()]), namespace)
    obj = wait_for(lambda: ready_pod(kubectl, namespace, "web"), 60, "the web pod Ready")
    out = kubectl(
        "exec", "web", "-n", namespace, "--", "python", "-c", "import os; print(os.environ['POD_NAME'])"
    )
    assert out.stdout.strip() == "web"
    addrs = kubectl(
        "exec", "web", "-n", namespace, "--", "ip", "-o", "-4", "addr", "show", "dev", "eth0"
    ).stdout
    assert obj["status"]["podIP"] + "/" in addrs
    resolv = kubectl("exec", "web", "-n", namespace, "--", "cat", "/etc/resolv.conf").stdout
    assert f"nameserver {ports().net.dns_service_ip}" in resolv
    failed = kubectl("exec", "web", "-n", namespace, "--", "sh", "-c", "exit 3", check=False)
    assert failed.returncode == 3


def test_kubectl_port_forward_to_a_service_reaches_a_pod(kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(deployment("web", 1, server(), grace_seconds=2), namespace)
    kubectl.apply(service("web"), namespace)
    wait_for(lambda: ready_web_pods(kubectl, namespace, 1), 90, "a Ready web pod")
    local = free_port()
    proc = subprocess.Popen(
        [kubectl.exe, "port-forward", "svc/web", f"{local}:80", "-n", namespace, "--address", "127.0.0.1"],
        env=kubectl.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        answer = wait_for(
            lambda: get_text(f"http://127.0.0.1:{local}/"), 60, "an answer through port-forward"
        )
        assert answer.startswith("served-by web-")
    finally:
        proc.terminate()
        proc.wait(timeout=10)

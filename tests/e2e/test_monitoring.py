"""The local cluster's monitoring stack as a user's cluster runs it: prometheus-operator picks
up the chart's PodMonitor, ServiceMonitor and PrometheusRule; Prometheus scrapes a model's pods
through the model's own NetworkPolicy; a healthy run fires nothing, and a wedge reaches
Alertmanager with the wedged pod's labels."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

import pdwarden_contract as contract
from pdwarden_demo import chart, demo_scenario, demo_traffic
from pdwarden_demo.demo_kube import DemoCluster
from pdwarden_localcluster import monitoring
from pdwarden_localcluster.cluster import ClusterInfo
from pdwarden_localcluster.waits import WaitTimeout, serving, wait_for
from pdwarden_operator.render.meta import child_name
from pdwarden_testkit.kubectl import Kubectl

from .test_helm_install import helm, helm_install

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RELEASE = "pdwmon"
MODEL = "mon"
HEALTHY_S = 40.0  # longer than the rules' windows (20 s) plus a few evaluations
STEADY = demo_traffic.TrafficConfig(steady_clients=2, impatient_clients=0)
# the race needs an ABORT inside its window: clients that give up mid-transfer
IMPATIENT = demo_traffic.TrafficConfig(steady_clients=0, impatient_clients=2)


@pytest.fixture(scope="module")
def stack(cluster: ClusterInfo) -> monitoring.MonitoringInfo:
    return monitoring.ensure_monitoring(Path(cluster.kubeconfig), progress=lambda _m: None)


def prometheus(stack: monitoring.MonitoringInfo, path: str, **params: str) -> Any:
    resp = requests.get(f"{stack.prometheus_url}{path}", params=params, timeout=10)
    resp.raise_for_status()
    return resp.json()["data"]


def model_manifest(namespace: str) -> dict[str, Any]:
    m = demo_scenario.demo_manifest(yaml.safe_load(demo_scenario.EXAMPLE.read_text()), namespace)
    m["metadata"]["name"] = MODEL
    m["spec"]["model"] = {**m["spec"].get("model", {}), "servedName": MODEL}
    # the model's own NetworkPolicies (the default): Prometheus must get through them
    m["spec"].pop("networkPolicy")
    # the alert, not the operator, is what this test waits for: the watchdog waits longer
    m["spec"]["watchdog"]["stuckAfterSeconds"] = 120
    return m


class Traffic:
    """demo_traffic's clients through the router's Service, on a thread of their own."""

    def __init__(self, router_ip: str, cfg: demo_traffic.TrafficConfig) -> None:
        self.log = demo_traffic.TrafficLog()
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(
            target=self._loop.run_until_complete,
            args=(demo_traffic.run_traffic(router_ip, MODEL, cfg, self.log, self._stop),),
            daemon=True,
        )

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=60)


def inject_from_inside(kubectl: Kubectl, namespace: str, pod: dict[str, Any], key: str) -> None:
    """The fault, posted from inside the pod to its own address (the model's NetworkPolicy
    lets in the router and the model's own runtime pods, never the host), with the model's
    worker key (on by default: without it the pod answers 401), given by the caller (the local
    kubelet's exec does not enter the pod's mounts)."""
    url = f"http://{pod['status']['podIP']}:{contract.DEFAULT_HTTP_PORT}{contract.FAULT_PATH}"
    body = json.dumps({"fault": contract.FAULT_EMULATED_PORT_RACE})
    script = (
        "import sys, urllib.request as u; "
        f"r = u.urlopen(u.Request({url!r}, data={body!r}.encode(), "
        "headers={'Content-Type': 'application/json', 'Authorization': 'Bearer ' + sys.argv[1]}), "
        "timeout=10); print(r.status)"
    )
    name = pod["metadata"]["name"]
    out = kubectl("exec", "-n", namespace, name, "--", "python", "-c", script, key, timeout=60).stdout
    assert out.strip() == "200", out


@pytest.fixture
def installed(cluster: ClusterInfo, kubectl: Kubectl, namespace: str) -> Iterator[str]:
    kubeconfig = Path(cluster.kubeconfig)
    values = demo_scenario.chart_values("namespace")
    values["operator.watchNamespace"] = namespace
    values[f"podPolicy.namespaces.{namespace}"] = values.pop(
        f"podPolicy.namespaces.{demo_scenario.NAMESPACE}"
    )
    sets = [arg for k, v in values.items() for arg in ("--set", f"{k}={v}")]
    proc = helm_install(kubeconfig, "install", RELEASE, chart.CHART_DIR, namespace, *sets)
    assert proc.returncode == 0, proc.stderr
    try:
        yield namespace
    finally:
        kubectl("delete", "disaggregatedmodels", "--all", "-n", namespace, "--timeout=120s", check=False)
        helm(kubeconfig, "uninstall", RELEASE, "-n", namespace, "--wait", "--timeout", "120s")


def test_a_healthy_model_fires_nothing_and_a_wedge_reaches_alertmanager_with_the_pods_labels(
    stack: monitoring.MonitoringInfo, cluster: ClusterInfo, kubectl: Kubectl, installed: str
) -> None:
    namespace = installed
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(model_manifest(namespace)))

    def runtime_pods() -> list[dict[str, Any]] | None:
        found = kubectl.json("get", "pods", "-n", namespace, "-l", f"{contract.LABEL_MODEL}={MODEL}")["items"]
        runtime = [
            p for p in found if p["metadata"]["labels"].get(contract.LABEL_ROLE) in contract.RUNTIME_ROLES
        ]
        ready = [p for p in found if serving(p)]
        return runtime if len(runtime) == 4 and len(ready) == 5 else None

    pods = wait_for(runtime_pods, 300, "the model's 2 prefill, 2 decode and router pods Ready", 2.0)
    names = {p["metadata"]["name"] for p in pods}

    # The chart's PodMonitor: every runtime pod a target, up, through the model's NetworkPolicy;
    # its ServiceMonitor: the operator's metrics, through the operator's NetworkPolicy.
    # the namespace's targets as Prometheus last listed them: (pool, pod, health, last error)
    listed: list[tuple[str, str, str, str]] = []

    def targets_up() -> list[dict[str, Any]] | None:
        active = prometheus(stack, "/api/v1/targets", state="active")["activeTargets"]
        mine = [t for t in active if t["labels"].get("namespace") == namespace]
        listed[:] = [(t["scrapePool"], t["labels"].get("pod", ""), t["health"], t["lastError"]) for t in mine]
        ours = [t for t in mine if t["health"] == "up"]
        pods_up = {t["labels"].get("pod") for t in ours if t["scrapePool"].startswith("podMonitor/")}
        operator_up = [t for t in ours if t["scrapePool"].startswith("serviceMonitor/")]
        return ours if pods_up == names and operator_up else None

    try:
        scraped = wait_for(targets_up, 120, "Prometheus to scrape the 4 runtime pods and the operator", 2.0)
    except WaitTimeout as exc:  # name the slow link: no target yet (its configuration), or one down
        runtime = prometheus(stack, "/api/v1/status/runtimeinfo")
        raise AssertionError(
            f"{exc}; its targets in {namespace}: {listed}; its configuration last loaded "
            f"{runtime.get('lastConfigTime')} (reload ok: {runtime.get('reloadConfigSuccess')})"
        ) from exc
    assert {t["labels"]["model"] for t in scraped if t["scrapePool"].startswith("podMonitor/")} == {MODEL}
    groups = {g["name"] for g in prometheus(stack, "/api/v1/rules")["groups"]}
    assert "pdwarden.inflight" in groups, groups

    service = child_name(MODEL, contract.ROLE_ROUTER)
    router_ip = kubectl.json("get", "service", "-n", namespace, service)["spec"]["clusterIP"]
    wait_for(
        lambda: asyncio.run(demo_traffic.probe(router_ip, MODEL)), 120, "a request through the router", 2.0
    )

    seen = demo_scenario.AlertsSeen()
    with Traffic(router_ip, STEADY) as steady:
        # healthy: transfers complete and nothing is stuck, so Alertmanager holds nothing of
        # this namespace at any poll, and Prometheus has no alert of it pending either
        for _ in range(int(HEALTHY_S / 2)):
            seen.add(monitoring.alerts(stack.alertmanager_url, namespace=namespace))
            time.sleep(2.0)
        assert steady.log.counts()[demo_traffic.OK] > 0, steady.log.counts()
        assert seen.names() == [], seen.names()
        pending = [
            a
            for a in prometheus(stack, "/api/v1/alerts")["alerts"]
            if a["labels"].get("namespace") == namespace
        ]
        assert pending == [], pending

        prefills = [p for p in pods if p["metadata"]["labels"][contract.LABEL_ROLE] == contract.ROLE_PREFILL]
        pod = min(prefills, key=lambda p: p["metadata"]["name"])
        victim = pod["metadata"]["name"]
        key = DemoCluster(Path(cluster.kubeconfig)).worker_key(pod)
        assert key is not None, "the pod requires no worker key"
        inject_from_inside(kubectl, namespace, pod, key)
        with Traffic(router_ip, IMPATIENT):

            def wedge_alert() -> monitoring.Alert | None:
                found = monitoring.alerts(stack.alertmanager_url, namespace=namespace, pod=victim)
                return next((a for a in found if a.name in demo_scenario.INFLIGHT_ALERTS), None)

            fired = wait_for(wedge_alert, 180, f"an inflight alert for {victim} in Alertmanager", 1.0)
    assert fired.labels["namespace"] == namespace
    assert fired.labels["pod"] == victim
    assert fired.labels["role"] == contract.ROLE_PREFILL
    assert fired.labels["severity"] in ("critical", "warning")
    assert fired.annotations["runbook_url"].endswith("#" + fired.name.lower())

"""The local cluster's monitoring stack: prometheus-operator, Prometheus and Alertmanager.

`pdwarden cluster up --monitoring` (and `ensure_monitoring()`) installs what a real cluster's
kube-prometheus gives: the monitoring.coreos.com CRDs and prometheus-operator's RBAC from the
pinned Go module (its own example manifests), the operator as a Deployment in `monitoring`,
and one Prometheus and one Alertmanager that it turns into StatefulSets. Prometheus selects
every PodMonitor, ServiceMonitor and PrometheusRule in every namespace, so a chart's monitors
and rules are picked up as they would be on a real cluster. The images run as the binaries
the cluster carries (kubelet/images.py), all four built from Go modules (build.MONITORING_PARTS).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from pdwarden_localcluster import build, tools
from pdwarden_localcluster.errors import ClusterError
from pdwarden_localcluster.kubelet import images
from pdwarden_localcluster.waits import WaitTimeout, pod_ready, wait_for

JSON = dict[str, Any]
Progress = Callable[[str], None]

NAMESPACE = "monitoring"
NAME = "local"  # of the Prometheus and the Alertmanager (pods prometheus-local-0, alertmanager-local-0)
PROMETHEUS_SERVICE = "prometheus"
ALERTMANAGER_SERVICE = "alertmanager"
PROMETHEUS_PORT = 9090
ALERTMANAGER_PORT = 9093
# Short enough that a test or the demo sees an alert within seconds of its `for:`.
SCRAPE_INTERVAL = "5s"
EVALUATION_INTERVAL = "5s"
READY_TIMEOUT_S = 300.0
CRD_DIR = "example/prometheus-operator-crd"
OPERATOR_RBAC_DIR = "example/rbac/prometheus-operator"
PROMETHEUS_RBAC_DIR = "example/rbac/prometheus"
# The upstream manifests' kinds we take from those directories (their examples of a
# Prometheus and a ServiceMonitor are replaced by ours).
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service")


@dataclass(frozen=True)
class MonitoringInfo:
    prometheus_url: str
    alertmanager_url: str
    seconds: float

    def as_dict(self) -> JSON:
        return {
            "prometheus": self.prometheus_url,
            "alertmanager": self.alertmanager_url,
            "seconds": round(self.seconds, 1),
        }


def module_dir() -> Path:
    """The pinned prometheus-operator module's files (from the Go module cache)."""
    module = f"{build.MONITORING_MODULE}@{build.prometheus_operator_version()}"
    proc = subprocess.run(
        [build.go_binary(), "mod", "download", "-json", module],
        env=build.go_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    info = json.loads(proc.stdout or "{}")
    if proc.returncode != 0 or not info.get("Dir"):
        raise ClusterError(f"cannot download {module}: {info.get('Error') or proc.stderr.strip()[-300:]}")
    return Path(info["Dir"])


def _documents(directory: Path) -> Iterator[JSON]:
    for path in sorted(directory.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield doc


def operator_manifests(module: Path) -> list[JSON]:
    """prometheus-operator's own RBAC and Deployment (upstream's), in `monitoring`, its images
    the cluster's, and Prometheus' ServiceAccount and ClusterRole."""
    out: list[JSON] = []
    for directory in (OPERATOR_RBAC_DIR, PROMETHEUS_RBAC_DIR):
        for doc in _documents(module / directory):
            if doc.get("kind") not in RBAC_KINDS:
                continue
            if doc["kind"] in ("ServiceAccount", "Deployment", "Service"):
                doc["metadata"]["namespace"] = NAMESPACE
            for subject in doc.get("subjects") or []:
                subject["namespace"] = NAMESPACE
            if doc["kind"] == "Deployment":
                _point_operator_at_cluster_images(doc)
            out.append(doc)
    return out


def _point_operator_at_cluster_images(deployment: JSON) -> None:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    container["image"] = images.reference(images.PROMETHEUS_OPERATOR_IMAGE)
    # no kubelet Service to keep (the local kubelet serves no /metrics/cadvisor); the config
    # reloader at the cluster's own tag
    container["args"] = [
        f"--prometheus-config-reloader={images.reference(images.CONFIG_RELOADER_IMAGE)}",
        f"--prometheus-default-base-image={images.PROMETHEUS_IMAGE.repository}",
        f"--alertmanager-default-base-image={images.ALERTMANAGER_IMAGE.repository}",
    ]


def stack_manifests() -> list[JSON]:
    """The Prometheus and Alertmanager, and a Service for each at its usual port."""
    labels = {"app.kubernetes.io/part-of": "pdwarden-local-monitoring"}
    everything: JSON = {}
    prometheus: JSON = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "Prometheus",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "version": images.PROMETHEUS_IMAGE.version(),
            "image": images.reference(images.PROMETHEUS_IMAGE),
            "replicas": 1,
            "serviceAccountName": "prometheus",
            # every monitor and rule in every namespace, as a cluster-wide kube-prometheus
            "podMonitorSelector": everything,
            "podMonitorNamespaceSelector": everything,
            "serviceMonitorSelector": everything,
            "serviceMonitorNamespaceSelector": everything,
            "ruleSelector": everything,
            "ruleNamespaceSelector": everything,
            "scrapeInterval": SCRAPE_INTERVAL,
            "evaluationInterval": EVALUATION_INTERVAL,
            "retention": "6h",
            "alerting": {
                "alertmanagers": [
                    {"namespace": NAMESPACE, "name": ALERTMANAGER_SERVICE, "port": "web", "apiVersion": "v2"}
                ]
            },
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
        },
    }
    alertmanager: JSON = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "Alertmanager",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "version": images.ALERTMANAGER_IMAGE.version(),
            "image": images.reference(images.ALERTMANAGER_IMAGE),
            "replicas": 1,
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
        },
    }
    return [
        prometheus,
        alertmanager,
        _service(PROMETHEUS_SERVICE, {"prometheus": NAME}, PROMETHEUS_PORT, labels),
        _service(ALERTMANAGER_SERVICE, {"alertmanager": NAME}, ALERTMANAGER_PORT, labels),
    ]


def _service(name: str, selector: dict[str, str], port: int, labels: dict[str, str]) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "selector": selector,
            "ports": [{"name": "web", "port": port, "targetPort": "web"}],
        },
    }


def _kubectl(kubeconfig: Path, *args: str, stdin: str | None = None, timeout: float = 300) -> str:
    proc = subprocess.run(
        [str(tools.require("kubectl")), f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args[:3])} failed: {proc.stderr.strip()[-800:]}")
    return proc.stdout


APPLY = ("apply", "--server-side", "--force-conflicts", "--field-manager=pdwarden-cluster")


def _apply(kubeconfig: Path, docs: list[JSON]) -> None:
    _kubectl(kubeconfig, *APPLY, "-f", "-", stdin=yaml.safe_dump_all(docs, sort_keys=False))


def _wait_pods_ready(kubeconfig: Path, selector: str, deadline: float) -> None:
    """Until a pod matching `selector` exists and is Ready (the StatefulSets appear only once
    prometheus-operator has reconciled its resource)."""

    def pods() -> list[JSON]:
        found = json.loads(_kubectl(kubeconfig, "-n", NAMESPACE, "get", "pods", "-l", selector, "-o", "json"))
        return list(found.get("items") or [])

    def all_ready() -> bool:
        found = pods()
        return bool(found) and all(pod_ready(p) for p in found)

    try:
        wait_for(
            all_ready, deadline - time.monotonic(), f"the monitoring stack's {selector} to be Ready", 1.0
        )
    except WaitTimeout:
        states = ", ".join(f"{p['metadata']['name']}: {_why_not_ready(p)}" for p in pods()) or "no pod yet"
        raise ClusterError(
            f"the monitoring stack's {selector} is not Ready after {READY_TIMEOUT_S:.0f}s ({states}); "
            f"see `kubectl -n {NAMESPACE} get events` and `pdwarden cluster logs -n {NAMESPACE} POD -c C`"
        ) from None


def _why_not_ready(pod: JSON) -> str:
    status = pod.get("status") or {}
    for c in status.get("containerStatuses") or []:
        state = c.get("state") or {}
        waiting = state.get("waiting") or state.get("terminated")
        if waiting:
            return f"{c['name']} {waiting.get('reason', '')} {waiting.get('message', '')}".strip()
    return str(status.get("phase", "Pending"))


def service_url(kubeconfig: Path, service: str) -> str:
    found = json.loads(_kubectl(kubeconfig, "-n", NAMESPACE, "get", "service", service, "-o", "json"))
    spec = found["spec"]
    return f"http://{spec['clusterIP']}:{spec['ports'][0]['port']}"


def apply_crds(kubeconfig: Path) -> Path:
    """The monitoring.coreos.com CRDs of the pinned operator, served when this returns (they
    need no build: a chart's monitors and rules can be validated against them alone); the
    module's directory."""
    module = module_dir()
    # as files, server-side: PyYAML does not read them (`- =` is its value tag) and they are
    # larger than client-side apply's last-applied annotation allows
    _kubectl(kubeconfig, *APPLY, "-f", str(module / CRD_DIR))
    _kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=120s", "-f", str(module / CRD_DIR))
    return module


def ensure_monitoring(kubeconfig: Path, progress: Progress) -> MonitoringInfo:
    """Install (or keep) the monitoring stack on the running cluster and wait until Prometheus
    and Alertmanager are Ready."""
    started = time.monotonic()
    build.ensure_monitoring_built(progress)
    tools.install(progress=False)
    progress("monitoring: the monitoring.coreos.com CRDs")
    module = apply_crds(kubeconfig)
    progress(f"monitoring: prometheus-operator {build.prometheus_operator_version()}")
    _apply(kubeconfig, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])
    _apply(kubeconfig, operator_manifests(module))
    _apply(kubeconfig, stack_manifests())
    deadline = time.monotonic() + READY_TIMEOUT_S
    for selector in (
        "app.kubernetes.io/name=prometheus-operator",
        f"prometheus={NAME}",
        f"alertmanager={NAME}",
    ):
        progress(f"monitoring: waiting for {selector} to be Ready")
        _wait_pods_ready(kubeconfig, selector, deadline)
    return MonitoringInfo(
        prometheus_url=service_url(kubeconfig, PROMETHEUS_SERVICE),
        alertmanager_url=service_url(kubeconfig, ALERTMANAGER_SERVICE),
        seconds=time.monotonic() - started,
    )


# --- reading what fired: Alertmanager's API v2 ----------------------------------------------


class AlertStatus(BaseModel):
    model_config = ConfigDict(extra="ignore")

    state: str = "active"  # active, suppressed or unprocessed


class Alert(BaseModel):
    """One alert as Alertmanager's `GET /api/v2/alerts` lists it (the fields read here)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: str = Field(alias="startsAt")
    fingerprint: str
    status: AlertStatus = Field(default_factory=AlertStatus)

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    @property
    def state(self) -> str:
        return self.status.state


ALERT_LIST = TypeAdapter(list[Alert])


def alerts(alertmanager_url: str, timeout: float = 5.0, **matchers: str) -> list[Alert]:
    """The alerts Alertmanager holds now whose labels equal `matchers` (its own filter syntax);
    ClusterError when it does not answer or answers something that is not a list of alerts."""
    params = [("filter", f'{k}="{v}"') for k, v in sorted(matchers.items())]
    try:
        resp = requests.get(f"{alertmanager_url}/api/v2/alerts", params=params, timeout=timeout)
        resp.raise_for_status()
    except requests.RequestException as exc:
        raise ClusterError(f"Alertmanager at {alertmanager_url} did not answer: {exc}") from exc
    try:
        return ALERT_LIST.validate_json(resp.content)
    except ValidationError as exc:
        raise ClusterError(f"Alertmanager at {alertmanager_url} answered no list of alerts: {exc}") from exc

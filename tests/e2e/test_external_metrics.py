"""The external metrics API on the local cluster's aggregation layer: the chart's operator
(two replicas, the leader serving) registers external.metrics.k8s.io, the real
HorizontalPodAutoscaler of kube-controller-manager reads a role's load from it and drives
that role through its Deployment's scale subresource, out under load and back in after it,
with no failed request; the API itself refuses callers that did not come through the front
proxy, and callers the cluster's RBAC does not allow."""

from __future__ import annotations

import base64
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pdwarden_contract as contract
from pdwarden_bench import autoscale
from pdwarden_demo import chart
from pdwarden_localcluster.cluster import ClusterInfo
from pdwarden_localcluster.waits import wait_for
from pdwarden_operator import external_metrics
from pdwarden_operator.render.meta import child_name
from pdwarden_testkit.cluster_env import API_TRANSIENT, Env

from .test_helm_install import helm, helm_install

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

API = f"/apis/{external_metrics.GROUP_VERSION}"
APISERVICE = f"{external_metrics.VERSION}.{external_metrics.GROUP}"
METRIC = "pdwarden_role_inflight_requests"
PORT = 6443  # the chart's externalMetrics.port


@pytest.fixture
def release(env: Env) -> Iterator[str]:
    """The chart in the test's namespace, watching only it, with the external metrics API."""
    name = f"em-{env.namespace[-6:]}"
    values = ("--set", "operator.scope=namespace", "--set", "externalMetrics.enabled=true")
    proc = helm_install(env.kubeconfig, "install", name, chart.CHART_DIR, env.namespace, *values)
    try:
        assert proc.returncode == 0, proc.stderr
        yield name
    finally:
        # also after a failed install: an APIService left behind with no one serving it
        # would stall every namespace deletion of the cluster (discovery fails)
        helm(env.kubeconfig, "uninstall", name, "-n", env.namespace, "--wait", "--timeout", "120s")


def _available(env: Env) -> bool:
    service = env.call("GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}")
    conditions = (service.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Available" and c.get("status") == "True" for c in conditions)


def _serving_pods(env: Env, release: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={release},{contract.LABEL_EXTERNAL_METRICS_SERVING}=true"
    return list(env.call("GET", f"/api/v1/namespaces/{env.namespace}/pods?labelSelector={selector}")["items"])


def _serving_pod(env: Env, release: str) -> dict[str, Any]:
    pods = _serving_pods(env, release)
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def _values(env: Env, model: str, role: str) -> list[dict[str, Any]]:
    selector = f"{contract.LABEL_MODEL}={model},{contract.LABEL_ROLE}={role}"
    path = f"{API}/namespaces/{env.namespace}/{METRIC}?labelSelector={selector}"
    return list(env.call("GET", path).get("items") or [])


def _hpa(namespace: str, model: str, role: str) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": f"{model}-{role}", "namespace": namespace},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": child_name(model, role),
            },
            "minReplicas": 1,
            "maxReplicas": 3,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {
                            "name": METRIC,
                            "selector": {
                                "matchLabels": {contract.LABEL_MODEL: model, contract.LABEL_ROLE: role}
                            },
                        },
                        "target": {"type": "AverageValue", "averageValue": str(autoscale.TARGET_INFLIGHT)},
                    },
                }
            ],
            # quick, so the test takes minutes: the defaults wait 5 minutes before a scale-in
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": 0,
                    "policies": [{"type": "Pods", "value": 2, "periodSeconds": 15}],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": 0,
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 15}],
                },
            },
        },
    }


def _count(env: Env, model: str, role: str) -> int:
    path = f"/apis/apps/v1/namespaces/{env.namespace}/deployments/{child_name(model, role)}/scale"
    return int(env.call("GET", path)["spec"]["replicas"])


def test_hpa_drives_a_role_through_the_operators_external_metrics_api(
    env: Env, release: str, cluster: ClusterInfo
) -> None:
    wait_for(lambda: _available(env), 180, f"APIService {APISERVICE} Available", 2.0, API_TRANSIENT)
    wait_for(lambda: bool(_serving_pods(env, release)), 60, "the leader's label", 1.0, API_TRANSIENT)
    lease = env.call(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{env.namespace}/leases/pdwarden-operator"
    )
    serving = _serving_pod(env, release)
    # the Service reaches the leader alone: the standby has no load to tell
    assert str(lease["spec"]["holderIdentity"]).startswith(serving["metadata"]["name"] + "_"), lease

    name = "hpa"
    body = autoscale.autoscaled_model(env.namespace, name, max_replicas=3)
    body["spec"]["prefill"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 3, "driver": "external"}
    body["spec"]["decode"] = {"replicas": 1}
    del body["spec"]["prefillDecodeRatio"]
    url = autoscale.bring_up(env, name, 3, body=body)
    # through the API server, as the HPA controller reads it: the idle prefill's load
    wait_for(
        lambda: bool(_values(env, name, contract.ROLE_PREFILL)),
        120,
        "the prefill's load served",
        2.0,
        API_TRANSIENT,
    )
    item = _values(env, name, contract.ROLE_PREFILL)[0]
    assert item["metricLabels"] == {contract.LABEL_MODEL: name, contract.LABEL_ROLE: contract.ROLE_PREFILL}
    assert _values(env, name, contract.ROLE_DECODE) == []  # decode does not autoscale: no signal
    assert _values(env, "no-such-model", contract.ROLE_PREFILL) == []

    env.call(
        "POST",
        f"/apis/autoscaling/v2/namespaces/{env.namespace}/horizontalpodautoscalers",
        _hpa(env.namespace, name, contract.ROLE_PREFILL),
    )
    clients = autoscale.RouterClients(url, name, 9, active=9)
    with clients:
        wait_for(
            lambda: (
                _count(env, name, contract.ROLE_PREFILL) == 3
                and len(env.live_ready_pods(name, contract.ROLE_PREFILL)) == 3
            ),
            300,
            "the HPA to scale prefill out to 3 on its in-flight requests",
            2.0,
            API_TRANSIENT,
        )
        hpa = env.call(
            "GET", f"/apis/autoscaling/v2/namespaces/{env.namespace}/horizontalpodautoscalers/{name}-prefill"
        )
        current = hpa["status"]["currentMetrics"][0]["external"]
        assert current["metric"]["name"] == METRIC, hpa["status"]
        assert float(current["current"]["averageValue"].rstrip("m")) > 0, hpa["status"]
        # pdwarden keeps the count the HPA set, and says who set it
        status = ((env.dm(name).get("status") or {}).get("autoscaling") or {}).get(
            contract.ROLE_PREFILL
        ) or {}
        assert status.get("reason") == "ExternalDriver" and status.get("replicas") == 3, status
    # the load is gone: the HPA scales in, one pod at a time, each drained as any deleted pod is
    wait_for(
        lambda: (
            _count(env, name, contract.ROLE_PREFILL) == 1 and len(env.pods(name, contract.ROLE_PREFILL)) == 1
        ),
        300,
        "the HPA to scale prefill back in to 1",
        2.0,
        API_TRANSIENT,
    )
    assert clients.results and clients.failed_between(0.0) == 0, clients.results[-5:]
    assert _count(env, name, contract.ROLE_DECODE) == 1  # the role it does not drive stays

    # The API itself: only the front proxy gets in, and only for callers RBAC allows.
    secret = env.call(
        "GET", f"/api/v1/namespaces/{env.namespace}/secrets/{release}-pdwarden-external-metrics"
    )
    ca = base64.b64decode(secret["data"]["ca.crt"]).decode()
    base = f"https://{serving['status']['podIP']}:{PORT}{API}"
    pki = Path(cluster.state_dir) / "pki"
    values = f"{base}/namespaces/{env.namespace}/{METRIC}"
    assert _status(values, ca, None, {}) == 401  # no client certificate
    proxy = (pki / "front-proxy-client.crt", pki / "front-proxy-client.key")
    assert _status(base, ca, proxy, {}) == 200  # discovery: the front proxy itself
    nobody = {"X-Remote-User": f"system:serviceaccount:{env.namespace}:nobody"}
    assert _status(values, ca, proxy, nobody) == 403  # the SubjectAccessReview says no
    admin = {"X-Remote-User": "pdwarden-admin", "X-Remote-Group": "system:masters"}
    assert _status(values, ca, proxy, admin) == 200
    assert _status(f"{base}/namespaces/{env.namespace}/no_such_metric", ca, proxy, admin) == 404
    assert _status(f"{values}?labelSelector=a%20in%20(", ca, proxy, admin) == 400


def _status(url: str, ca: str, cert: tuple[Path, Path] | None, headers: dict[str, str]) -> int:
    ctx = ssl.create_default_context(cadata=ca)
    ctx.check_hostname = False  # by the pod's address; the certificate names the Service
    if cert is not None:
        ctx.load_cert_chain(*cert)
    request = urllib.request.Request(url, headers=headers)
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(request, context=ctx, timeout=10) as resp:
                json.loads(resp.read())
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except (urllib.error.URLError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)

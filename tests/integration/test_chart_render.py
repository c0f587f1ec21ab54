"""The Helm chart, linted and rendered by the real helm, with default and non-default values.

Kubernetes schema validation of the rendered objects runs against the local cluster's real
API server in tests/e2e/test_helm_install.py; prometheus-operator objects (no schema vendored)
are checked here for the fields their CRDs require.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from typing import Any

import pytest

from pdwarden_cli import chart
from pdwarden_runtime import contract

pytestmark = pytest.mark.integration

NAMESPACE = "pdwarden-system"
ALL_MONITORING = {
    "monitoring.serviceMonitor.enabled": "true",
    "monitoring.podMonitor.enabled": "true",
    "monitoring.prometheusRule.enabled": "true",
    "monitoring.grafanaDashboard.enabled": "true",
}
NON_DEFAULT = {
    **ALL_MONITORING,
    "operator.scope": "namespace",
    "operator.watchNamespace": "ml",
    "image.repository": "registry.example/pdwarden",
    "image.tag": "1.2.3",
    "monitoring.prometheusRule.rules.inflightStuck.window": "10m",
    "monitoring.prometheusRule.rules.statusWritesRefused.enabled": "false",
    "monitoring.serviceMonitor.labels.release": "kube-prometheus-stack",
    "podPolicy.allow": "{faultInjection}",
    "podPolicy.namespaces.rdma": "{hostNamespaces,capabilities}",
}


def render(values: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    return chart.helm_template(release="pdw", namespace=NAMESPACE, set_values=values)


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(doc["kind"] for doc in docs)


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [chart.find_tool("helm"), *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("values", [{}, NON_DEFAULT], ids=["default", "non-default"])
def test_helm_lint_strict_passes(values: Mapping[str, str]) -> None:
    proc = helm("lint", "--strict", str(chart.CHART_DIR), *chart.helm_value_args(values))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_default_render_is_operator_rbac_and_metrics_service_only() -> None:
    docs = render()
    assert kinds(docs) == sorted(
        [
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "Deployment",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
        ]
    )
    for doc in docs:
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] == NAMESPACE


def test_operator_deployment_is_hardened_leader_and_standby_with_probes() -> None:
    deploy = chart.only_object(render(), "Deployment")
    spec = deploy["spec"]
    assert spec["replicas"] == 2 and spec["strategy"]["type"] == "RollingUpdate"
    anti = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= (
        spec["template"]["metadata"]["labels"].items()
    )
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["serviceAccountName"] == "pdw-pdwarden"
    (container,) = pod["containers"]
    sec = container["securityContext"]
    assert sec["readOnlyRootFilesystem"] is True
    assert sec["allowPrivilegeEscalation"] is False
    assert sec["privileged"] is False
    assert sec["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert container["command"] == ["pdwarden", "operator", "run"]
    assert "--all-namespaces" in container["args"]
    assert f"--metrics-port={contract.OPERATOR_METRICS_PORT}" in container["args"]
    assert f"--health-port={contract.OPERATOR_HEALTH_PORT}" in container["args"]
    assert f"--leader-election-namespace={NAMESPACE}" in container["args"]
    assert "--brake-max-wedged-models=3" in container["args"]
    assert "--namespace-brake-max-wedged-models=2" in container["args"]
    assert not [a for a in container["args"] if a.startswith("--allow")], "the pod policy allows nothing"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": contract.OPERATOR_METRICS_PORT, "health": contract.OPERATOR_HEALTH_PORT}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["image"] == "ghcr.io/pdwarden/pdwarden-runtime:0.1.0"  # tag defaults to appVersion
    # $(POD_IP) in args is expanded by the kubelet from this env var
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert "--bind-host=$(POD_IP)" in container["args"]


def rules_of(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [rule for doc in chart.find_objects(docs, kind) for rule in doc["rules"]]


def test_the_pod_policy_reaches_the_operator_as_its_allow_flags() -> None:
    [deployment] = chart.find_objects(render(NON_DEFAULT), "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    allowed = [a for a in args if a.startswith("--allow=")]
    assert allowed == ["--allow=faultInjection", "--allow=rdma/hostNamespaces", "--allow=rdma/capabilities"]


@pytest.mark.parametrize("values", [{}, NON_DEFAULT], ids=["cluster", "namespace"])
def test_rbac_is_least_privilege_and_never_touches_secrets(values: Mapping[str, str]) -> None:
    docs = render(values)
    rules = rules_of(docs, "ClusterRole") + rules_of(docs, "Role")
    assert rules
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        assert "secrets" not in rule["resources"]
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
    granted = {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    # What reconcile and the watchdog do, through the pod's ServiceAccount.
    for needed in [
        ("pdwarden.io", "disaggregatedmodels", "watch"),
        ("pdwarden.io", "disaggregatedmodels/status", "patch"),
        ("apps", "deployments", "patch"),
        ("", "pods", "delete"),
        ("", "pods", "patch"),  # action drain's quarantine; the rank label of a group's pods
        ("", "pods/eviction", "create"),
        ("", "events", "create"),
        ("rbac.authorization.k8s.io", "roles", "patch"),
        ("policy", "poddisruptionbudgets", "patch"),
        # blockOwnerDeletion on children needs this where OwnerReferencesPermissionEnforcement is on
        ("pdwarden.io", "disaggregatedmodels/finalizers", "update"),
        ("coordination.k8s.io", "leases", "update"),
        ("networking.k8s.io", "networkpolicies", "watch"),
        ("networking.k8s.io", "networkpolicies", "delete"),
        ("apps", "replicasets", "get"),  # the watchdog follows a pod's controller up to its model
    ]:
        assert needed in granted, needed
    lease_role = next(d for d in chart.find_objects(docs, "Role") if d["rules"][0]["resources"] == ["leases"])
    assert lease_role["metadata"]["namespace"] == NAMESPACE  # only the release namespace's Lease


def test_namespace_mode_grants_nothing_cluster_wide() -> None:
    docs = render(NON_DEFAULT)
    assert not chart.find_objects(docs, "ClusterRole") and not chart.find_objects(docs, "ClusterRoleBinding")
    role = next(d for d in chart.find_objects(docs, "Role") if d["metadata"]["namespace"] == "ml")
    binding = next(d for d in chart.find_objects(docs, "RoleBinding") if d["metadata"]["namespace"] == "ml")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "ml"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pdw-pdwarden", "namespace": NAMESPACE}]
    (container,) = chart.only_object(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--namespace=ml" in container["args"] and "--all-namespaces" not in container["args"]
    assert container["image"] == "registry.example/pdwarden:1.2.3"
    podmonitor = chart.only_object(docs, "PodMonitor")
    assert podmonitor["spec"]["namespaceSelector"] == {"matchNames": ["ml"]}


def test_metrics_service_selects_the_operator_pod() -> None:
    docs = render()
    service = chart.only_object(docs, "Service")
    pod_labels = chart.only_object(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {
            "name": "metrics",
            "port": contract.OPERATOR_METRICS_PORT,
            "targetPort": "metrics",
            "protocol": "TCP",
        }
    ]


def test_monitoring_objects_have_the_fields_their_crds_require() -> None:
    docs = render(ALL_MONITORING)
    service_monitor = chart.only_object(docs, "ServiceMonitor")
    assert service_monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert service_monitor["spec"]["selector"]["matchLabels"].items() <= (
        chart.only_object(docs, "Service")["metadata"]["labels"].items()
    )
    (endpoint,) = service_monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True

    pod_monitor = chart.only_object(docs, "PodMonitor")
    assert pod_monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert pod_monitor["spec"]["selector"]["matchLabels"] == {contract.LABEL_MANAGED_BY: contract.MANAGED_BY}
    (expr,) = pod_monitor["spec"]["selector"]["matchExpressions"]
    assert expr == {"key": contract.LABEL_ROLE, "operator": "In", "values": list(contract.RUNTIME_ROLES)}
    assert pod_monitor["spec"]["namespaceSelector"] == {"any": True}
    (pod_endpoint,) = pod_monitor["spec"]["podMetricsEndpoints"]
    assert (
        pod_endpoint["port"] == contract.PORT_NAME_METRICS and pod_endpoint["path"] == contract.METRICS_PATH
    )

    rule = chart.only_object(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    for group in rule["spec"]["groups"]:
        assert group["name"] and group["rules"]
        for r in group["rules"]:
            assert r["alert"] and r["expr"]

    dashboard = chart.only_object(docs, "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["pdwarden.json"])["uid"] == "pdwarden-inflight"


def test_non_default_alert_values_reach_the_rules() -> None:
    groups = chart.rule_groups(render(NON_DEFAULT))
    by_name = {r["alert"]: r for r in chart.alert_rules(groups)}
    assert "PdwardenStatusWritesRefused" not in by_name
    assert (
        "[10m]" in by_name["PdwardenInflightStuck"]["expr"]
        and "[5m]" not in by_name["PdwardenInflightStuck"]["expr"]
    )


def test_dashboard_shows_the_queue_and_uses_only_contract_metrics() -> None:
    dashboard = json.loads((chart.CHART_DIR / "dashboards" / "pdwarden.json").read_text())
    titles = {panel["title"] for panel in dashboard["panels"]}
    for wanted in (
        "Requests in flight",
        "Oldest in-flight room age",
        "KV transfers finished per second",
        "Terminal status writes refused",
        "Remediations",
    ):
        assert wanted in titles
    allowed = {v for k, v in vars(contract).items() if k.startswith("METRIC_") and not k.endswith("_BASE")}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used = chart.promql_metric_names(target["expr"].replace("$__rate_interval", "5m"))
            assert used and used <= allowed, (panel["title"], used - allowed)


BAD_VALUES = [
    ({"operator.scope": "everywhere"}, "/operator/scope"),
    ({"operator.metricsPort": "70000"}, "/operator/metricsPort"),
    (
        {"monitoring.prometheusRule.rules.inflightStuck.window": "5minutes"},
        "/monitoring/prometheusRule/rules/inflightStuck/window",
    ),
    (
        {"monitoring.prometheusRule.rules.operatorDown.severity": "page"},
        "/monitoring/prometheusRule/rules/operatorDown/severity",
    ),
    ({"securityContext.allowPrivilegeEscalation": "true"}, "/securityContext/allowPrivilegeEscalation"),
    ({"image.pullPolicy": "Sometimes"}, "/image/pullPolicy"),
    ({"replicaCount": "2"}, "replicaCount"),  # the replicas are operator.replicas
    ({"operator.replicas": "0"}, "/operator/replicas"),
    ({"operator.fleetBrake.maxWedgedModels": "0"}, "/operator/fleetBrake/maxWedgedModels"),
    ({"operator.fleetBrake.maxRemediationsPerHour": "many"}, "/operator/fleetBrake/maxRemediationsPerHour"),
    ({"operator.watchNamespace": "Not_A_Namespace"}, "/operator/watchNamespace"),
]


@pytest.mark.parametrize(("values", "field"), BAD_VALUES, ids=[f for _, f in BAD_VALUES])
def test_schema_refuses_a_wrong_value_naming_the_field(values: Mapping[str, str], field: str) -> None:
    with pytest.raises(chart.HelmError) as info:
        render(values)
    assert field in str(info.value)


def test_crd_ships_with_the_chart() -> None:
    docs = chart.helm_template(include_crds=True)
    crd = chart.only_object(docs, "CustomResourceDefinition")
    assert crd["metadata"]["name"] == f"{contract.PLURAL}.{contract.API_GROUP}"
    # The chart's copy is the generated master copy (crds/), byte for byte.
    master = (chart.REPO_ROOT / "crds").glob("*.yaml")
    copies = {p.name: p.read_text() for p in (chart.CHART_DIR / "crds").glob("*.yaml")}
    for path in master:
        assert copies.get(path.name) == path.read_text(), f"charts/pdwarden/crds/{path.name} is stale"

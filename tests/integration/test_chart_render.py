"""The Helm chart, linted and rendered by the real helm, with default and non-default values.

Kubernetes schema validation of the rendered objects runs against the local cluster's real
API server in tests/e2e/test_helm_install.py; prometheus-operator objects (no schema vendored)
are checked here for the fields their CRDs require.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Mapping
from typing import Any

import pytest
import yaml

import pdwarden_contract as contract
from pdwarden_demo import chart, demo_scenario

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


ADMISSION_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
CLUSTER_SCOPED_KINDS = ("ClusterRole", "ClusterRoleBinding", *ADMISSION_KINDS)


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


def is_hook(doc: Mapping[str, Any], which: str | None = None) -> bool:
    """A Helm hook (of kind `which`: test, pre-upgrade, ...)."""
    hook = (doc["metadata"].get("annotations") or {}).get("helm.sh/hook")
    return hook is not None and (which is None or hook == which)


def test_default_render_is_the_operator_its_rbac_service_budget_policy_and_helm_test() -> None:
    docs = render()
    lasting = [d for d in docs if not is_hook(d)]
    # the admission policies, each with its binding (tested below)
    policies: dict[str, set[str]] = {kind: set() for kind in ADMISSION_KINDS}
    for doc in lasting:
        policies.get(doc["kind"], set()).add(doc["metadata"]["name"])
    assert policies["ValidatingAdmissionPolicy"] == policies["ValidatingAdmissionPolicyBinding"]
    assert {f"{NAMESPACE}.pdw-pdwarden.{p}" for p in ("operator-writes", "gone-pods")} <= policies[
        "ValidatingAdmissionPolicy"
    ]
    assert kinds([d for d in lasting if d["kind"] not in ADMISSION_KINDS]) == sorted(
        [
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "Deployment",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
        ]
    )
    # `helm test` (templates/tests/) and the CRD's pre-upgrade hook (templates/crd-upgrade.yaml)
    assert kinds([d for d in docs if is_hook(d, "test")]) == ["Pod", "ServiceAccount"]
    upgrade = [d for d in docs if is_hook(d, "pre-upgrade")]
    assert kinds(upgrade) == ["ClusterRole", "ClusterRoleBinding", "Job", "ServiceAccount"]
    assert all(is_hook(d, "test") or is_hook(d, "pre-upgrade") for d in docs if is_hook(d))
    for doc in docs:
        if doc["kind"] not in CLUSTER_SCOPED_KINDS:
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
    assert "--brake-min-other-troubled-namespaces=3" in container["args"]
    assert "--namespace-brake-max-wedged-models=2" in container["args"]
    assert not [a for a in container["args"] if a.startswith("--allow")], "the pod policy allows nothing"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": contract.OPERATOR_METRICS_PORT, "health": contract.OPERATOR_HEALTH_PORT}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["image"] == "ghcr.io/pdwarden/pdwarden-operator:0.1.0"  # tag defaults to appVersion
    # $(POD_IP) in args is expanded by the kubelet from this env var
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert "--bind-host=$(POD_IP)" in container["args"]


def rules_of(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [rule for doc in chart.find_objects(docs, kind) for rule in doc["rules"]]


def granted_by(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) of every grant in the rules."""
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def test_the_pod_policy_reaches_the_operator_as_its_allow_flags() -> None:
    [deployment] = chart.find_objects(render(NON_DEFAULT), "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    allowed = [a for a in args if a.startswith("--allow=")]
    assert allowed == ["--allow=faultInjection", "--allow=rdma/hostNamespaces", "--allow=rdma/capabilities"]


@pytest.mark.parametrize("values", [{}, NON_DEFAULT], ids=["cluster", "namespace"])
def test_rbac_is_least_privilege_and_never_reads_secrets(values: Mapping[str, str]) -> None:
    docs = render(values)
    rules = rules_of(docs, "ClusterRole") + rules_of(docs, "Role")
    assert rules
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        if "secrets" in rule["resources"]:  # the worker keys: created, never read
            assert rule["verbs"] == ["create"] and rule["resources"] == ["secrets"], rule
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
    granted = granted_by(rules)
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
        ("", "secrets", "create"),  # each model's worker key
    ]:
        assert needed in granted, needed
    lease_role = next(d for d in chart.find_objects(docs, "Role") if d["rules"][0]["resources"] == ["leases"])
    assert lease_role["metadata"]["namespace"] == NAMESPACE  # only the release namespace's Lease


def test_namespace_mode_grants_nothing_cluster_wide() -> None:
    docs = render(NON_DEFAULT)
    # the CRD's pre-upgrade hook alone, while it runs: one CRD, get and update (tested below)
    lasting = [d for d in docs if not is_hook(d, "pre-upgrade")]
    assert not chart.find_objects(lasting, "ClusterRole") and not chart.find_objects(
        lasting, "ClusterRoleBinding"
    )
    assert not chart.find_objects(render({**NON_DEFAULT, "crds.upgrade": "false"}), "ClusterRole")
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


def operator_pod_labels(docs: list[dict[str, Any]]) -> dict[str, str]:
    labels: dict[str, str] = chart.only_object(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    return labels


def test_pod_disruption_budget_keeps_a_replica_through_a_drain() -> None:
    docs = render()
    deployment = chart.only_object(docs, "Deployment")
    pdb = chart.only_object(docs, "PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1" and pdb["metadata"]["namespace"] == NAMESPACE
    # one replica at a time: of the 2 the other stays to hold or take over the Lease
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"  # a broken replica never blocks
    # the Deployment's own selector, which its pods carry
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= operator_pod_labels(docs).items()


@pytest.mark.parametrize(
    "values",
    [{"operator.replicas": "1"}, {"operator.podDisruptionBudget.enabled": "false"}],
    ids=["one-replica", "disabled"],
)
def test_no_pod_disruption_budget_for_one_replica_or_when_disabled(values: Mapping[str, str]) -> None:
    # (with one replica a budget could only block every drain, or allow everything)
    assert not chart.find_objects(render(values), "PodDisruptionBudget")


PROMETHEUS_PEER = {
    "namespaceSelector": {},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}


def test_network_policy_admits_only_scrapers_and_the_helm_test_to_the_metrics_port() -> None:
    docs = render()
    policy = chart.only_object(docs, "NetworkPolicy")
    assert policy["apiVersion"] == "networking.k8s.io/v1" and policy["metadata"]["namespace"] == NAMESPACE
    spec = policy["spec"]
    assert spec["podSelector"] == chart.only_object(docs, "Deployment")["spec"]["selector"]
    # ingress only; egress (API server, every model's metrics ports) stays open
    assert spec["policyTypes"] == ["Ingress"] and "egress" not in spec
    (rule,) = spec["ingress"]
    # the metrics port only: the health port is the kubelet's (the node, always let in)
    assert rule["ports"] == [{"protocol": "TCP", "port": contract.OPERATOR_METRICS_PORT}]
    prometheus, test_peer = rule["from"]
    assert prometheus == PROMETHEUS_PEER  # the default metricsFrom, as the models' own policies
    # the helm test pod of this release in this namespace (no namespaceSelector), not the operator
    assert set(test_peer) == {"podSelector"}
    test_pod = next(d for d in chart.find_objects(docs, "Pod") if is_hook(d, "test"))
    assert test_peer["podSelector"]["matchLabels"].items() <= test_pod["metadata"]["labels"].items()
    assert not test_peer["podSelector"]["matchLabels"].items() <= operator_pod_labels(docs).items()
    # the Service's target is that port
    (port,) = chart.only_object(docs, "Service")["spec"]["ports"]
    (container,) = chart.only_object(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named[port["targetPort"]] == contract.OPERATOR_METRICS_PORT


def test_network_policy_peers_and_port_follow_the_values() -> None:
    docs = render(
        {
            "operator.metricsPort": "9091",
            "operator.networkPolicy.metricsFrom[0].ipBlock.cidr": "10.0.0.5/32",
            "operator.networkPolicy.metricsFrom[1].namespaceSelector.matchLabels.team": "monitoring",
        }
    )
    (rule,) = chart.only_object(docs, "NetworkPolicy")["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9091}]
    assert rule["from"][:2] == [
        {"ipBlock": {"cidr": "10.0.0.5/32"}},
        {"namespaceSelector": {"matchLabels": {"team": "monitoring"}}},
    ]  # replace the default, which is gone
    assert PROMETHEUS_PEER not in rule["from"] and len(rule["from"]) == 3


def test_network_policy_without_scrapers_still_admits_no_one_else() -> None:
    (rule,) = chart.only_object(render({"operator.networkPolicy.metricsFrom": "null"}), "NetworkPolicy")[
        "spec"
    ]["ingress"]
    # never an empty `from` (which would admit every source): only the helm test pod
    assert [set(peer) for peer in rule["from"]] == [{"podSelector"}]


def test_network_policy_can_be_disabled() -> None:
    assert not chart.find_objects(render({"operator.networkPolicy.enabled": "false"}), "NetworkPolicy")


def test_the_demos_values_turn_on_the_monitors_and_rules_that_the_stacks_prometheus_may_scrape() -> None:
    docs = render(demo_scenario.chart_values("cluster"))
    (endpoint,) = chart.only_object(docs, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert endpoint["interval"] == "2s"
    assert chart.only_object(docs, "ServiceMonitor")["spec"]["endpoints"][0]["interval"] == "2s"
    assert chart.only_object(docs, "PrometheusRule")["spec"]["groups"]
    # the operator's NetworkPolicy admits what prometheus-operator labels its Prometheus with
    (rule,) = chart.only_object(docs, "NetworkPolicy")["spec"]["ingress"]
    assert rule["from"][0]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}


DIGEST = "sha256:" + "0123456789abcdef" * 4


def images(docs: list[dict[str, Any]]) -> list[str]:
    """Every container image the chart renders: the operator's and the helm test's."""
    pods = [chart.only_object(docs, "Deployment")["spec"]["template"], *chart.find_objects(docs, "Pod")]
    return [c["image"] for pod in pods for c in pod["spec"]["containers"]]


def test_image_by_digest_everywhere_the_operator_image_runs() -> None:
    docs = render(
        {"image.repository": "registry.example/pdwarden", "image.tag": "1.2.3", "image.digest": DIGEST}
    )
    # repository@digest: the digest alone says what runs (the tag is ignored)
    assert images(docs) == [f"registry.example/pdwarden@{DIGEST}"] * 2
    # by tag without one (the tag defaulting to the chart's appVersion)
    repository = yaml.safe_load((chart.CHART_DIR / "values.yaml").read_text())["image"]["repository"]
    app_version = yaml.safe_load((chart.CHART_DIR / "Chart.yaml").read_text())["appVersion"]
    assert images(render()) == [f"{repository}:{app_version}"] * 2


def test_helm_test_pod_is_a_hardened_test_hook() -> None:
    docs = render()
    sa, pod = sorted((d for d in docs if is_hook(d, "test")), key=lambda d: d["kind"] != "ServiceAccount")
    for hook in (sa, pod):
        annotations = hook["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "test"
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation"
        assert hook["metadata"]["name"] == "pdw-pdwarden-test"
    assert int(sa["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        pod["metadata"]["annotations"].get("helm.sh/hook-weight", "0")
    )  # the ServiceAccount first
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] > 0
    assert spec["serviceAccountName"] == sa["metadata"]["name"] and spec["automountServiceAccountToken"]
    # as hardened as the operator's pod
    operator = chart.only_object(docs, "Deployment")["spec"]["template"]["spec"]
    assert spec["securityContext"] == operator["securityContext"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = spec["containers"]
    sec = container["securityContext"]
    assert sec == operator["containers"][0]["securityContext"]
    assert sec["readOnlyRootFilesystem"] is True and sec["allowPrivilegeEscalation"] is False
    assert sec["privileged"] is False and sec["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert container["image"] == operator["containers"][0]["image"]
    # not the operator's: nothing that selects the operator's pods selects it
    labels = pod["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "test"
    for selector in (
        chart.only_object(docs, "Service")["spec"]["selector"],
        chart.only_object(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
        chart.only_object(docs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"],
    ):
        assert not selector.items() <= labels.items()
    # its ServiceAccount is bound to nothing (discovery is every authenticated identity's)
    for binding in chart.find_objects(docs, "RoleBinding") + chart.find_objects(docs, "ClusterRoleBinding"):
        assert sa["metadata"]["name"] not in [s["name"] for s in binding["subjects"]]


def test_helm_test_checks_the_charts_service_metric_and_crd() -> None:
    (pod,) = (d for d in render() if is_hook(d, "test") and d["kind"] == "Pod")
    (container,) = pod["spec"]["containers"]
    assert container["command"][:2] == ["python3", "-c"]
    assert container["command"][2] == (chart.CHART_DIR / "files" / "helm-test.py").read_text()
    env = {e["name"]: e["value"] for e in container["env"]}
    port = contract.OPERATOR_METRICS_PORT
    assert env["METRICS_URL"] == f"http://pdw-pdwarden-metrics.{NAMESPACE}.svc:{port}{contract.METRICS_PATH}"
    assert env["OPERATOR_METRIC"] == contract.METRIC_OPERATOR_LEADER  # every replica exports it
    crd = yaml.safe_load(next((chart.CHART_DIR / "crds").glob("*.yaml")).read_text())
    assert env["CRD_GROUP"] == crd["spec"]["group"] == contract.API_GROUP
    assert env["CRD_PLURAL"] == crd["spec"]["names"]["plural"] == contract.PLURAL
    assert env["CRD_VERSIONS"].split(",") == [v["name"] for v in crd["spec"]["versions"] if v["served"]]
    assert contract.API_VERSION in env["CRD_VERSIONS"].split(",")
    no_service = {"metricsService.enabled": "false"}
    (pod,) = (d for d in render(no_service) if is_hook(d, "test") and d["kind"] == "Pod")
    assert "METRICS_URL" not in {e["name"] for e in pod["spec"]["containers"][0]["env"]}


def test_crd_upgrade_hook_applies_the_operators_crd_and_may_touch_nothing_else() -> None:
    from pdwarden_operator.crd import CRD_NAME

    docs = render()
    hooks = {d["kind"]: d for d in docs if is_hook(d, "pre-upgrade")}
    annotations = {kind: d["metadata"]["annotations"] for kind, d in hooks.items()}
    for kind, a in annotations.items():
        assert a["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded", kind
    # the RBAC exists before the Job starts
    assert all(
        int(annotations[k]["helm.sh/hook-weight"]) < int(annotations["Job"]["helm.sh/hook-weight"])
        for k in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    )
    (rule,) = hooks["ClusterRole"]["rules"]
    assert rule == {
        "apiGroups": ["apiextensions.k8s.io"],
        "resources": ["customresourcedefinitions"],
        "resourceNames": [CRD_NAME],
        "verbs": ["get", "update"],
    }
    sa = hooks["ServiceAccount"]["metadata"]
    assert hooks["ClusterRoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["name"], "namespace": NAMESPACE}
    ]
    assert hooks["ClusterRoleBinding"]["roleRef"]["name"] == hooks["ClusterRole"]["metadata"]["name"]
    pod = hooks["Job"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["name"] and pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["command"][:3] == ["pdwarden", "crd", "--apply"]
    operator_pod = chart.only_object(docs, "Deployment")["spec"]["template"]["spec"]
    (operator,) = operator_pod["containers"]
    # the operator's own image, as hardened as its pod
    assert container["image"] == operator["image"]
    assert container["securityContext"] == operator["securityContext"]
    assert pod["securityContext"] == operator_pod["securityContext"]
    assert container["resources"]["limits"]["memory"]
    # nothing of the hook selects or is selected as the operator's pods
    assert pod and hooks["Job"]["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == (
        "crd-upgrade"
    )
    assert not [d for d in render({"crds.upgrade": "false"}) if is_hook(d, "pre-upgrade")]


BAD_VALUES = [
    ({"crds.upgrade": "sometimes"}, "/crds/upgrade"),
    ({"image.digest": "sha256:abc"}, "/image/digest"),
    ({"image.digest": "sha256:" + "0123456789ABCDEF" * 4}, "/image/digest"),  # lowercase hex only
    ({"image.digest": "1.2.3"}, "/image/digest"),  # a tag is not a digest
    ({"operator.podDisruptionBudget.enabled": "maybe"}, "/operator/podDisruptionBudget/enabled"),
    ({"operator.networkPolicy.enabled": "yes"}, "/operator/networkPolicy/enabled"),
    (
        {"operator.networkPolicy.metricsFrom[0].podSelector.matchLabel.app": "prometheus"},
        "/operator/networkPolicy/metricsFrom/0/podSelector",
    ),
    (
        {"operator.networkPolicy.metricsFrom[0].ipBlock.except[0]": "10.0.0.0/8"},
        "/operator/networkPolicy/metricsFrom/0/ipBlock",
    ),
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


def test_the_external_metrics_api_is_off_by_default() -> None:
    docs = render()
    assert not chart.find_objects(docs, "APIService")
    (container,) = chart.only_object(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert not [a for a in container["args"] if a.startswith("--external-metrics")]


def test_the_external_metrics_api_reaches_the_leader_over_tls_the_apiservice_trusts() -> None:
    from cryptography import x509

    from pdwarden_operator import external_metrics

    docs = render({"externalMetrics.enabled": "true", "externalMetrics.port": "7443"})
    apiservice = chart.only_object(docs, "APIService")
    assert apiservice["metadata"]["name"] == f"{external_metrics.VERSION}.{external_metrics.GROUP}"
    assert (apiservice["spec"]["group"], apiservice["spec"]["version"]) == (
        external_metrics.GROUP,
        external_metrics.VERSION,
    )
    secret = chart.only_object(docs, "Secret")
    assert apiservice["spec"]["caBundle"] == secret["data"]["ca.crt"]
    # the serving certificate names the Service the APIService calls, and the CA signed it
    svc_ref = apiservice["spec"]["service"]
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    assert f"{svc_ref['name']}.{svc_ref['namespace']}.svc" in names
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert.verify_directly_issued_by(ca)

    service = next(s for s in chart.find_objects(docs, "Service") if s["metadata"]["name"] == svc_ref["name"])
    assert service["spec"]["ports"][0]["port"] == svc_ref["port"] == 443
    deployment = chart.only_object(docs, "Deployment")
    pod = deployment["spec"]["template"]
    # the leader alone: the pods' labels plus the one the leading operator sets on its pod
    assert service["spec"]["selector"] == {
        **deployment["spec"]["selector"]["matchLabels"],
        contract.LABEL_EXTERNAL_METRICS_SERVING: "true",
    }
    (container,) = pod["spec"]["containers"]
    port = next(p for p in container["ports"] if p["name"] == service["spec"]["ports"][0]["targetPort"])
    assert port["containerPort"] == 7443
    assert "--external-metrics-port=7443" in container["args"]
    tls_dir = next(a for a in container["args"] if a.startswith("--external-metrics-tls-dir=")).split("=", 1)[
        1
    ]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == tls_dir)
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == secret["metadata"]["name"] and mount["readOnly"] is True

    policy = chart.only_object(docs, "NetworkPolicy")
    assert {"ports": [{"protocol": "TCP", "port": 7443}]} in policy["spec"]["ingress"]
    # delegated authentication and authorisation, and the leader's label: nothing more
    bindings = {b["roleRef"]["name"]: b for b in chart.find_objects(docs, "ClusterRoleBinding")}
    assert "system:auth-delegator" in bindings
    reader = next(
        b for b in chart.find_objects(docs, "RoleBinding") if b["metadata"]["namespace"] == "kube-system"
    )
    assert reader["roleRef"]["name"] == "extension-apiserver-authentication-reader"
    label_role = next(
        r for r in chart.find_objects(docs, "Role") if r["metadata"]["name"].endswith("leader-label")
    )
    assert label_role["metadata"]["namespace"] == NAMESPACE
    assert label_role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]}]


@pytest.mark.parametrize("scope", ["cluster", "namespace"])
def test_rbac_grants_every_kind_of_child_the_operator_renders(scope: str) -> None:
    """One table (render/kinds.py) names the kinds; the chart must let the operator apply,
    watch and delete each of them, in both scopes."""
    from pdwarden_operator.kube.client import group_version_plural
    from pdwarden_operator.render.kinds import CHILD_KINDS

    docs = [d for d in render_scope(scope) if not is_hook(d)]
    rules = rules_of(docs, "ClusterRole") + rules_of(docs, "Role")
    granted = granted_by(rules)
    for api_version, kind in CHILD_KINDS:
        group, _, plural = group_version_plural(api_version, kind)
        for verb in ("get", "list", "watch", "create", "patch", "delete"):
            assert (group, plural, verb) in granted, (kind, verb)


def render_scope(scope: str) -> list[dict[str, Any]]:
    return render({"operator.scope": scope} if scope == "namespace" else {})


def test_the_charts_brake_defaults_are_the_operators() -> None:
    """values.yaml cannot import them: the operator's defaults (brake.py, also its CLI's) and
    the chart's must not drift apart."""
    from pdwarden_operator.watchdog.brake import DEFAULT_FLEET, DEFAULT_NAMESPACE

    values = yaml.safe_load((chart.CHART_DIR / "values.yaml").read_text())["operator"]
    for key, limits in (("fleetBrake", DEFAULT_FLEET), ("namespaceBrake", DEFAULT_NAMESPACE)):
        assert {k: v for k, v in values[key].items() if k != "minOtherTroubledNamespaces"} == {
            "maxRemediationsPerHour": limits.max_remediations_per_hour,
            "maxWedgedModels": limits.max_wedged_models,
            "maxWedgedPods": limits.max_wedged_pods,
        }, key
    assert values["fleetBrake"]["minOtherTroubledNamespaces"] == DEFAULT_FLEET.min_other_troubled_namespaces
    assert "minOtherTroubledNamespaces" not in values["namespaceBrake"], "a fleet limit only"


OPERATOR_USER = f"system:serviceaccount:{NAMESPACE}:pdw-pdwarden"
WRITE_VERBS = {"create", "update", "patch", "delete"}
# What the operator writes that the admission policy does not judge (docs/tenancy.md): its
# models, Events, its leader Lease (a Role in the release namespace) and evictions (the request
# carries no pod to judge).
UNJUDGED_WRITES = {
    (contract.API_GROUP, contract.PLURAL),
    (contract.API_GROUP, f"{contract.PLURAL}/status"),
    (contract.API_GROUP, f"{contract.PLURAL}/finalizers"),
    ("", "events"),
    ("events.k8s.io", "events"),
    ("coordination.k8s.io", "leases"),
    ("", "pods/eviction"),
}


def admission_policy(docs: list[dict[str, Any]], suffix: str) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The policy `<release namespace>.<full name>.<suffix>` and its binding."""
    name = f"{NAMESPACE}.pdw-pdwarden.{suffix}"
    (policy,) = [
        d for d in chart.find_objects(docs, "ValidatingAdmissionPolicy") if d["metadata"]["name"] == name
    ]
    (binding,) = [
        d
        for d in chart.find_objects(docs, "ValidatingAdmissionPolicyBinding")
        if d["metadata"]["name"] == name
    ]
    assert binding["spec"]["policyName"] == name and binding["spec"]["validationActions"] == ["Deny"]
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["spec"]["failurePolicy"] == "Fail"  # a policy that cannot be evaluated refuses
    return policy, binding


def cel(policy: Mapping[str, Any]) -> str:
    """Every CEL expression of the policy, one text."""
    spec = policy["spec"]
    parts = [c["expression"] for c in spec.get("matchConditions", [])]
    parts += [v["expression"] for v in spec.get("variables", [])]
    parts += [v["expression"] for v in spec["validations"]]
    return "\n".join(parts)


def matched(policy: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, operation) the policy's resource rules match."""
    return {
        (g, r, op)
        for rule in policy["spec"]["matchConstraints"]["resourceRules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for op in rule["operations"]
    }


@pytest.mark.parametrize("scope", ["cluster", "namespace"])
def test_every_write_the_operators_rbac_allows_is_judged_by_the_confining_policy(scope: str) -> None:
    docs = [d for d in render_scope(scope) if not is_hook(d)]
    policy, binding = admission_policy(docs, "operator-writes")
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == f'request.userInfo.username == "{OPERATOR_USER}"'
    assert "matchResources" not in binding["spec"]  # every namespace, whatever the scope
    writes = {
        (g, r)
        for g, r, v in granted_by(rules_of(docs, "ClusterRole") + rules_of(docs, "Role"))
        if v in WRITE_VERBS
    }
    rules = matched(policy)
    judged = {
        (g, r) for g, r, _ in rules if all((g, r, op) in rules for op in ("CREATE", "UPDATE", "DELETE"))
    }
    # a kind the operator may write is either judged or one of the few named above: a new kind
    # granted without the policy fails here
    assert writes - judged == UNJUDGED_WRITES
    text = cel(policy)
    for needed in (
        f"'{contract.LABEL_MANAGED_BY}'",
        f"'{contract.MANAGED_BY}'",
        f"'{contract.KIND}'",
        f"'{contract.API_GROUP}/'",
        f"'{contract.LABEL_MODEL}'",
        *(f"'-{role}'" for role in contract.RUNTIME_ROLES),  # the scale subresource, by name
        "[oldObject, object]",  # an update: the stored object is judged, not only the new one
    ):
        assert needed in text, needed
    # the operator's own pods (the external metrics leader label) only when that API is on
    (own,) = [v for v in policy["spec"]["variables"] if v["name"] == "ownPods"]
    assert own["expression"] == "false"


def test_the_confining_policy_admits_the_operators_own_pods_only_with_the_external_metrics_api() -> None:
    policy, _ = admission_policy(render({"externalMetrics.enabled": "true"}), "operator-writes")
    (own,) = [v for v in policy["spec"]["variables"] if v["name"] == "ownPods"]
    assert f'request.namespace == "{NAMESPACE}"' in own["expression"]
    assert "o.metadata.labels['app.kubernetes.io/instance'] == \"pdw\"" in own["expression"]
    assert "o.metadata.labels['app.kubernetes.io/component'] == 'operator'" in own["expression"]


@pytest.mark.parametrize("scope", ["cluster", "namespace"])
def test_only_the_operator_writes_a_models_gone_pods_list(scope: str) -> None:
    policy, binding = admission_policy(render_scope(scope), "gone-pods")
    assert matched(policy) == {("", "configmaps", op) for op in ("CREATE", "UPDATE", "DELETE")}
    conditions = [c["expression"] for c in policy["spec"]["matchConditions"]]
    assert conditions == [
        f"request.name.endsWith('-{contract.GONE_PODS_SUFFIX}')",
        f'request.userInfo.username != "{OPERATOR_USER}"',
    ]
    (validation,) = policy["spec"]["validations"]
    assert validation["reason"] == "Forbidden"
    # no one else creates one; changing or deleting pdwarden's is left to the collectors
    assert validation["expression"].startswith("request.operation != 'CREATE' && ")
    text = cel(policy)
    for needed in (
        f"'{contract.LABEL_MANAGED_BY}'",
        f"'{contract.LABEL_MODEL}'",
        "[oldObject, object]",
        "system:serviceaccount:kube-system:generic-garbage-collector",
        "system:serviceaccount:kube-system:namespace-controller",
    ):
        assert needed in text, needed
    if scope == "cluster":
        assert "matchResources" not in binding["spec"]
    else:  # one operator per tenant namespace: each guards its own namespace's lists
        selector = binding["spec"]["matchResources"]["namespaceSelector"]
        assert selector == {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}


def test_each_admission_policy_can_be_turned_off() -> None:
    ours = {f"{NAMESPACE}.pdw-pdwarden.{p}" for p in ("operator-writes", "gone-pods")}

    def names(values: Mapping[str, str]) -> set[str]:
        return {d["metadata"]["name"] for d in render(values) if d["kind"] in ADMISSION_KINDS} & ours

    assert names({"admissionPolicies.confineOperator.enabled": "false"}) == {
        f"{NAMESPACE}.pdw-pdwarden.gone-pods"
    }
    assert names({"admissionPolicies.gonePods.enabled": "false"}) == {
        f"{NAMESPACE}.pdw-pdwarden.operator-writes"
    }
    off = {
        "admissionPolicies.confineOperator.enabled": "false",
        "admissionPolicies.gonePods.enabled": "false",
    }
    assert names(off) == set()
    assert names({}) == ours

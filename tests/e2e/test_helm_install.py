"""The chart on the local cluster's real API server: schema-valid manifests, a real install
whose operator pod reconciles a model with the chart's RBAC and passes `helm test` (through
the operator's NetworkPolicy, which the local cluster enforces), a refused bad value, and an
uninstall that leaves no operator objects behind."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

import pdwarden_contract as contract
from pdwarden_demo import chart
from pdwarden_localcluster import monitoring
from pdwarden_localcluster.waits import wait_for

from ._operator_helpers import kubectl_with_crd

pytestmark = pytest.mark.e2e

EXAMPLE = chart.REPO_ROOT / "examples" / "synthetic.yaml"
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def run(
    cmd: list[str], kubeconfig: Path, stdin: str | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    return subprocess.run(
        cmd, input=stdin, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run([chart.find_tool("kubectl"), *args], kubeconfig, stdin)


def helm(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run([chart.find_tool("helm"), *args], kubeconfig)


def helm_install(
    kubeconfig: Path, verb: str, release: str, chart_ref: Path, namespace: str, *values: str
) -> subprocess.CompletedProcess[str]:
    """`helm install` or `helm upgrade` of `chart_ref` (a directory or a packaged chart), waited for."""
    return helm(
        kubeconfig, verb, release, str(chart_ref), "-n", namespace, "--wait", "--timeout", "240s", *values
    )


def get_json(kubeconfig: Path, *args: str) -> Any:
    proc = kubectl(kubeconfig, "get", *args, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def kubeconfig(cluster: Any) -> Path:
    return Path(cluster.kubeconfig)


@pytest.fixture(scope="module")
def monitoring_crds(cluster: Any) -> None:
    """prometheus-operator's CRDs (no build needed; the whole stack: tests/e2e/test_monitoring.py)."""
    monitoring.apply_crds(Path(cluster.kubeconfig))


@pytest.fixture
def namespace(kubeconfig: Path) -> Iterator[str]:
    name = f"pdw-helm-{uuid.uuid4().hex[:6]}"
    assert kubectl(kubeconfig, "create", "namespace", name).returncode == 0
    yield name
    kubectl(kubeconfig, "delete", "namespace", name, "--wait=false")


def is_test_hook(doc: Mapping[str, Any]) -> bool:
    return (doc.get("metadata", {}).get("annotations") or {}).get("helm.sh/hook") == "test"


def rendered(namespace: str, values: Mapping[str, str], release: str = "pdw") -> str:
    # Without the `helm test` hooks: their Pod names a ServiceAccount that a dry run never
    # creates (admission refuses it); `helm test` creates both for real in the install test.
    docs = chart.helm_template(release=release, namespace=namespace, set_values=values, include_crds=True)
    return yaml.safe_dump_all([d for d in docs if not is_test_hook(d)])


@pytest.mark.parametrize(
    "values",
    [
        {},
        {
            "operator.scope": "namespace",
            "monitoring.grafanaDashboard.enabled": "true",
            # validated by prometheus-operator's own CRDs (monitoring_crds)
            "monitoring.serviceMonitor.enabled": "true",
            "monitoring.podMonitor.enabled": "true",
            "monitoring.prometheusRule.enabled": "true",
            "metricsService.type": "NodePort",
            "serviceAccount.annotations.team": "ml",
            "podLabels.tier": "control",
            "externalMetrics.enabled": "true",
            "tolerations[0].key": "nvidia.com/gpu",
            "tolerations[0].operator": "Exists",
        },
    ],
    ids=["default", "non-default"],
)
def test_rendered_manifests_pass_the_api_servers_schema_validation(
    kubeconfig: Path, namespace: str, values: Mapping[str, str], monitoring_crds: None
) -> None:
    # --dry-run=server: the real API server validates every object against its OpenAPI
    # schemas (and the CRDs: ours, and prometheus-operator's for the monitors and rules),
    # runs admission, and persists nothing.
    manifest = rendered(namespace, values)
    proc = kubectl(kubeconfig, "apply", "--dry-run=server", "--validate=strict", "-f", "-", stdin=manifest)
    assert proc.returncode == 0, proc.stderr
    applied = [line for line in proc.stdout.splitlines() if "(server dry run)" in line]
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    assert len(applied) == len(docs)
    if values.get("monitoring.podMonitor.enabled"):
        assert {d["kind"] for d in docs} >= MONITORING_KINDS


def test_the_dry_run_validation_catches_a_bad_object(kubeconfig: Path, namespace: str) -> None:
    # Guards the test above: a field the schema does not know must be refused.
    docs = [d for d in yaml.safe_load_all(rendered(namespace, {})) if d]
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    deploy["spec"]["template"]["spec"]["containers"][0]["livenessProb"] = {}
    proc = kubectl(
        kubeconfig, "apply", "--dry-run=server", "--validate=strict", "-f", "-", stdin=yaml.safe_dump(deploy)
    )
    assert proc.returncode != 0
    assert "livenessProb" in proc.stderr


def test_a_value_that_violates_the_schema_is_refused_at_install(kubeconfig: Path, namespace: str) -> None:
    proc = helm(
        kubeconfig,
        "install",
        "bad",
        str(chart.CHART_DIR),
        "-n",
        namespace,
        "--set",
        "operator.scope=everywhere",
    )
    assert proc.returncode != 0
    assert "/operator/scope" in proc.stderr
    assert helm(kubeconfig, "status", "bad", "-n", namespace).returncode != 0  # no release was recorded
    assert get_json(kubeconfig, "deployments", "-n", namespace)["items"] == []


RBAC_KINDS = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


@pytest.mark.parametrize("scope", ["cluster", "namespace"])
def test_rbac_is_least_privilege_on_the_real_authorizer(kubeconfig: Path, namespace: str, scope: str) -> None:
    # the authorizer answers "no" for a resource the API server does not serve: the CRD first,
    # whatever ran before this test
    kubectl_with_crd(kubeconfig)
    release = f"rbac-{namespace[-6:]}"  # cluster-scoped names must not collide across runs
    docs = chart.helm_template(release=release, namespace=namespace, set_values={"operator.scope": scope})
    manifest = yaml.safe_dump_all([d for d in docs if d["kind"] in RBAC_KINDS])
    proc = kubectl(kubeconfig, "apply", "-f", "-", stdin=manifest)
    assert proc.returncode == 0, proc.stderr
    sa = f"system:serviceaccount:{namespace}:{release}-pdwarden"

    def can(*args: str) -> bool:
        return kubectl(kubeconfig, "auth", "can-i", *args, "--as", sa).stdout.strip() == "yes"

    try:
        models = f"disaggregatedmodels.{contract.API_GROUP}"
        assert can("patch", models, "--subresource=status", "-n", namespace)
        assert can("watch", models, "-n", namespace)
        assert can("delete", "pods", "-n", namespace)
        assert can("create", "pods", "--subresource=eviction", "-n", namespace)
        assert can("patch", "deployments.apps", "-n", namespace)
        assert can("patch", "deployments.apps", "--subresource=scale", "-n", namespace)  # autoscaling
        assert can("create", "events", "-n", namespace)
        # blockOwnerDeletion on children, under OwnerReferencesPermissionEnforcement
        assert can("update", models, "--subresource=finalizers", "-n", namespace)
        assert can("update", "leases.coordination.k8s.io", "-n", namespace)  # leader election
        assert not can("get", "secrets", "-n", namespace)
        assert can("create", "secrets", "-n", namespace)  # the models' worker keys
        for verb in ("list", "watch", "update", "patch", "delete"):
            assert not can(verb, "secrets", "-n", namespace), verb
        assert not can("create", "pods", "-n", namespace)  # it never runs pods itself
        assert not can("delete", "nodes")
        if scope == "cluster":
            assert can("list", models, "--all-namespaces")
            assert not can("list", "secrets", "--all-namespaces")
        else:
            assert not can("list", "pods", "-n", "kube-system")  # nothing outside its namespace
            assert not can("list", models, "--all-namespaces")
    finally:
        kubectl(kubeconfig, "delete", "-f", "-", "--wait=false", stdin=manifest)


def hook_selector(release: str) -> str:
    """The chart's `helm test` objects (templates/tests/) of `release`."""
    return f"app.kubernetes.io/instance={release},app.kubernetes.io/component=test"


def assert_helm_test_passes(kubeconfig: Path, namespace: str, release: str) -> None:
    """`helm test`: the chart's test Pod, in the operator's image and as hardened as its pod,
    reaches the operator through the metrics Service (past the operator's NetworkPolicy) and
    finds the CRD served by API discovery, with a ServiceAccount bound to no Role."""
    proc = run(
        [chart.find_tool("helm"), "test", release, "-n", namespace, "--timeout", "150s", "--logs"],
        kubeconfig,
        timeout=210,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (pod,) = get_json(kubeconfig, "pods", "-n", namespace, "-l", hook_selector(release))["items"]
    assert pod["status"]["phase"] == "Succeeded"
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    deployment = get_json(kubeconfig, "deployment", f"{release}-pdwarden", "-n", namespace)
    (operator,) = deployment["spec"]["template"]["spec"]["containers"]
    assert pod["spec"]["containers"][0]["image"] == operator["image"]  # the operator's own image
    # Its log (Helm keeps the Pod, before-hook-creation): both checks passed, none skipped.
    logs = kubectl(kubeconfig, "logs", pod["metadata"]["name"], "-n", namespace)
    assert logs.returncode == 0, logs.stderr
    assert f"ok: the operator answers at http://{release}-pdwarden-metrics.{namespace}.svc:" in logs.stdout
    served = f"{contract.PLURAL}.{contract.API_GROUP}/{contract.API_VERSION}"
    assert f"ok: the API server serves {served}" in logs.stdout, logs.stdout
    assert "passed:" in logs.stdout and "skipped" not in logs.stdout, logs.stdout
    # the test's ServiceAccount may read discovery and nothing else
    sa = f"system:serviceaccount:{namespace}:{release}-pdwarden-test"
    models = f"disaggregatedmodels.{contract.API_GROUP}"
    for verb, resource in [("get", models), ("list", "pods"), ("get", "secrets")]:
        answer = kubectl(kubeconfig, "auth", "can-i", verb, resource, "-n", namespace, "--as", sa)
        assert answer.stdout.strip() == "no", (verb, resource, answer.stdout, answer.stderr)


def assert_runs_as_the_chart_says(pod: dict[str, Any]) -> None:
    """The operator's process (the local kubelet's containerID is its pid): the chart's
    non-root user, a read-only root with /tmp writable, the API reached only through the
    mounted ServiceAccount token."""
    pid = int(pod["status"]["containerStatuses"][0]["containerID"].removeprefix("pdwarden://"))
    proc = Path(f"/proc/{pid}")
    uids = next(ln for ln in (proc / "status").read_text().splitlines() if ln.startswith("Uid:"))
    assert uids.split()[1:] == ["65532"] * 4
    env = dict(e.split("=", 1) for e in (proc / "environ").read_text().split("\0") if "=" in e)
    assert "KUBECONFIG" not in env and env["KUBERNETES_SERVICE_HOST"]
    mounts = {ln.split()[4]: ln.split()[5].split(",") for ln in (proc / "mountinfo").read_text().splitlines()}
    assert "ro" in mounts["/"] and "rw" in mounts["/tmp"]
    # (/var/run may be a link to /run: the mount table names the resolved path)
    assert "ro" in mounts[os.path.realpath("/var/run/secrets/kubernetes.io/serviceaccount")]


def test_install_reconciles_a_model_and_uninstall_leaves_no_operator_objects(
    kubeconfig: Path, namespace: str
) -> None:
    install_reconcile_uninstall(kubeconfig, namespace, "namespace")


def install_reconcile_uninstall(
    kubeconfig: Path,
    namespace: str,
    scope: str,
    while_reconciled: Callable[[str, str], None] | None = None,
) -> None:
    """Install the chart with `operator.scope` set to `scope`; its operator pods run as the
    chart says, one holds the Lease, `helm test` passes, the example model is reconciled (under
    the chart's admission policies; `while_reconciled(release, model)` runs then); deleting it
    deletes its ConfigMaps too; then uninstall leaves no operator object (the cluster scope:
    tests/e2e/test_helm_install_cluster_scope.py)."""
    release = f"pdwe2e-{scope[:2]}-{namespace[-6:]}"  # cluster-scoped names must not collide
    scope_values = ["--set", f"operator.scope={scope}"]
    if scope == "namespace":
        scope_values += ["--set", f"operator.watchNamespace={namespace}"]
    proc = helm_install(kubeconfig, "install", release, chart.CHART_DIR, namespace, *scope_values)
    assert proc.returncode == 0, proc.stderr
    selector = f"app.kubernetes.io/instance={release}"
    try:
        pods = get_json(
            kubeconfig, "pods", "-n", namespace, "-l", f"{selector},app.kubernetes.io/component=operator"
        )["items"]
        assert len(pods) == 2  # a leader and a standby
        for pod in pods:
            # The operator runs as a pod with the chart's ServiceAccount (its token is its identity).
            assert pod["spec"]["serviceAccountName"] == f"{release}-pdwarden"
            assert pod["spec"]["containers"][0]["command"] == ["pdwarden", "operator", "run"]
            assert_runs_as_the_chart_says(pod)

        def holder() -> Any:
            lease = get_json(kubeconfig, "leases.coordination.k8s.io", "pdwarden-operator", "-n", namespace)
            return (lease.get("spec") or {}).get("holderIdentity")

        names = [p["metadata"]["name"] for p in pods]
        wait_for(
            lambda: any(str(holder()).startswith(n + "_") for n in names),
            120,
            "one of the operator replicas to hold the Lease",
            2.0,
        )

        assert_helm_test_passes(kubeconfig, namespace, release)

        model = yaml.safe_load(EXAMPLE.read_text())
        model["metadata"]["namespace"] = namespace
        assert kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(model)).returncode == 0
        name = model["metadata"]["name"]

        def reconciled() -> Any:
            dm = get_json(kubeconfig, "disaggregatedmodels", name, "-n", namespace)
            status = dm.get("status") or {}
            deploys = get_json(
                kubeconfig, "deployments", "-n", namespace, "-l", f"{contract.LABEL_MODEL}={name}"
            )
            return (
                status.get("observedGeneration") == dm["metadata"]["generation"]
                and len(deploys["items"]) == 3
            )

        wait_for(reconciled, 180, "the operator pod to reconcile the model", 2.0)
        deploys = get_json(kubeconfig, "deployments", "-n", namespace, "-l", f"{contract.LABEL_MODEL}={name}")
        roles = sorted(d["metadata"]["labels"][contract.LABEL_ROLE] for d in deploys["items"])
        assert roles == ["decode", "prefill", "router"]
        if while_reconciled is not None:
            while_reconciled(release, name)

        # Models go before the operator: their finalizer needs it.
        assert (
            kubectl(
                kubeconfig, "delete", "disaggregatedmodels", name, "-n", namespace, "--timeout=120s"
            ).returncode
            == 0
        )
        # the garbage collector deletes the model's ConfigMaps (its gone-pods list) past the
        # chart's admission policy
        wait_for(
            lambda: (
                not get_json(
                    kubeconfig, "configmaps", "-n", namespace, "-l", f"{contract.LABEL_MODEL}={name}"
                )["items"]
            ),
            120,
            "the model's ConfigMaps to be collected",
            2.0,
        )
    finally:
        # Hook objects are not the release's (Helm leaves them at uninstall): the test's Pod and
        # ServiceAccount go here.
        kubectl(kubeconfig, "delete", "pod,serviceaccount", "-n", namespace, "-l", hook_selector(release))
        proc = helm(kubeconfig, "uninstall", release, "-n", namespace, "--wait", "--timeout", "120s")
    assert proc.returncode == 0, proc.stderr

    def gone() -> bool:
        namespaced = get_json(
            kubeconfig, "deploy,svc,sa,role,rolebinding,pods", "-n", namespace, "-l", selector
        )["items"]
        cluster_wide = get_json(
            kubeconfig,
            "clusterrole,clusterrolebinding,validatingadmissionpolicy,validatingadmissionpolicybinding",
            "-l",
            selector,
        )["items"]
        return not namespaced and not cluster_wide

    wait_for(gone, 120, "every operator object to be deleted", 2.0)
    assert helm(kubeconfig, "status", release, "-n", namespace).returncode != 0

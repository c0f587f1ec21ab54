"""`helm upgrade` from the previous chart (tests/data/charts/pdwarden-0.1.0-d48ec21.tgz, the
chart of commit d48ec21 packaged by `helm package`) with a model running: the chart's
pre-upgrade hook (templates/crd-upgrade.yaml) applies the new CRD, which Helm alone never
would, removes its own objects, and the new operator takes the model over without replacing
any of its Deployments or pods.

Cluster-exclusive (no other e2e module beside it): it puts the previous CRD back on the cluster
(what a previous install left there) for the duration of the test."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

import pdwarden_contract as contract
from pdwarden_demo import chart
from pdwarden_localcluster.waits import wait_for
from pdwarden_operator.crd import CRD_FILENAME, CRD_NAME

from .test_helm_install import EXAMPLE, get_json, helm, helm_install, kubeconfig, kubectl, namespace

pytestmark = [pytest.mark.e2e, pytest.mark.cluster_exclusive]
__all__ = ["kubeconfig", "namespace"]  # the fixtures, shared with test_helm_install

PREVIOUS_CHART = chart.REPO_ROOT / "tests" / "data" / "charts" / "pdwarden-0.1.0-d48ec21.tgz"
CURRENT_CRD = chart.CHART_DIR / "crds" / CRD_FILENAME
# a field the previous CRD does not have and the current one has
NEW_FIELD = "gpuToleration"


def previous_crd() -> str:
    with tarfile.open(PREVIOUS_CHART) as tar:
        member = tar.extractfile(f"pdwarden/crds/{CRD_FILENAME}")
        assert member is not None
        return member.read().decode()


def prefill_properties(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    return dict(schema["properties"]["spec"]["properties"]["prefill"]["properties"])


def worker_key_grant(namespace: str, account: str) -> str:
    """A Role and RoleBinding: `account` may create Secrets in `namespace` (the worker keys)."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "worker-keys", "namespace": namespace},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "worker-keys", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "worker-keys"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }
    return yaml.safe_dump_all([role, binding])


def runtime_state(kubeconfig: Path, namespace: str, model: str) -> dict[str, Any]:
    """The model's pods (by UID) and Deployments (by generation): what an upgrade must keep."""
    selector = f"{contract.LABEL_MODEL}={model}"
    pods = get_json(kubeconfig, "pods", "-n", namespace, "-l", selector)["items"]
    deploys = get_json(kubeconfig, "deployments", "-n", namespace, "-l", selector)["items"]
    return {
        "pods": sorted(p["metadata"]["uid"] for p in pods),
        "deployments": {d["metadata"]["name"]: d["metadata"]["generation"] for d in deploys},
    }


def test_upgrade_from_the_previous_chart_applies_the_new_crd_and_replaces_no_pod(
    kubeconfig: Path, namespace: str
) -> None:
    old = previous_crd()
    assert NEW_FIELD not in old and NEW_FIELD in CURRENT_CRD.read_text(), "the CRDs do not differ"
    release = f"pdwupg-{namespace[-6:]}"
    values = ["--set", "operator.scope=namespace", "--set", f"operator.watchNamespace={namespace}"]
    model = yaml.safe_load(EXAMPLE.read_text())
    model["metadata"]["namespace"] = namespace
    name = model["metadata"]["name"]
    try:
        # the cluster as the previous install left it: its CRD (Helm's crds/ are never upgraded)
        applied = kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=old)
        assert applied.returncode == 0, applied.stderr
        assert NEW_FIELD not in prefill_properties(get_json(kubeconfig, "crd", CRD_NAME))
        proc = helm_install(kubeconfig, "install", release, PREVIOUS_CHART, namespace, *values)
        assert proc.returncode == 0, proc.stderr
        # The rig runs this checkout's operator under either chart, and it creates each model's
        # worker key, which the previous chart's RBAC does not grant (the previous release had no
        # key; upgrading from it rolls every model's pods once, router first, onto one)
        grant = worker_key_grant(namespace, f"{release}-pdwarden")
        assert kubectl(kubeconfig, "apply", "-f", "-", stdin=grant).returncode == 0
        assert kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(model)).returncode == 0

        def running() -> dict[str, Any] | None:
            state = runtime_state(kubeconfig, namespace, name)
            pods = get_json(kubeconfig, "pods", "-n", namespace, "-l", f"{contract.LABEL_MODEL}={name}")[
                "items"
            ]
            ready = [
                p
                for p in pods
                if any(
                    c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])
                )
            ]
            return state if len(state["deployments"]) == 3 and len(ready) == 3 == len(pods) else None

        before = wait_for(running, 240, "the model's three pods Ready under the previous chart", 2.0)

        proc = helm_install(kubeconfig, "upgrade", release, chart.CHART_DIR, namespace, *values)
        assert proc.returncode == 0, proc.stderr
        # the hook applied this operator's CRD, and the API server serves it
        assert NEW_FIELD in prefill_properties(get_json(kubeconfig, "crd", CRD_NAME))
        stored = get_json(kubeconfig, "disaggregatedmodels", name, "-n", namespace)
        assert stored["spec"]["prefill"][NEW_FIELD] is True  # the new schema's default, on read
        # the hook's objects went once it succeeded (hook-delete-policy)
        hook = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=crd-upgrade"
        assert not get_json(kubeconfig, "jobs,serviceaccounts,pods", "-n", namespace, "-l", hook)["items"]
        assert not get_json(kubeconfig, "clusterroles,clusterrolebindings", "-l", hook)["items"]

        # the new operator took the model over (its resume reconciled it) ...
        operators = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=operator"

        def taken_over() -> bool:
            pods = get_json(kubeconfig, "pods", "-n", namespace, "-l", operators)["items"]
            for pod in pods:
                log = kubectl(kubeconfig, "logs", pod["metadata"]["name"], "-n", namespace)
                if f"{namespace}/{name}: reconciled generation" in log.stdout:
                    return True
            return False

        wait_for(taken_over, 180, "the upgraded operator to reconcile the model", 3.0)
        # ... and replaced nothing of it
        assert runtime_state(kubeconfig, namespace, name) == before
    finally:
        kubectl(kubeconfig, "delete", "disaggregatedmodels", name, "-n", namespace, "--timeout=120s")
        helm(kubeconfig, "uninstall", release, "-n", namespace, "--wait", "--timeout", "120s")
        kubectl(
            kubeconfig,
            "delete",
            "job,serviceaccount,clusterrole,clusterrolebinding",
            "-A",
            "-l",
            f"app.kubernetes.io/instance={release}",
        )
        # whatever happened, the cluster serves the current CRD again
        kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(CURRENT_CRD))

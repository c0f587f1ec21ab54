"""The chart's default, an operator in cluster scope: installed, it reconciles a model and
passes `helm test`; uninstalled, it leaves no operator objects (the same checks as the
namespace scope in tests/e2e/test_helm_install.py). Its admission policies hold meanwhile:
RBAC lets the operator's account write ConfigMaps and Services in every namespace, and the
policy refuses every such write to what is not a model's; a tenant who may patch ConfigMaps
cannot forge, relabel or delete the model's list of gone pods, which the operator writes.

Cluster-exclusive (no other e2e module beside it): that operator watches every namespace, other
modules' models included, and the gone-pods policy binds in every namespace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import pdwarden_contract as contract
from pdwarden_localcluster.waits import wait_for

from .test_helm_install import get_json, install_reconcile_uninstall, kubeconfig, kubectl, namespace

pytestmark = [pytest.mark.e2e, pytest.mark.cluster_exclusive]
__all__ = ["kubeconfig", "namespace"]  # the fixtures, shared with test_helm_install

TENANT = "tenant"


def test_a_cluster_scope_install_reconciles_a_model_and_uninstall_leaves_no_operator_objects(
    kubeconfig: Path, namespace: str
) -> None:
    def policies_hold(release: str, model: str) -> None:
        assert_the_operator_writes_only_its_own_objects(kubeconfig, namespace, release)
        assert_a_spec_change_reconciles(kubeconfig, namespace, model)
        assert_only_the_operator_writes_the_gone_pods_list(kubeconfig, namespace, release, model)

    install_reconcile_uninstall(kubeconfig, namespace, "cluster", policies_hold)


def refused(proc: Any, policy: str, message: str) -> None:
    """The API server refused the request with the chart's policy `policy` and `message`."""
    assert proc.returncode != 0, proc.stdout
    assert f"ValidatingAdmissionPolicy '{policy}'" in proc.stderr, proc.stderr
    assert f"denied request: pdwarden: {message}" in proc.stderr, proc.stderr


def assert_the_operator_writes_only_its_own_objects(kubeconfig: Path, namespace: str, release: str) -> None:
    operator = f"system:serviceaccount:{namespace}:{release}-pdwarden"
    policy = f"{namespace}.{release}-pdwarden.operator-writes"

    def can(*args: str) -> bool:
        return kubectl(kubeconfig, "auth", "can-i", *args, "--as", operator).stdout.strip() == "yes"

    def as_operator(*args: str) -> Any:
        return kubectl(kubeconfig, "--as", operator, *args)

    # What RBAC alone lets the operator's account do (a ClusterRole: every namespace)...
    for verb, resource in [
        ("create", "configmaps"),
        ("patch", "configmaps"),
        ("delete", "services"),
        ("patch", "rolebindings.rbac.authorization.k8s.io"),
        ("delete", "networkpolicies.networking.k8s.io"),
    ]:
        assert can(verb, resource, "-n", "kube-system"), (verb, resource)
    assert not can("get", "secrets", "-n", "kube-system")
    # ...and what the admission policy leaves of it: nothing that is not a model's child
    probe = f"pdw-probe-{namespace[-6:]}"
    proc = as_operator("create", "configmap", probe, "-n", "kube-system")
    try:
        refused(proc, policy, "the operator may CREATE only objects it manages")
    finally:
        if proc.returncode == 0:
            kubectl(kubeconfig, "delete", "configmap", probe, "-n", "kube-system")
    # another tenant's objects in a namespace with a model: RBAC lets the operator patch the
    # ConfigMap and patch or delete the Service
    for create in (
        ("create", "configmap", "unrelated"),
        ("create", "service", "clusterip", "unrelated", "--tcp=80:80"),
    ):
        made = kubectl(kubeconfig, *create, "-n", namespace)
        assert made.returncode == 0, made.stderr
    before = {
        obj: get_json(kubeconfig, obj, "-n", namespace)["metadata"]["resourceVersion"]
        for obj in ("configmap/unrelated", "service/unrelated")
    }
    for obj in before:
        refused(
            as_operator("label", obj, "taken=yes", "-n", namespace),
            policy,
            "the operator may UPDATE only objects it manages "
            f"(label {contract.LABEL_MANAGED_BY}={contract.MANAGED_BY} and a {contract.KIND} as controller)",
        )
    refused(
        as_operator("delete", "service/unrelated", "-n", namespace),
        policy,
        "the operator may DELETE only objects it manages",
    )
    for obj, version in before.items():
        assert get_json(kubeconfig, obj, "-n", namespace)["metadata"]["resourceVersion"] == version
    # a Deployment that is not a model's prefill or decode cannot be scaled through it (the
    # operator's own, asked for the count it has: nothing would change were it admitted)
    refused(
        as_operator("scale", "deployment", release + "-pdwarden", "--replicas=2", "-n", namespace),
        policy,
        "the operator scales only the prefill and decode Deployments of models",
    )


def assert_a_spec_change_reconciles(kubeconfig: Path, namespace: str, model: str) -> None:
    """A spec change is reconciled under the policy: the pass makes sure the model's worker key
    Secret still exists (a dry-run create, which the policy judges like any write)."""
    patch = json.dumps({"spec": {"watchdog": {"maxRemediations": 4}}})
    proc = kubectl(
        kubeconfig, "patch", "disaggregatedmodels", model, "-n", namespace, "--type=merge", "-p", patch
    )
    assert proc.returncode == 0, proc.stderr

    def observed() -> Any:
        dm = get_json(kubeconfig, "disaggregatedmodels", model, "-n", namespace)
        status = dm.get("status") or {}
        return status if status.get("observedGeneration") == dm["metadata"]["generation"] else None

    status = wait_for(observed, 120, "the spec change to be reconciled", 2.0)
    reasons = {c.get("reason") for c in status.get("conditions") or []}
    assert not reasons & {"WorkerKeyFailed", "ApplyFailed", "NameTaken"}, status["conditions"]


def assert_only_the_operator_writes_the_gone_pods_list(
    kubeconfig: Path, namespace: str, release: str, model: str
) -> None:
    policy = f"{namespace}.{release}-pdwarden.gone-pods"
    name = f"{model}-{contract.GONE_PODS_SUFFIX}"
    tenant = f"system:serviceaccount:{namespace}:{TENANT}"
    for args in (
        ("create", "serviceaccount", TENANT),
        (
            "create",
            "role",
            "configmap-editor",
            "--resource=configmaps",
            "--verb=get,create,update,patch,delete",
        ),
        (
            "create",
            "rolebinding",
            "configmap-editor",
            "--role=configmap-editor",
            f"--serviceaccount={namespace}:{TENANT}",
        ),
    ):
        proc = kubectl(kubeconfig, *args, "-n", namespace)
        assert proc.returncode == 0, proc.stderr

    def as_tenant(*args: str) -> Any:
        return kubectl(kubeconfig, "--as", tenant, *args, "-n", namespace)

    answer = kubectl(
        kubeconfig, "auth", "can-i", "patch", f"configmaps/{name}", "-n", namespace, "--as", tenant
    )
    assert answer.stdout.strip() == "yes"  # RBAC lets the tenant; the policy does not
    message = f"ConfigMap {namespace}/{name} lists a model's gone runtime pods; "
    message += "only the pdwarden operator writes it"
    # the name before the operator wrote it: a list a runtime pod would mount
    forged = json.dumps({"gone": []})
    refused(
        as_tenant("create", "configmap", name, f"--from-literal={contract.GONE_PODS_KEY}={forged}"),
        policy,
        f"{message} (CREATE refused)",
    )

    # a prefill pod the watchdog has seen goes: the operator lists it, past both policies
    def prefill() -> Any:
        selector = f"{contract.LABEL_MODEL}={model},{contract.LABEL_ROLE}={contract.ROLE_PREFILL}"
        pods = get_json(kubeconfig, "pods", "-n", namespace, "-l", selector)["items"]
        dm = get_json(kubeconfig, "disaggregatedmodels", model, "-n", namespace)
        watched = ((dm.get("status") or {}).get("watchdog") or {}).get("lastScrape")
        return pods[0] if pods and watched else None

    pod = wait_for(prefill, 240, "a watchdog round over the model's pods", 2.0)
    assert kubectl(kubeconfig, "delete", "pod", pod["metadata"]["name"], "-n", namespace).returncode == 0

    def listed() -> Any:
        proc = kubectl(kubeconfig, "get", "configmap", name, "-n", namespace, "-o", "json")
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    written = wait_for(listed, 120, "the operator to list the gone prefill", 2.0)
    gone = json.loads(written["data"][contract.GONE_PODS_KEY])["gone"]
    assert pod["metadata"]["uid"] in [entry["uid"] for entry in gone]
    assert written["metadata"]["labels"][contract.LABEL_MANAGED_BY] == contract.MANAGED_BY

    # the tenant may neither rewrite it, nor take pdwarden's labels off it, nor delete it
    patch = json.dumps({"data": {contract.GONE_PODS_KEY: forged}})
    refused(
        as_tenant("patch", "configmap", name, "--type=merge", "-p", patch),
        policy,
        f"{message} (UPDATE refused)",
    )
    refused(
        as_tenant("label", "configmap", name, f"{contract.LABEL_MANAGED_BY}-", f"{contract.LABEL_MODEL}-"),
        policy,
        f"{message} (UPDATE refused)",
    )
    refused(as_tenant("delete", "configmap", name), policy, f"{message} (DELETE refused)")
    assert listed()["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]

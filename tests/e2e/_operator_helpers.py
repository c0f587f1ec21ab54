"""Shared helpers of the operator e2e tests: kubectl with the CRD, namespaces, conditions."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pdwarden_localcluster.waits import WaitTimeout, wait_for
from pdwarden_testkit.kubectl import Kubectl
from pdwarden_testkit.operator_process import OperatorProcess
from pdwarden_testkit.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "pdwarden.io_disaggregatedmodels.yaml"
# The kinds (kubectl's names) of a model's children.
CHILD_RESOURCES = (
    "deployments",
    "services",
    "serviceaccounts",
    "roles",
    "rolebindings",
    "poddisruptionbudgets",
    "networkpolicies",
)


def idle_model(name: str, namespace: str | None = None) -> dict[str, Any]:
    """A synthetic model with no pods: the operator reconciles its children, nothing runs."""
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {
        "apiVersion": "pdwarden.io/v1alpha1",
        "kind": "DisaggregatedModel",
        "metadata": meta,
        "spec": {
            "model": {"path": "synthetic/tiny"},
            "engine": "synthetic",
            **{role: {"replicas": 0} for role in ("prefill", "decode", "router")},
        },
    }


def kubectl_with_crd(kubeconfig: str | Path) -> Kubectl:
    """kubectl for the cluster, with the DisaggregatedModel CRD applied and Established."""
    k = Kubectl(kubeconfig)
    k.run("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    k.run("wait", "--for=condition=Established", "crd/disaggregatedmodels.pdwarden.io", "--timeout=60s")
    return k


def operator_for_prefix(
    kubectl: Kubectl, ns_prefix: str, log: Path, **options: Any
) -> Iterator[OperatorProcess]:
    """An operator watching the namespaces that start with `ns_prefix`, for a module's tests,
    yielded once it sees namespaces created after its start (`options`: OperatorProcess's)."""
    # a Lease of its own: operators of other modules, running beside it on another worker,
    # would otherwise share the default one (namespace default) and only one of them would act
    lease = ("--leader-election-id", f"pdwarden-e2e-{ns_prefix.rstrip('-')}")
    extra = (*lease, *options.pop("extra_args", ()))
    with OperatorProcess(
        kubectl.env["KUBECONFIG"], namespaces=(f"{ns_prefix}*",), log_path=log, extra_args=extra, **options
    ) as op:
        wait_watching_new_namespaces(kubectl, ns_prefix)
        yield op
    print(f"operator log: {log}")


def operator_module_fixtures(
    ns_prefix: str, *, metrics: bool = False, **options: Any
) -> tuple[Any, Any, Any]:
    """The `kubectl`, `operator` and `namespace` fixtures of an operator e2e module whose
    namespaces start with `ns_prefix` (assign them at module level under those names).
    `metrics`: the operator serves its metrics on a free port; `options`: OperatorProcess's."""

    @pytest.fixture(scope="module")
    def kubectl(cluster: Any) -> Kubectl:
        return kubectl_with_crd(cluster.kubeconfig)

    @pytest.fixture(scope="module")
    def operator(kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
        port = {"metrics_port": free_port()} if metrics else {}
        yield from operator_for_prefix(
            kubectl, ns_prefix, tmp_path_factory.mktemp("operator") / "operator.log", **port, **options
        )

    @pytest.fixture
    def namespace(kubectl: Kubectl) -> Iterator[str]:
        yield from new_namespace(kubectl, ns_prefix)

    return kubectl, operator, namespace


def new_namespace(kubectl: Kubectl, prefix: str) -> Iterator[str]:
    ns = f"{prefix}{uuid.uuid4().hex[:6]}"
    kubectl.run("create", "namespace", ns)
    try:
        yield ns
    finally:
        kubectl.run("delete", "namespace", ns, "--wait=false", check=False)


def wait_watching_new_namespaces(kubectl: Kubectl, prefix: str, timeout: float = 180) -> None:
    """Until an operator started with `--namespace '<prefix>*'` reconciles a model in a
    namespace created after it started.

    kopf lists the namespaces, then starts a watch whose own first listing it ignores: a
    namespace created between the two is not seen until it changes (its deletion). A probe
    namespace that fell in that gap is dropped and another one tried; once one is reconciled,
    namespaces created later reach the operator through the watch.
    """
    probe = idle_model("probe")
    deadline = time.monotonic() + timeout
    while True:
        for ns in new_namespace(kubectl, prefix):
            kubectl.apply(probe, ns)

            def reconciled(ns: str = ns) -> Any:
                dm = kubectl.get("disaggregatedmodel", "probe", ns) or {}
                return (dm.get("status") or {}).get("observedGeneration")

            try:
                wait_for(reconciled, 30, f"the operator to reconcile a model in namespace {ns}", 1.0)
                return
            except WaitTimeout:
                if time.monotonic() >= deadline:
                    raise


def condition(dm: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    for c in ((dm or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return dict(c)
    return {}

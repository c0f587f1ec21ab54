"""Shared helpers of the operator e2e tests: kubectl with the CRD, namespaces, conditions."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pdwarden_bench.operator_process import OperatorProcess
from pdwarden_localcluster.testing import Kubectl

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "pdwarden.io_disaggregatedmodels.yaml"


def kubectl_with_crd(kubeconfig: str | Path) -> Kubectl:
    """kubectl for the cluster, with the DisaggregatedModel CRD applied and Established."""
    k = Kubectl(kubeconfig)
    k.run("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    k.run("wait", "--for=condition=Established", "crd/disaggregatedmodels.pdwarden.io", "--timeout=60s")
    return k


def operator_for_prefix(kubeconfig: str | Path, ns_prefix: str, log: Path) -> Iterator[OperatorProcess]:
    """An operator watching the namespaces that start with `ns_prefix`, for a module's tests."""
    with OperatorProcess(kubeconfig, namespaces=(f"{ns_prefix}*",), log_path=log) as op:
        yield op
    print(f"operator log: {log}")


def new_namespace(kubectl: Kubectl, prefix: str) -> Iterator[str]:
    ns = f"{prefix}{uuid.uuid4().hex[:6]}"
    kubectl.run("create", "namespace", ns)
    try:
        yield ns
    finally:
        kubectl.run("delete", "namespace", ns, "--wait=false", check=False)


def condition(dm: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    for c in ((dm or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return dict(c)
    return {}

"""A stored model that a newer rule refuses (the API server never re-validates a stored
object) is reported Degraded by the operator, with the field named.

Cluster-exclusive (no other e2e module beside it): the CRD is swapped for an older one (without
its CEL rules) for a moment, and no other module may apply a model or keep one on the cluster
meanwhile."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.kubectl import Kubectl
from pdwarden_testkit.operator_process import OperatorProcess

from ._operator_helpers import CRD_FILE, idle_model, kubectl_with_crd, new_namespace

pytestmark = [pytest.mark.e2e, pytest.mark.cluster_exclusive]


def without_cel_rules(node: Any) -> Any:
    """The schema with every x-kubernetes-validations rule dropped (what an older CRD lacked)."""
    if isinstance(node, dict):
        return {k: without_cel_rules(v) for k, v in node.items() if k != "x-kubernetes-validations"}
    if isinstance(node, list):
        return [without_cel_rules(v) for v in node]
    return node


@pytest.fixture(scope="module")
def kubectl(cluster) -> Kubectl:  # type: ignore[no-untyped-def]
    return kubectl_with_crd(cluster.kubeconfig)


@pytest.fixture
def own_namespace(kubectl: Kubectl) -> Iterator[str]:
    yield from new_namespace(kubectl, "pdwe-outlived-")


def test_a_stored_model_that_the_operator_now_refuses_is_degraded_with_the_field_named(
    kubectl: Kubectl, own_namespace: str, tmp_path: Path
) -> None:
    """After an upgrade, a model stored under an older CRD (the API server never re-validates a
    stored object) may break a rule that is new: the operator says so in its status, it does
    not go silently idle."""
    namespace = own_namespace
    crd = yaml.safe_load(CRD_FILE.read_text())
    model = idle_model("outlived", namespace)
    # valid once, refused now: the watchdog acts before the runtime's own deadline (300 s)
    model["spec"]["watchdog"] = {"stuckAfterSeconds": 60}
    try:
        kubectl.run(
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            "-",
            stdin=yaml.safe_dump(without_cel_rules(crd)),
        )
        kubectl.apply(model, namespace)
    finally:
        kubectl_with_crd(kubectl.env["KUBECONFIG"])  # the CRD of this version again
    # the CRD of this version refuses such a model when it is created (an update that leaves
    # the field as it was passes: the API server ratchets CRD validation)
    fresh = {**model, "metadata": {**model["metadata"], "name": "outlived-new"}}
    refused = kubectl.run(
        "apply", "-n", namespace, "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(fresh), check=False
    )
    assert refused.returncode != 0 and "stuckAfterSeconds" in refused.stderr, refused.stderr

    with OperatorProcess(
        kubectl.env["KUBECONFIG"],
        namespaces=(namespace,),
        log_path=tmp_path / "operator.log",
        # a Lease of its own: another module's operator may hold the default one
        extra_args=("--leader-election-id", "pdwarden-e2e-outlived"),
    ):

        def degraded() -> dict[str, Any] | None:
            status = (
                kubectl.json("get", "disaggregatedmodels", "outlived", "-n", namespace).get("status") or {}
            )
            conditions = {c["type"]: c for c in status.get("conditions") or []}
            found = conditions.get("Degraded")
            return status if found and found["status"] == "True" else None

        status = wait_for(degraded, 120, "the operator to mark the model Degraded", 1.0)
    (condition,) = [c for c in status["conditions"] if c["type"] == "Degraded"]
    assert "watchdog.stuckAfterSeconds" in condition["message"], condition
    assert "transfer.inflightDeadlineSeconds" in condition["message"], condition
    assert status["phase"] == "Degraded"
    # nothing was made for a spec the operator cannot read
    assert kubectl.items("deployments", namespace) == []

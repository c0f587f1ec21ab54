"""The chart's default, an operator in cluster scope: installed, it reconciles a model and
passes `helm test`; uninstalled, it leaves no operator objects (the same checks as the
namespace scope in tests/e2e/test_helm_install.py).

Cluster-exclusive (no other e2e module beside it): that operator watches every namespace, other
modules' models included."""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_helm_install import install_reconcile_uninstall, kubeconfig, namespace

pytestmark = [pytest.mark.e2e, pytest.mark.cluster_exclusive]
__all__ = ["kubeconfig", "namespace"]  # the fixtures, shared with test_helm_install


def test_a_cluster_scope_install_reconciles_a_model_and_uninstall_leaves_no_operator_objects(
    kubeconfig: Path, namespace: str
) -> None:
    install_reconcile_uninstall(kubeconfig, namespace, "cluster")

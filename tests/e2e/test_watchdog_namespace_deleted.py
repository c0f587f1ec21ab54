"""Models whose namespace is deleted leave nothing behind in the operator: their watchdog
rounds stop, their series leave its /metrics (a stale wedged-pods series would keep an alert
firing for a model that no longer exists), and the reconciler stops retrying them.

The operator watches a namespace pattern, as a user's does with `--namespace 'team-*'`: kopf
stops watching a matching namespace as soon as its deletion starts, before the models in it are
deleted, so their deletion never reaches the operator as an event.
"""

from __future__ import annotations

import pytest

import pdwarden_contract as contract
from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.cluster_env import API_TRANSIENT, Env, operator_page
from pdwarden_testkit.kubectl import Kubectl
from pdwarden_testkit.operator_process import OperatorProcess
from pdwarden_testkit.promtext import samples

from ._operator_helpers import idle_model, operator_module_fixtures

pytestmark = pytest.mark.e2e

# `env` (tests/e2e/conftest.py) takes this module's `namespace`: one under the operator's pattern
kubectl, operator, namespace = operator_module_fixtures("pdwe-nsgone-", metrics=True)

WATCHDOG = {"stuckAfterSeconds": 20, "scrapeIntervalSeconds": 2}


def _series(op: OperatorProcess, namespace: str) -> list[str]:
    """The operator's series that name `namespace`."""
    return sorted({s.name for s in samples(operator_page(op)) if s.labels.get("namespace") == namespace})


def test_deleting_a_models_namespace_ends_its_watchdog_and_its_series(
    kubectl: Kubectl, operator: OperatorProcess, env: Env
) -> None:
    name = "gone"
    env.create_dm(name, WATCHDOG, replicas=1)
    # and a model that never becomes Ready (no node matches): the reconciler keeps passing
    # over it, so nothing of it may stay behind either
    pending = idle_model("pending", env.namespace)
    pending["spec"]["decode"] = {
        "replicas": 1,
        "podTemplate": {"spec": {"nodeSelector": {"pdwarden.io/test-no-such-node": "true"}}},
    }
    kubectl.apply(pending, env.namespace)
    wait_for(
        lambda: all(env.live_ready_pods(name, r) for r in contract.RUNTIME_ROLES),
        240,
        "the model's runtime pods Ready",
        1.0,
        API_TRANSIENT,
    )
    wedged = contract.METRIC_OPERATOR_WEDGED_PODS
    wait_for(
        lambda: wedged in _series(operator, env.namespace),
        120,
        "the watchdog's series for the model",
        1.0,
    )
    kubectl.run("delete", "namespace", env.namespace, "--wait=false")
    wait_for(
        lambda: not _series(operator, env.namespace),
        60,
        f"the operator to drop namespace {env.namespace}'s series",
        1.0,
    )
    assert operator.log_path is not None
    lines = operator.log_path.read_text().splitlines()

    def said(what: str, model: str) -> bool:
        return any(what in line and f"{env.namespace}/{model}:" in line for line in lines)

    for model in (name, "pending"):
        assert said("forgotten: its namespace is being deleted", model), model
    # every store forgot the model at once (model_registry.py), its running watchdog with them
    assert said("watchdog stopped", name)

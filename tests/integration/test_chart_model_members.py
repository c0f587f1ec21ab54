"""The chart's model-members ValidatingAdmissionPolicy as helm renders it: what it judges, who it
names, where it is bound, and its switch. Its decisions on a real API server and controllers:
tests/e2e/test_model_members_policy.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import yaml

import pdwarden_contract as contract
from pdwarden_demo import chart

from .test_chart_render import NAMESPACE, cel, helm, matched, render

pytestmark = pytest.mark.integration

NAME = f"{NAMESPACE}.pdw-pdwarden.model-members"
OPERATOR_USER = f"system:serviceaccount:{NAMESPACE}:pdw-pdwarden"
CONTROLLERS = "system:serviceaccount:kube-system:"


def default_values() -> dict[str, Any]:
    return dict(yaml.safe_load((chart.CHART_DIR / "values.yaml").read_text()))


def policy_and_binding(docs: list[dict[str, Any]]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    (policy,) = [
        d for d in chart.find_objects(docs, "ValidatingAdmissionPolicy") if d["metadata"]["name"] == NAME
    ]
    (binding,) = [
        d
        for d in chart.find_objects(docs, "ValidatingAdmissionPolicyBinding")
        if d["metadata"]["name"] == NAME
    ]
    return policy, binding


@pytest.mark.parametrize("scope", ["cluster", "namespace"])
def test_the_model_members_policy_judges_every_maker_of_pods_with_a_models_labels(scope: str) -> None:
    docs = render({"operator.scope": scope, "operator.watchNamespace": "ml"})
    policy, binding = policy_and_binding(docs)
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"]["policyName"] == NAME and binding["spec"]["validationActions"] == ["Deny"]
    # creating and changing pods and the workloads that make them; never deleting (the garbage
    # collector's), nor a subresource (status, scale, eviction carry no labels)
    workloads = ("pods", "replicasets", "deployments", "statefulsets")
    assert matched(policy) == {
        ("apps" if r != "pods" else "", r, op) for r in workloads for op in ("CREATE", "UPDATE")
    }
    (condition,) = policy["spec"]["matchConditions"]
    for needed in (
        f"'{contract.LABEL_MODEL}'",
        f"'{contract.LABEL_ROLE}'",
        "o.spec.template.metadata.labels",
    ):
        assert needed in condition["expression"], needed
    text = cel(policy)
    for needed in (
        f'"{OPERATOR_USER}"',
        # kube-controller-manager with and without --use-service-account-credentials
        "'system:kube-controller-manager'",
        f"'{CONTROLLERS}deployment-controller'",
        f"'{CONTROLLERS}replicaset-controller'",
        f"'{CONTROLLERS}statefulset-controller'",
        f"'{CONTROLLERS}generic-garbage-collector'",
        "'replicaset-controller', 'statefulset-controller'",  # who changes a pod
        # a controller creates a member only for the workload that controls it
        "'Deployment' in variables.controlledBy",
        "'ReplicaSet' in variables.controlledBy",
        "'StatefulSet' in variables.controlledBy",
        "r.apiVersion == 'apps/v1'",
        # an update adding the labels, and one changing their values
        "variables.wasMember",
        "variables.storedIdentity == variables.writtenIdentity",
    ):
        assert needed in text, needed
    assert all(v["reason"] == "Forbidden" for v in policy["spec"]["validations"])
    assert all(v["messageExpression"].startswith("'pdwarden: ") for v in policy["spec"]["validations"])
    if scope == "cluster":
        assert "matchResources" not in binding["spec"]
    else:  # one operator per tenant namespace: its release guards that namespace's models
        selector = binding["spec"]["matchResources"]["namespaceSelector"]
        assert selector == {"matchLabels": {"kubernetes.io/metadata.name": "ml"}}


def test_the_policy_names_the_operators_own_service_account() -> None:
    docs = render({"serviceAccount.name": "warden"})
    policy, _ = policy_and_binding(docs)
    assert f'"system:serviceaccount:{NAMESPACE}:warden"' in cel(policy)
    assert OPERATOR_USER not in cel(policy)


def test_the_model_members_policy_is_on_by_default_and_can_be_turned_off() -> None:
    values = default_values()
    assert values["memberLabelsPolicy"] == {"enabled": True}
    on = [d["metadata"]["name"] for d in render() if d["kind"].startswith("ValidatingAdmissionPolicy")]
    assert on.count(NAME) == 2  # the policy and its binding
    off = render({"memberLabelsPolicy.enabled": "false"})
    assert NAME not in [
        d["metadata"]["name"] for d in off if d["kind"].startswith("ValidatingAdmissionPolicy")
    ]
    # the Kubernetes it needs (admissionregistration.k8s.io/v1: 1.30), the chart's other
    # admission policies off
    only: list[str] = []
    for key, block in (values.get("admissionPolicies") or {}).items():
        if isinstance(block, dict) and "enabled" in block:
            only += ["--set", f"admissionPolicies.{key}.enabled=false"]
    proc = helm("template", "pdw", str(chart.CHART_DIR), "--kube-version", "1.29.0", *only)
    assert proc.returncode != 0
    assert "memberLabelsPolicy.enabled=false" in proc.stderr, proc.stderr
    proc = helm(
        "template",
        "pdw",
        str(chart.CHART_DIR),
        "--kube-version",
        "1.29.0",
        *only,
        "--set",
        "memberLabelsPolicy.enabled=false",
    )
    assert proc.returncode == 0, proc.stderr

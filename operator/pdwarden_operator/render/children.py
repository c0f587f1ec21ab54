"""The catalogue of a model's children: every child rendered for one spec, how a child is
matched with the cluster's, and where in the spec its content comes from."""

from __future__ import annotations

import pdwarden_contract as contract
from pdwarden_contract import ROLES
from pdwarden_operator.models import DisaggregatedModelSpec
from pdwarden_operator.render.accounts import (
    router_role,
    router_role_binding,
    router_service_account,
    runtime_service_account,
)
from pdwarden_operator.render.disruption import pod_disruption_budgets
from pdwarden_operator.render.kinds import NETWORK_POLICY, POD_MAKING_KINDS
from pdwarden_operator.render.meta import Obj, Owner
from pdwarden_operator.render.network import network_policy, router_network_policy, router_service
from pdwarden_operator.render.router import router_deployment
from pdwarden_operator.render.runtime import runtime_workloads


def spec_field(obj: Obj) -> str:
    """The part of the spec a child's content comes from (for messages)."""
    role = obj["metadata"]["labels"].get(contract.LABEL_ROLE, "")
    if obj["kind"] == NETWORK_POLICY.kind:
        return "spec.networkPolicy"
    if obj["kind"] in POD_MAKING_KINDS and role in ROLES:
        return f"spec.{role} (podTemplate, resources, env, image)"
    return "spec"


def render_children(owner: Owner, spec: DisaggregatedModelSpec) -> list[Obj]:
    """Every child of one DisaggregatedModel; reconcile applies them in `plan.apply_waves`'
    order (what pods depend on first), each wave at once."""
    return [
        *runtime_workloads(owner, spec, contract.ROLE_PREFILL),
        *runtime_workloads(owner, spec, contract.ROLE_DECODE),
        runtime_service_account(owner),
        router_service_account(owner),
        router_role(owner),
        router_role_binding(owner),
        router_deployment(owner, spec),
        router_service(owner),
        *pod_disruption_budgets(owner, spec),
        *(
            [network_policy(owner, spec), router_network_policy(owner, spec)]
            if spec.network_policy.enabled
            else []
        ),
    ]


def child_key(obj: Obj) -> tuple[str, str]:
    """(kind, name): how children are matched with what the cluster holds."""
    return obj["kind"], obj["metadata"]["name"]

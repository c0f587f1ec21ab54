"""Who the model's pods run as: the runtime pods' ServiceAccount (no token), the router's, and
the router's Role to read pods for discovery."""

from __future__ import annotations

from typing import Final

import pdwarden_contract as contract
from pdwarden_operator.render.kinds import RBAC_ROLE, ROLE_BINDING, SERVICE_ACCOUNT
from pdwarden_operator.render.meta import Obj, Owner, child_metadata, child_name

# The prefill and decode pods' ServiceAccount: one per model, with no token, so that a runtime
# pod never runs as the namespace's default account (which others may have granted rights to).
RUNTIME_ACCOUNT: Final = "runtime"


def runtime_service_account_name(model: str) -> str:
    return child_name(model, RUNTIME_ACCOUNT)


def runtime_service_account(owner: Owner) -> Obj:
    return {
        **SERVICE_ACCOUNT.type_meta(),
        "metadata": child_metadata(owner, runtime_service_account_name(owner.name), RUNTIME_ACCOUNT),
        "automountServiceAccountToken": False,
    }


def router_service_account(owner: Owner) -> Obj:
    role = contract.ROLE_ROUTER
    return {
        **SERVICE_ACCOUNT.type_meta(),
        "metadata": child_metadata(owner, child_name(owner.name, role), role),
    }


def router_role(owner: Owner) -> Obj:
    role = contract.ROLE_ROUTER
    return {
        **RBAC_ROLE.type_meta(),
        "metadata": child_metadata(owner, child_name(owner.name, role), role),
        # Service discovery only reads pods in its own namespace.
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }


def router_role_binding(owner: Owner) -> Obj:
    role = contract.ROLE_ROUTER
    name = child_name(owner.name, role)
    return {
        **ROLE_BINDING.type_meta(),
        "metadata": child_metadata(owner, name, role),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": RBAC_ROLE.kind, "name": name},
        "subjects": [{"kind": SERVICE_ACCOUNT.kind, "name": name, "namespace": owner.namespace}],
    }

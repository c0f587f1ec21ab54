"""The kinds a model's children may be, in one table: what each kind is to the operator (applied
and watched by every pass, deleted once no longer rendered, dry-run first, applied after what
its pods name). Everything else that sorts children by kind is derived from it.

Not in the table: the worker key's Secret (render/worker_key.py), which reconcile only creates
(the operator may not read Secrets), and the gone-pods ConfigMap (render/gone_pods.py), which
the watchdog writes (watchdog/gone_list.py); neither is watched, and no pass deletes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class ChildKind:
    """One kind of child."""

    api_version: str
    kind: str
    # Rendered only when the spec asks for it: one observed but no longer rendered is deleted
    # (a group's StatefulSet after a scale-down, a role's Deployment or ranks Service after its
    # nodesPerReplica changed, a role's PodDisruptionBudget once it is scaled to zero).
    optional: bool = False
    # Its content the spec shapes freely (a pod template, NetworkPolicy peers): the API server
    # dry-runs it before anything is applied.
    user_shaped: bool = False
    # It makes pods: applied after what its pods name or are covered by (plan.apply_waves).
    makes_pods: bool = False

    def type_meta(self) -> dict[str, str]:
        """The child's apiVersion and kind, as its object begins."""
        return {"apiVersion": self.api_version, "kind": self.kind}


DEPLOYMENT: Final = ChildKind("apps/v1", "Deployment", optional=True, user_shaped=True, makes_pods=True)
STATEFUL_SET: Final = ChildKind("apps/v1", "StatefulSet", optional=True, user_shaped=True, makes_pods=True)
SERVICE: Final = ChildKind("v1", "Service", optional=True)
SERVICE_ACCOUNT: Final = ChildKind("v1", "ServiceAccount")
RBAC_ROLE: Final = ChildKind("rbac.authorization.k8s.io/v1", "Role")
ROLE_BINDING: Final = ChildKind("rbac.authorization.k8s.io/v1", "RoleBinding")
POD_DISRUPTION_BUDGET: Final = ChildKind("policy/v1", "PodDisruptionBudget", optional=True)
NETWORK_POLICY: Final = ChildKind("networking.k8s.io/v1", "NetworkPolicy", optional=True, user_shaped=True)

CHILD_KIND_TABLE: Final = (
    DEPLOYMENT,
    STATEFUL_SET,
    SERVICE,
    SERVICE_ACCOUNT,
    RBAC_ROLE,
    ROLE_BINDING,
    POD_DISRUPTION_BUDGET,
    NETWORK_POLICY,
)

# Every kind as (apiVersion, kind): the operator watches, lists before start and may delete
# these (handlers.py), and the chart's RBAC grants them.
CHILD_KINDS: Final = tuple((k.api_version, k.kind) for k in CHILD_KIND_TABLE)
OPTIONAL_KINDS: Final = frozenset(k.kind for k in CHILD_KIND_TABLE if k.optional)
USER_SHAPED_KINDS: Final = frozenset(k.kind for k in CHILD_KIND_TABLE if k.user_shaped)
POD_MAKING_KINDS: Final = frozenset(k.kind for k in CHILD_KIND_TABLE if k.makes_pods)

"""How many replicas a role runs: the spec's count, or, for an autoscaled role, the count its
Deployment holds (the autoscaler's, pdwarden's or an external one's) kept within the bounds.

The Deployment is where an autoscaled count lives, so the reconciler re-applying a spec never
undoes a scaling step: it renders the count the Deployment already has. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pdwarden_contract as contract
from pdwarden_operator.models import DisaggregatedModelSpec
from pdwarden_operator.resource.autoscaling import AutoscalingSpec
from pdwarden_operator.resource.roles import RoleSpec


def bounded(scaling: AutoscalingSpec, count: int) -> int:
    return max(scaling.min_replicas, min(scaling.max_replicas, count))


def in_effect(role: RoleSpec, deployed: int | None) -> int:
    """The count to render: the spec's, or for an autoscaled role the Deployment's (`deployed`;
    None before it exists, when the spec's `replicas` is the first count) within the bounds."""
    if role.autoscaling is None:
        return role.replicas
    return bounded(role.autoscaling, role.replicas if deployed is None else deployed)


def deployed(deployment: Mapping[str, Any] | None) -> int | None:
    """A Deployment body's `.spec.replicas` (None: no Deployment, or no count in it)."""
    if deployment is None:
        return None
    value = (deployment.get("spec") or {}).get("replicas")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def desired(spec: DisaggregatedModelSpec, role: str, deployed_count: int | None) -> int:
    """Replicas the role should have, router included."""
    if role == contract.ROLE_ROUTER:
        return spec.router.replicas
    return in_effect(spec.role(role), deployed_count)

"""The PodDisruptionBudgets that bound how many of a role's pods a voluntary disruption (a
node drain, the watchdog's evictions) takes at once."""

from __future__ import annotations

from pdwarden_contract import ROLES
from pdwarden_operator import replicas
from pdwarden_operator.models import DisaggregatedModelSpec
from pdwarden_operator.render.kinds import POD_DISRUPTION_BUDGET
from pdwarden_operator.render.meta import Obj, Owner, child_metadata, child_name, selector_labels


def pod_disruption_budgets(owner: Owner, spec: DisaggregatedModelSpec) -> list[Obj]:
    """A budget for each role that runs pods. A role scaled to zero gets none (an autoscaled
    role never is: its floor is one pod): there is nothing to protect, and the budget, its
    status and the disruption controller's `NoPods` event (created, then updated) were 12 of
    the 46 API writes a new idle model cost. Scaling the role up renders the budget again;
    scaling it to zero deletes it (`kinds.OPTIONAL_KINDS`)."""
    return [
        pod_disruption_budget(owner, spec, role)
        for role in ROLES
        if replicas.desired(spec, role, owner.deployed.get(role)) > 0
    ]


def pod_disruption_budget(owner: Owner, spec: DisaggregatedModelSpec, role: str) -> Obj:
    return {
        **POD_DISRUPTION_BUDGET.type_meta(),
        "metadata": child_metadata(owner, child_name(owner.name, role), role),
        "spec": {
            "maxUnavailable": spec.watchdog.max_unavailable,
            "selector": {"matchLabels": selector_labels(owner.name, role)},
        },
    }

"""Why pods do not run (the scheduler's reason, an admission refusal) reaches the Ready condition."""

from __future__ import annotations

from typing import Any

import pytest

from pdwarden_operator.models import parse_spec
from pdwarden_operator.scheduling import pods_not_ready, refused, unschedulable
from pdwarden_operator.status import Observed, Workload, compute_conditions

pytestmark = pytest.mark.unit

TAINT = "0/1 nodes are available: 1 node(s) had untolerated taint(s)."
PSA = 'pods "m-prefill-x" is forbidden: violates PodSecurity "baseline:latest": non-default capabilities'


def _pod(name: str, role: str, phase: str, scheduled: dict[str, Any] | None) -> dict[str, Any]:
    conds = [{"type": "PodScheduled", **scheduled}] if scheduled else []
    return {
        "metadata": {"name": name, "labels": {"pdwarden.io/role": role}},
        "status": {"phase": phase, "conditions": conds},
    }


def test_unschedulable_pods_give_one_message_per_role() -> None:
    pending = {"status": "False", "reason": "Unschedulable", "message": TAINT}
    pods = [
        _pod("m-prefill-b", "prefill", "Pending", pending),
        _pod("m-prefill-a", "prefill", "Pending", pending),
        _pod("m-decode-a", "decode", "Running", {"status": "True"}),
        _pod("m-router-a", "router", "Pending", {"status": "False", "reason": "SchedulerError"}),
        {"metadata": {}, "status": None},
    ]
    assert unschedulable(pods) == {"prefill": f"the scheduler cannot place pod m-prefill-a: {TAINT}"}
    assert unschedulable([]) == {}


def test_refused_pods_come_from_the_deployments_replica_failure() -> None:
    failing = {
        "metadata": {"labels": {"pdwarden.io/role": "prefill"}},
        "status": {"conditions": [{"type": "ReplicaFailure", "status": "True", "message": PSA}]},
    }
    fine = {"metadata": {"labels": {"pdwarden.io/role": "decode"}}, "status": {"conditions": []}}
    assert refused([failing, fine, {}]) == {"prefill": f"pods are refused: {PSA}"}


def test_ready_condition_names_why_pods_do_not_run() -> None:
    spec = parse_spec({"model": {"path": "m"}, "engine": "synthetic"})
    waiting = Workload(present=True, spec_replicas=1, replicas=1, ready=0, updated=1, up_to_date=True)
    observed = Observed(
        generation=1,
        workloads={"prefill": waiting, "decode": waiting, "router": waiting},
        blocked={"prefill": f"the scheduler cannot place pod p: {TAINT}"},
    )
    ready = next(c for c in compute_conditions(spec, observed, None) if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "PodsBlocked"
    assert (
        "prefill: the scheduler cannot place pod p" in ready["message"]
        and "untolerated taint" in ready["message"]
    )
    plain = Observed(generation=1, workloads=observed.workloads)
    ready = next(c for c in compute_conditions(spec, plain, None) if c["type"] == "Ready")
    assert ready["reason"] == "ReplicasNotReady"


def test_pods_are_listed_only_for_a_workload_with_pods_not_ready() -> None:
    assert not pods_not_ready([])
    assert not pods_not_ready([Workload(present=True, spec_replicas=2)])  # none made yet
    assert not pods_not_ready([Workload(present=True, spec_replicas=2, replicas=2, ready=2)])
    assert pods_not_ready(
        [Workload(present=True, spec_replicas=2, replicas=2, ready=2), Workload(present=True, replicas=1)]
    )

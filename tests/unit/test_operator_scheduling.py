"""The scheduler's reason for Pending pods reaches the Ready condition."""

from __future__ import annotations

from typing import Any

import pytest

from pdwarden_operator.models import parse_spec
from pdwarden_operator.scheduling import unschedulable
from pdwarden_operator.status import Observed, Workload, compute_conditions

pytestmark = pytest.mark.unit

TAINT = "0/1 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: present}."


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
    assert unschedulable(pods) == {"prefill": f"pod m-prefill-a: {TAINT}"}
    assert unschedulable([]) == {}


def test_ready_condition_names_the_scheduler_reason() -> None:
    spec = parse_spec({"model": {"path": "m"}, "engine": "synthetic"})
    waiting = Workload(present=True, spec_replicas=1, replicas=1, ready=0, updated=1, up_to_date=True)
    observed = Observed(
        generation=1,
        workloads={"prefill": waiting, "decode": waiting, "router": waiting},
        unschedulable={"prefill": f"pod p: {TAINT}"},
    )
    ready = next(c for c in compute_conditions(spec, observed, None) if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "Unschedulable"
    assert "untolerated taint {nvidia.com/gpu: present}" in ready["message"] and "prefill" in ready["message"]
    plain = Observed(generation=1, workloads=observed.workloads)
    ready = next(c for c in compute_conditions(spec, plain, None) if c["type"] == "Ready")
    assert ready["reason"] == "ReplicasNotReady"

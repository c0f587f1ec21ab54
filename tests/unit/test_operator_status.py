"""Status and conditions computed from observed Deployments and the watchdog's findings."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from pdwarden_operator.models import parse_spec
from pdwarden_operator.status import (
    Observed,
    compute_conditions,
    compute_status,
    observe_deployment,
    status_changed,
)

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
LATER = datetime(2026, 11, 29, 12, 5, 0, tzinfo=UTC)
SPEC = parse_spec({"model": {"path": "m"}, "prefill": {"replicas": 2}, "decode": {"replicas": 1}})


def deployment(
    spec_replicas: int,
    ready: int,
    *,
    updated: int | None = None,
    gen: int = 1,
    seen: int = 1,
    replicas: int | None = None,
    stalled: bool = False,
) -> dict[str, Any]:
    conditions = (
        [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}] if stalled else []
    )
    return {
        "metadata": {"generation": gen},
        "spec": {"replicas": spec_replicas},
        "status": {
            "observedGeneration": seen,
            "replicas": spec_replicas if replicas is None else replicas,
            "readyReplicas": ready,
            "updatedReplicas": spec_replicas if updated is None else updated,
            "conditions": conditions,
        },
    }


def observed(prefill: Any, decode: Any, router: Any, **kw: Any) -> Observed:
    return Observed(
        generation=3,
        workloads={
            "prefill": observe_deployment(prefill),
            "decode": observe_deployment(decode),
            "router": observe_deployment(router),
        },
        **kw,
    )


def conds(status_or_list: Any) -> dict[str, dict[str, Any]]:
    items = status_or_list["conditions"] if isinstance(status_or_list, dict) else status_or_list
    return {c["type"]: c for c in items}


def test_all_ready_is_ready_phase() -> None:
    st = compute_status(SPEC, observed(deployment(2, 2), deployment(1, 1), deployment(1, 1)), None, now=NOW)
    c = conds(st)
    assert st["phase"] == "Ready"
    assert c["Ready"]["status"] == "True" and c["Ready"]["reason"] == "AllReplicasReady"
    assert c["Progressing"]["status"] == "False"
    assert c["Degraded"]["status"] == "False"
    assert c["Wedged"]["status"] == "Unknown"
    assert st["observedGeneration"] == 3 and all(x["observedGeneration"] == 3 for x in st["conditions"])
    assert st["prefill"] == {"replicas": 2, "readyReplicas": 2, "summary": "2/2"}
    assert st["router"] == {"replicas": 1, "readyReplicas": 1, "summary": "1/1"}


def test_nothing_created_yet_is_pending() -> None:
    st = compute_status(SPEC, observed(None, None, None), None, now=NOW)
    assert st["phase"] == "Pending"
    c = conds(st)
    assert c["Ready"]["reason"] == "ChildrenMissing"
    assert c["Progressing"]["status"] == "True" and "prefill" in c["Progressing"]["message"]


def test_partially_ready_is_progressing_and_says_which_role() -> None:
    st = compute_status(SPEC, observed(deployment(2, 1), deployment(1, 1), deployment(1, 1)), None, now=NOW)
    c = conds(st)
    assert st["phase"] == "Progressing"
    assert c["Ready"]["status"] == "False"
    assert "prefill 1/2 ready" in c["Ready"]["message"]
    assert c["Progressing"]["reason"] == "RollingOut" and "prefill" in c["Progressing"]["message"]
    assert st["prefill"]["summary"] == "1/2"


def test_deployment_not_yet_scaled_to_spec_is_not_ready() -> None:
    # The DM says 2 prefill but the Deployment still says 1 (apply pending): not Ready.
    st = compute_status(SPEC, observed(deployment(1, 1), deployment(1, 1), deployment(1, 1)), None, now=NOW)
    assert conds(st)["Ready"]["status"] == "False"


def test_old_template_generation_is_rolling_out() -> None:
    st = compute_status(
        SPEC, observed(deployment(2, 2, gen=2, seen=1), deployment(1, 1), deployment(1, 1)), None
    )
    assert conds(st)["Progressing"]["status"] == "True"


def test_scale_down_waits_for_pods_to_go() -> None:
    st = compute_status(
        SPEC, observed(deployment(2, 2, replicas=3), deployment(1, 1), deployment(1, 1)), None
    )
    assert st["phase"] == "Progressing"


def test_stalled_rollout_is_degraded() -> None:
    st = compute_status(
        SPEC, observed(deployment(2, 0, stalled=True), deployment(1, 1), deployment(1, 1)), None, now=NOW
    )
    c = conds(st)
    assert st["phase"] == "Degraded"
    assert c["Degraded"]["reason"] == "RolloutStalled" and "prefill" in c["Degraded"]["message"]


def test_apply_error_is_degraded_with_its_message() -> None:
    obs = observed(None, None, None, error_reason="ApplyFailed", error_message="quantity 'x' is invalid")
    st = compute_status(SPEC, obs, None, now=NOW)
    c = conds(st)
    assert st["phase"] == "Degraded"
    assert c["Degraded"]["reason"] == "ApplyFailed" and "quantity" in c["Degraded"]["message"]
    assert c["Ready"]["status"] == "False"


def test_wedged_pods_set_wedged_and_exhausted_budget_sets_degraded() -> None:
    ready = observed(deployment(2, 2), deployment(1, 1), deployment(1, 1))
    wd = {"lastScrape": "2026-11-29T12:00:00Z", "wedgedPods": ["m-prefill-abc"], "budget": {"used": 1}}
    c = conds(compute_conditions(SPEC, ready, wd, now=NOW))
    assert c["Wedged"]["status"] == "True" and "m-prefill-abc" in c["Wedged"]["message"]
    assert c["Degraded"]["status"] == "False", "the watchdog still has budget to remediate"
    wd_spent = {**wd, "budget": {"used": 3}}
    c = conds(compute_conditions(SPEC, ready, wd_spent, now=NOW))
    assert c["Degraded"]["status"] == "True" and c["Degraded"]["reason"] == "RemediationBudgetExhausted"
    clean = {"lastScrape": "2026-11-29T12:00:00Z", "wedgedPods": []}
    assert conds(compute_conditions(SPEC, ready, clean, now=NOW))["Wedged"]["status"] == "False"


def test_alert_only_watchdog_with_wedged_pods_is_degraded() -> None:
    spec = parse_spec({"model": {"path": "m"}, "watchdog": {"action": "alert"}})
    obs = observed(deployment(1, 1), deployment(1, 1), deployment(1, 1))
    c = conds(compute_conditions(spec, obs, {"lastScrape": "t", "wedgedPods": ["p"]}, now=NOW))
    assert c["Degraded"]["status"] == "True" and c["Degraded"]["reason"] == "WedgedPods"


def test_transition_time_kept_while_status_unchanged() -> None:
    obs1 = observed(deployment(2, 1), deployment(1, 1), deployment(1, 1))
    first = compute_status(SPEC, obs1, None, now=NOW)
    obs2 = observed(
        deployment(2, 1), deployment(1, 1), deployment(1, 1), previous_conditions=tuple(first["conditions"])
    )
    second = compute_status(SPEC, obs2, None, now=LATER)
    assert second == first, "nothing changed: identical status, so no write"
    assert not status_changed(first, second)
    obs3 = observed(
        deployment(2, 2), deployment(1, 1), deployment(1, 1), previous_conditions=tuple(first["conditions"])
    )
    third = compute_status(SPEC, obs3, None, now=LATER)
    assert conds(third)["Ready"]["lastTransitionTime"] == "2026-11-29T12:05:00Z"
    assert conds(third)["Degraded"]["lastTransitionTime"] == "2026-11-29T12:00:00Z"
    assert status_changed(first, third)


def test_zero_replicas_everywhere_is_ready() -> None:
    spec = parse_spec(
        {
            "model": {"path": "m"},
            "prefill": {"replicas": 0},
            "decode": {"replicas": 0},
            "router": {"replicas": 0},
        }
    )
    zero = {"metadata": {"generation": 1}, "spec": {"replicas": 0}, "status": {"observedGeneration": 1}}
    st = compute_status(spec, observed(zero, zero, zero), None, now=NOW)
    assert st["phase"] == "Ready"

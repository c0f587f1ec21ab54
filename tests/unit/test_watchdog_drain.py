"""Action drain: its phases in the outcome table, the ladder's rounds, the drained test, the
quarantine patch and the quarantined pod's view, and their survival through the status."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import pdwarden_contract as contract
from pdwarden_operator.kube.pods import RUNTIME_PODS_SELECTOR, quarantine_patch
from pdwarden_operator.resource.watchdog import WatchdogSpec
from pdwarden_operator.timestamps import to_rfc3339
from pdwarden_operator.watchdog import ladder
from pdwarden_operator.watchdog.drain import healthy_requests_done
from pdwarden_operator.watchdog.history import PodScrape
from pdwarden_operator.watchdog.ladder import ActionResult, plan
from pdwarden_operator.watchdog.outcome import (
    CHARGED,
    RETRYING,
    Outcome,
    OutcomeTransitionError,
    advance,
)
from pdwarden_operator.watchdog.parse import PodSample
from pdwarden_operator.watchdog.state import WatchdogState, state_from_status, state_to_status
from pdwarden_operator.watchdog.targets import pod_view
from pdwarden_operator.watchdog.verdict import PodView, Verdict, VerdictState

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0
WEDGED = Verdict(VerdictState.WEDGED, "oldest room in state Transferring for 70s", {"inflight": 1})
DRAIN = WatchdogSpec.model_validate(
    {"stuckAfterSeconds": 60, "scrapeIntervalSeconds": 10, "action": "drain", "drainSeconds": 120}
)
DESIRED = {"prefill": 2, "decode": 2}


def view(name: str, role: str, *, ready: bool = True, quarantined: bool = False) -> PodView:
    return PodView(name, f"uid-{name}", role, ready, False, quarantined=quarantined)


FOUR = [view("p0", "prefill"), view("p1", "prefill"), view("d0", "decode"), view("d1", "decode")]


def round_(
    state: WatchdogState,
    now: float,
    pods: list[PodView],
    *,
    verdicts: dict[str, Verdict] | None = None,
    drained: dict[str, bool] | None = None,
    outcome: dict[str, Outcome] | None = None,
    brake: bool = False,
) -> tuple[ladder.Plan, WatchdogState]:
    """One round; each action performed with the outcome its kind maps to in `outcome`."""
    p = plan(
        verdicts=verdicts or {},
        pods=pods,
        state=state,
        settings=DRAIN,
        now=now,
        desired=DESIRED,
        brake=brake,
        drained=drained,
    )
    done = {"quarantine": Outcome.QUARANTINED, "finish-drain": Outcome.DELETED} | (outcome or {})
    results = [ActionResult(a, done[a.kind]) for a in p.actions]
    return p, ladder.apply_results(p.state, results, now)


def phases(state: WatchdogState) -> list[str]:
    return [o.value for o, _ in state.remediations[-1].phases]


def test_drain_phases_are_data_in_the_outcome_table() -> None:
    assert advance(Outcome.PENDING, Outcome.QUARANTINED) == Outcome.QUARANTINED
    assert advance(Outcome.QUARANTINED, Outcome.DRAINED) == Outcome.DRAINED
    assert advance(Outcome.QUARANTINED, Outcome.DRAIN_DEADLINE) == Outcome.DRAIN_DEADLINE
    assert advance(Outcome.DRAINED, Outcome.DELETED) == Outcome.DELETED
    with pytest.raises(OutcomeTransitionError, match="'quarantined' cannot move to 'deleted'"):
        advance(Outcome.QUARANTINED, Outcome.DELETED)  # never deleted before the drain decided
    with pytest.raises(OutcomeTransitionError):
        advance(Outcome.DRAINED, Outcome.QUARANTINED)
    assert {Outcome.QUARANTINED, Outcome.DRAINED, Outcome.DRAIN_DEADLINE} <= RETRYING & CHARGED


def test_wedged_pod_is_quarantined_then_deleted_once_drained_and_replaced() -> None:
    p, state = round_(WatchdogState(), T0, FOUR, verdicts={"uid-p1": WEDGED})
    assert [(a.kind, a.pod, a.remediation) for a in p.actions] == [("quarantine", "p1", "drain")]
    assert p.state.in_flight[0].action == "drain" and p.state.used == 1  # intent first, charged
    assert state.in_flight[0].quarantined_at == T0 and phases(state) == ["pending", "quarantined"]

    quarantined = [view("p0", "prefill"), view("p1", "prefill", quarantined=True), *FOUR[2:]]
    starting = [*quarantined, view("p2", "prefill", ready=False)]
    # healthy requests done, but the replacement is not Ready: the pod is kept
    p, state = round_(state, T0 + 10, starting, verdicts={"uid-p1": WEDGED}, drained={"uid-p1": True})
    assert p.actions == () and state.remediations[-1].outcome == Outcome.QUARANTINED
    # replacement Ready, requests still moving: kept
    ready = [*quarantined, view("p2", "prefill")]
    p, state = round_(state, T0 + 20, ready, drained={"uid-p1": False})
    assert p.actions == ()
    # both: drained, then deleted in the same round, each phase an Event and a status entry
    p, state = round_(state, T0 + 30, ready, drained={"uid-p1": True})
    assert [(a.kind, a.pod) for a in p.actions] == [("finish-drain", "p1")]
    assert [n.event_reason for n in p.notices] == ["WedgedPodDrained"]
    assert phases(state) == ["pending", "quarantined", "drained", "deleted"]
    assert [t for _, t in state.remediations[-1].phases] == [T0, T0, T0 + 30, T0 + 30]
    # deleted but still listed (not yet marked terminating): waited for, never acted on again
    p, state = round_(state, T0 + 35, ready, drained={"uid-p1": True})
    assert p.actions == () and state.remediations[-1].outcome == Outcome.DELETED
    # the deleted pod goes away: the remediation closes; no second action on it
    p, state = round_(state, T0 + 40, [view("p0", "prefill"), view("p2", "prefill"), *FOUR[2:]])
    assert p.actions == () and state.in_flight == () and state.used == 1


def test_drain_deadline_deletes_what_remains() -> None:
    _, state = round_(WatchdogState(), T0, FOUR, verdicts={"uid-p1": WEDGED})
    quarantined = [view("p0", "prefill"), view("p1", "prefill", quarantined=True), *FOUR[2:]]
    p, state = round_(state, T0 + 119, quarantined, drained={"uid-p1": False})
    assert p.actions == ()
    p, state = round_(state, T0 + 120, quarantined, drained={"uid-p1": False})
    assert [a.kind for a in p.actions] == ["finish-drain"]
    assert [n.event_reason for n in p.notices] == ["DrainDeadlinePassed"]
    assert phases(state) == ["pending", "quarantined", "drain-deadline", "deleted"]


def test_the_brake_holds_a_drain_in_its_phase() -> None:
    _, state = round_(WatchdogState(), T0, FOUR, verdicts={"uid-p1": WEDGED})
    quarantined = [view("p0", "prefill"), view("p1", "prefill", quarantined=True), *FOUR[2:]]
    p, state = round_(state, T0 + 500, quarantined, drained={"uid-p1": True}, brake=True)
    assert p.actions == () and state.remediations[-1].outcome == Outcome.QUARANTINED


def test_a_failed_deletion_is_retried_from_its_phase() -> None:
    _, state = round_(WatchdogState(), T0, FOUR, verdicts={"uid-p1": WEDGED})
    quarantined = [view("p0", "prefill"), view("p1", "prefill", quarantined=True), *FOUR[2:]]
    _, state = round_(state, T0 + 200, quarantined, outcome={"finish-drain": Outcome.ERROR})
    assert state.remediations[-1].outcome == Outcome.ERROR
    p, state = round_(state, T0 + 210, quarantined)
    assert [a.kind for a in p.actions] == ["finish-drain"] and state.remediations[-1].outcome == "deleted"


def test_drain_survives_a_restart_through_the_status() -> None:
    """Intent persisted, the operator dies after quarantining: the next one reads the status,
    deletes nothing early, and finishes the drain."""
    p, state = round_(WatchdogState(), T0, FOUR, verdicts={"uid-p1": WEDGED})
    status = state_to_status(
        state, last_scrape=T0, wedged_pods=["p1"], unobserved_pods=[], max_remediations=3
    )
    assert status["remediations"][-1]["phases"][-1] == {"phase": "quarantined", "time": to_rfc3339(T0)}
    assert status["watchdog"]["inFlight"][0]["quarantinedAt"] == to_rfc3339(T0)
    read = state_from_status(status)
    assert read == state
    quarantined = [view("p0", "prefill"), view("p1", "prefill", quarantined=True), *FOUR[2:]]
    p, _ = round_(read, T0 + 120, quarantined, drained={"uid-p1": False})
    assert [a.kind for a in p.actions] == ["finish-drain"]


def test_a_quarantined_pod_nobody_remembers_is_adopted_and_finished() -> None:
    quarantined = replace(view("p1", "prefill", quarantined=True), quarantined_at=T0 - 30)
    pods = [view("p0", "prefill"), quarantined, view("p2", "prefill"), *FOUR[2:]]
    p, state = round_(WatchdogState(), T0, pods)
    assert [n.event_reason for n in p.notices] == ["QuarantinedPodAdopted"]
    assert state.in_flight[0].quarantined_at == T0 - 30 and state.used == 0
    p, state = round_(state, T0 + 10, pods, drained={"uid-p1": True})
    assert [a.kind for a in p.actions] == ["finish-drain"]
    assert phases(state) == ["quarantined", "drained", "deleted"]


def sample(inflight: float, transfers: float) -> PodSample:
    return PodSample(inflight=inflight, oldest_age=1.0, transfers=transfers)


def test_healthy_requests_done_only_when_nothing_moves_or_nothing_is_held() -> None:
    since = 100.0
    before = PodScrape(99.0, sample(5, 10))
    assert not healthy_requests_done([before], since)  # nothing seen since the quarantine
    assert healthy_requests_done([before, PodScrape(101.0, sample(0, 15))], since)
    assert not healthy_requests_done([before, PodScrape(101.0, sample(1, 14))], since)
    # the same rooms held and nothing finished between two scrapes: what remains is stuck
    assert healthy_requests_done([PodScrape(101.0, sample(1, 14)), PodScrape(111.0, sample(1, 14))], since)
    assert not healthy_requests_done(
        [PodScrape(101.0, sample(2, 13)), PodScrape(111.0, sample(1, 14))], since
    )
    # a failed scrape in between breaks the run
    broken = [
        PodScrape(101.0, sample(1, 14)),
        PodScrape(106.0, None, "timeout"),
        PodScrape(111.0, sample(1, 14)),
    ]
    assert not healthy_requests_done(broken, since)


def test_quarantine_patch_and_the_quarantined_pods_view() -> None:
    owner = {"apiVersion": "pdwarden.io/v1alpha1", "kind": contract.KIND, "name": "m", "uid": "u-m"}
    labels = {contract.LABEL_ROLE: "prefill"}
    meta: dict[str, Any] = {"name": "m-prefill-x", "uid": "u-1", "labels": labels}
    patch = quarantine_patch(meta, "u-1", owner, to_rfc3339(T0))["metadata"]
    assert patch["labels"] == {
        contract.LABEL_ROLE: contract.ROLE_QUARANTINED,
        contract.LABEL_QUARANTINE_REASON: contract.QUARANTINE_REASON_WEDGED,
        contract.LABEL_QUARANTINED_ROLE: "prefill",
    }
    assert patch["ownerReferences"] == [{**owner, "controller": False, "blockOwnerDeletion": False}]
    assert patch["uid"] == "u-1"
    # resumed on a pod already quarantined: its first role and time are kept
    again_meta = {
        **meta,
        "labels": {**labels, **patch["labels"]},
        "annotations": patch["annotations"],
    }
    again = quarantine_patch(again_meta, "u-1", owner, to_rfc3339(T0 + 50))["metadata"]
    assert contract.LABEL_QUARANTINED_ROLE not in again["labels"] and again["annotations"] == {}

    pod = {
        "metadata": {**again_meta, "annotations": patch["annotations"]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    seen = pod_view(pod)
    assert seen is not None and (seen.role, seen.quarantined, seen.quarantined_at) == ("prefill", True, T0)
    assert contract.ROLE_QUARANTINED in RUNTIME_PODS_SELECTOR


def test_drain_seconds_is_bounded_and_named() -> None:
    assert WatchdogSpec.model_validate({}).drain_seconds == 120
    with pytest.raises(ValueError, match="drainSeconds"):
        WatchdogSpec.model_validate({"drainSeconds": 0})
    with pytest.raises(ValueError, match="drainSeconds must be at least two scrape intervals"):
        WatchdogSpec.model_validate({"action": "drain", "drainSeconds": 10, "scrapeIntervalSeconds": 10})
    assert WatchdogSpec.model_validate({"action": "evict", "drainSeconds": 10, "scrapeIntervalSeconds": 10})

"""The remediation ladder: budget, cooldown, maxUnavailable, intent-first state, restart safety."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pdwarden_operator.resource.watchdog import WatchdogSpec
from pdwarden_operator.watchdog import ladder
from pdwarden_operator.watchdog.ladder import ActionResult, plan
from pdwarden_operator.watchdog.outcome import Outcome
from pdwarden_operator.watchdog.state import WatchdogState, state_from_status, state_to_status
from pdwarden_operator.watchdog.verdict import PodView, Verdict, VerdictState

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0
WEDGED = Verdict(VerdictState.WEDGED, "no progress for 130s: inflight=3", {"inflight": 3})
OK = Verdict(VerdictState.OK, "progressing", cleared=True)
BUSY = Verdict(VerdictState.OK, "busy, no progress seen for 20s", cleared=False)
RESTART = WatchdogSpec(
    stuck_after_seconds=60,
    scrape_interval_seconds=10,
    action="restart",
    max_remediations=3,
    budget_window_seconds=3600,
    max_unavailable=1,
    drain_seconds=120,
)


def pods(*specs: tuple[str, str]) -> list[PodView]:
    return [
        PodView(name=name, uid=f"uid-{name}", role=role, ready=True, terminating=False)
        for name, role in specs
    ]


FOUR = pods(("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"), ("d1", "decode"))
DESIRED = {"prefill": 2, "decode": 2}


def step(
    state: WatchdogState,
    verdicts: dict[str, Verdict],
    now: float,
    *,
    view: list[PodView] = FOUR,
    settings: WatchdogSpec = RESTART,
    outcome: Outcome = Outcome.DELETED,
) -> tuple[ladder.Plan, WatchdogState]:
    """One round: plan, then (as the executor would) perform every action with `outcome`."""
    p = plan(verdicts=verdicts, pods=view, state=state, settings=settings, now=now, desired=DESIRED)
    results = [ActionResult(a, Outcome.ALERTED if a.kind == "alert" else outcome) for a in p.actions]
    return p, ladder.apply_results(p.state, results)


def test_healthy_pods_get_no_action() -> None:
    p, state = step(WatchdogState(), {pod.uid: OK for pod in FOUR}, T0)
    assert p.actions == () and p.notices == () and state == WatchdogState()


def test_wedged_pod_is_restarted_with_intent_recorded_before_acting() -> None:
    p = plan(
        verdicts={"uid-p1": WEDGED},
        pods=FOUR,
        state=WatchdogState(),
        settings=RESTART,
        now=T0,
        desired=DESIRED,
    )
    assert [(a.kind, a.pod) for a in p.actions] == [("restart", "p1")]
    # the plan's state (persisted before acting) already holds the intent
    assert p.state.used == 1 and p.state.window_start == T0
    assert p.state.cooldown_until == {"prefill": T0 + 60, "decode": T0 + 60}
    assert [(f.pod, f.action, f.last_outcome) for f in p.state.in_flight] == [("p1", "restart", "pending")]
    assert [(r.pod, r.role, r.action, r.outcome) for r in p.state.remediations] == [
        ("p1", "prefill", "restart", "pending")
    ]
    assert "inflight=3" in p.state.remediations[0].reason
    done = ladder.apply_results(p.state, [ActionResult(p.actions[0], Outcome.DELETED)])
    assert done.remediations[0].outcome == "deleted"
    assert done.in_flight[0].attempts == 1


def test_in_flight_pod_is_not_acted_on_twice_and_settles_when_gone() -> None:
    _, state = step(WatchdogState(), {"uid-p1": WEDGED}, T0)
    terminating = [replace(p, terminating=True) if p.name == "p1" else p for p in FOUR]
    p, state = step(state, {"uid-p1": WEDGED}, T0 + 10, view=terminating)
    assert p.actions == () and state.in_flight == ()
    assert state.used == 1 and state.remediations[-1].outcome == "deleted"


def test_restart_after_crash_between_intent_and_action_completes_once() -> None:
    # the operator persisted the intent and died before deleting: the pod is still there
    intent = plan(
        verdicts={"uid-p1": WEDGED},
        pods=FOUR,
        state=WatchdogState(),
        settings=RESTART,
        now=T0,
        desired=DESIRED,
    ).state
    persisted = state_to_status(
        intent, last_scrape=T0, wedged_pods=["p1"], unobserved_pods=[], max_remediations=3
    )
    restored = state_from_status(persisted)
    # a fresh operator has no history: every verdict is inconclusive
    p, state = step(restored, {pod.uid: BUSY for pod in FOUR}, T0 + 30)
    assert [(a.kind, a.pod, a.resumed) for a in p.actions] == [("restart", "p1", True)]
    assert state.used == 1  # the resumed action is not charged again
    assert [r.outcome for r in state.remediations] == ["deleted"]


def test_restart_after_crash_after_the_action_does_not_repeat_it() -> None:
    intent = plan(
        verdicts={"uid-p1": WEDGED},
        pods=FOUR,
        state=WatchdogState(),
        settings=RESTART,
        now=T0,
        desired=DESIRED,
    ).state
    restored = state_from_status(
        state_to_status(intent, last_scrape=T0, wedged_pods=[], unobserved_pods=[], max_remediations=3)
    )
    # the delete went through: p1 is gone, its replacement p2 is starting
    view = [p for p in FOUR if p.name != "p1"] + [
        PodView("p2", "uid-p2", "prefill", ready=False, terminating=False)
    ]
    p, state = step(restored, {pod.uid: BUSY for pod in view}, T0 + 30, view=view)
    assert p.actions == () and state.in_flight == ()
    assert [r.outcome for r in state.remediations] == ["pod-gone"]


def test_cooldown_defers_a_second_pod_of_the_same_role() -> None:
    _, state = step(WatchdogState(), {"uid-p0": WEDGED}, T0)
    view = [p for p in FOUR if p.name != "p0"] + [PodView("p2", "uid-p2", "prefill", True, False)]
    p, state = step(state, {"uid-p1": WEDGED}, T0 + 20, view=view)
    assert p.actions == ()
    assert state.remediations[-1].outcome == "skipped-cooldown"
    assert [n.event_reason for n in p.notices] == ["RemediationDeferred"]
    # reported once, not every round
    p, state = step(state, {"uid-p1": WEDGED}, T0 + 30, view=view)
    assert p.notices == () and len(state.remediations) == 2
    # the cooldown is model-wide: decode pods that exchanged KV with the removed prefill pod
    # get time to let go of its rooms before they can be judged for remediation
    p, state = step(state, {"uid-p1": WEDGED, "uid-d0": WEDGED}, T0 + 40, view=view)
    assert p.actions == () and state.remediations[-1].pod == "d0"
    # after the cooldown one pod is remediated, and the cooldown starts again
    p, state = step(state, {"uid-p1": WEDGED, "uid-d0": WEDGED}, T0 + 61, view=view)
    assert [a.pod for a in p.actions] == ["d0"]
    p, state = step(state, {"uid-p1": WEDGED}, T0 + 122, view=view)
    assert [a.pod for a in p.actions] == ["p1"]


def test_max_unavailable_counts_not_ready_pods() -> None:
    view = [replace(p, ready=False) if p.name == "p0" else p for p in FOUR]
    p, state = step(WatchdogState(), {"uid-p1": WEDGED}, T0, view=view)
    assert p.actions == () and state.remediations[-1].outcome == "skipped-max-unavailable"
    assert state.used == 0
    # a wedged pod that is itself not Ready may go: it adds no unavailability
    p, _ = step(WatchdogState(), {"uid-p0": WEDGED}, T0, view=view)
    assert [a.pod for a in p.actions] == ["p0"]


def test_max_unavailable_counts_missing_replicas_and_two_wedged_in_one_round() -> None:
    p, _ = step(WatchdogState(), {"uid-p0": WEDGED, "uid-p1": WEDGED}, T0)
    assert [a.pod for a in p.actions] == ["p0"]  # p1 waits (cooldown, then maxUnavailable)
    only_one = [p for p in FOUR if p.name != "p0"]
    p, _ = step(WatchdogState(), {"uid-p1": WEDGED}, T0, view=only_one)
    assert p.actions == () and p.state.remediations[-1].outcome == "skipped-max-unavailable"


def test_budget_exhausts_then_stops_and_reports_once() -> None:
    settings = RESTART.model_copy(update=dict(max_remediations=2))
    state = WatchdogState()
    acted = []
    view = list(FOUR)
    for i in range(6):  # a flapping fault: every replacement wedges again
        victim = f"p{i}"
        view = [p for p in view if p.role != "prefill"] + pods((victim, "prefill"), ("px", "prefill"))
        p, state = step(state, {f"uid-{victim}": WEDGED}, T0 + 100 * i, view=view, settings=settings)
        acted += [a.pod for a in p.actions]
        if i == 1:
            assert [n.event_reason for n in p.notices] == ["RemediationBudgetExhausted"]
    assert acted == ["p0", "p1"]
    assert state.used == 2 and state.exhausted
    skipped = [r for r in state.remediations if r.outcome == "skipped-budget"]
    assert [r.pod for r in skipped] == ["p2", "p3", "p4", "p5"]
    # a new window restores the budget
    view = [p for p in view if p.role != "prefill"] + pods(("p9", "prefill"), ("px", "prefill"))
    p, state = step(state, {"uid-p9": WEDGED}, T0 + 3700, view=view, settings=settings)
    assert [a.pod for a in p.actions] == ["p9"] and state.used == 1 and not state.exhausted


def test_alert_only_reports_once_per_episode_and_spends_no_budget() -> None:
    settings = RESTART.model_copy(update=dict(action="alert"))
    p, state = step(WatchdogState(), {"uid-p1": WEDGED}, T0, settings=settings)
    assert [a.kind for a in p.actions] == ["alert"]
    assert state.used == 0 and state.cooldown_until == {}
    assert state.remediations[-1].outcome == "alerted"
    for i in range(1, 5):
        p, state = step(state, {"uid-p1": WEDGED}, T0 + 10 * i, settings=settings)
        assert p.actions == ()
    p, state = step(state, {"uid-p1": OK}, T0 + 60, settings=settings)
    assert state.in_flight == ()
    p, state = step(state, {"uid-p1": WEDGED}, T0 + 70, settings=settings)
    assert [a.kind for a in p.actions] == ["alert"] and len(state.remediations) == 2


def test_eviction_refused_by_pdb_is_retried_later_and_never_bypassed() -> None:
    settings = RESTART.model_copy(update=dict(action="evict"))
    p, state = step(
        WatchdogState(), {"uid-d1": WEDGED}, T0, settings=settings, outcome=Outcome.REFUSED_BY_PDB
    )
    assert [a.kind for a in p.actions] == ["evict"]
    assert (
        state.remediations[-1].outcome == "refused-by-pdb"
        and state.in_flight[0].last_outcome == "refused-by-pdb"
    )
    for i in range(1, 4):
        p, state = step(
            state, {"uid-d1": WEDGED}, T0 + 10 * i, settings=settings, outcome=Outcome.REFUSED_BY_PDB
        )
        assert [(a.kind, a.resumed, a.previous_outcome) for a in p.actions] == [
            ("evict", True, "refused-by-pdb")
        ]
    assert state.used == 1  # retries are the same remediation
    p, state = step(state, {"uid-d1": WEDGED}, T0 + 50, settings=settings, outcome=Outcome.EVICTED)
    assert state.remediations[-1].outcome == "evicted"


def test_api_errors_are_retried_then_given_up() -> None:
    settings = RESTART.model_copy(update=dict(stuck_after_seconds=600))  # cooldown 600 s
    _, state = step(WatchdogState(), {"uid-p1": WEDGED}, T0, outcome=Outcome.ERROR, settings=settings)
    notices = []
    for i in range(1, 10):
        p, state = step(state, {"uid-p1": WEDGED}, T0 + 10 * i, outcome=Outcome.ERROR, settings=settings)
        notices += [n.event_reason for n in p.notices]
    assert state.in_flight == () and state.remediations[0].outcome == "failed"
    assert notices[0] == "RemediationFailed"
    assert state.used == 1


def test_status_round_trip_and_tolerant_reading() -> None:
    _, state = step(WatchdogState(), {"uid-p1": WEDGED}, T0)
    status = state_to_status(
        state, last_scrape=T0, wedged_pods=["p1"], unobserved_pods=["d0"], max_remediations=3
    )
    assert status["watchdog"]["budget"] == {
        "windowStart": "2027-01-15T08:00:00Z",
        "used": 1,
        "limit": 3,
        "exhausted": False,
    }
    assert state_from_status(status) == state
    junk = {
        "watchdog": {
            "budget": {"used": "x", "windowStart": 5},
            "inFlight": [1, {"pod": "a"}],
            "cooldownUntil": {"prefill": "not a time"},
        },
        "remediations": "nope",
    }
    assert state_from_status(junk) == WatchdogState()
    assert state_from_status(None) == WatchdogState()


def test_the_watchdog_reads_the_spec_model_with_its_derived_figures() -> None:
    s = WatchdogSpec.model_validate({"stuckAfterSeconds": 30, "action": "evict", "maxUnavailable": 2})
    assert (s.stuck_after_seconds, s.action, s.max_unavailable, s.cooldown_seconds) == (30, "evict", 2, 60.0)
    assert WatchdogSpec.model_validate({"stuckAfterSeconds": 400}).cooldown_seconds == 400.0
    assert WatchdogSpec.model_validate({}).action == "drain"  # the default: replacement Ready first
    with pytest.raises(ValueError, match="cooldownSeconds"):
        WatchdogSpec.model_validate({"cooldownSeconds": 5})  # not a field of the CRD


def test_throttled_eviction_waits_for_retry_after_and_spends_no_attempt() -> None:
    settings = RESTART.model_copy(update=dict(action="evict"))
    p = plan(
        verdicts={"uid-d1": WEDGED},
        pods=FOUR,
        state=WatchdogState(),
        settings=settings,
        now=T0,
        desired=DESIRED,
    )
    state = ladder.apply_results(
        p.state, [ActionResult(p.actions[0], Outcome.THROTTLED, retry_after=25.0)], T0
    )
    assert state.in_flight[0].not_before == T0 + 25 and state.in_flight[0].attempts == 0
    assert state.remediations[-1].outcome == "throttled"
    early = plan(
        verdicts={"uid-d1": WEDGED}, pods=FOUR, state=state, settings=settings, now=T0 + 10, desired=DESIRED
    )
    assert early.actions == ()
    later = plan(
        verdicts={"uid-d1": WEDGED}, pods=FOUR, state=state, settings=settings, now=T0 + 30, desired=DESIRED
    )
    assert [(a.kind, a.resumed, a.previous_outcome) for a in later.actions] == [("evict", True, "throttled")]


def test_outcomes_move_only_along_the_table() -> None:
    from pdwarden_operator.watchdog.outcome import OutcomeTransitionError, advance

    assert advance(Outcome.PENDING, Outcome.DELETED) == Outcome.DELETED
    assert advance(Outcome.ERROR, Outcome.FAILED) == Outcome.FAILED
    with pytest.raises(OutcomeTransitionError, match="'deleted' cannot move to 'pending'"):
        advance(Outcome.DELETED, Outcome.PENDING)
    with pytest.raises(OutcomeTransitionError):
        advance(Outcome.PENDING, Outcome.FAILED)  # giving up needs errors first


def test_an_open_remediation_is_found_by_id_after_the_history_rolls_over() -> None:
    _, state = step(WatchdogState(), {"uid-p1": WEDGED}, T0, outcome=Outcome.ERROR)
    rid = state.in_flight[0].remediation_id
    # 30 skip reports from other pods push the history past its 20 entries
    view = list(FOUR)
    for i in range(30):
        extra = PodView(f"x{i}", f"uid-x{i}", "decode", ready=True, terminating=False)
        view = [*FOUR, extra]
        _, state = step(state, {extra.uid: WEDGED}, T0 + 1 + i, view=view, outcome=Outcome.THROTTLED)
    assert len(state.remediations) == 20
    assert state.entry(rid) is not None and state.entry(rid).pod == "p1"  # type: ignore[union-attr]
    ids = [r.id for r in state.remediations]
    assert len(ids) == len(set(ids))
    # the open remediation settles on its own entry
    _, state = step(state, {}, T0 + 100, view=[x for x in FOUR if x.name != "p1"])
    assert state.entry(rid).outcome == "pod-gone"  # type: ignore[union-attr]

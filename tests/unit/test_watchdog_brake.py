"""The fleet brake: operator-wide limits, engaged and released from the counts alone."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from pdwarden_operator.metrics import OperatorMetrics
from pdwarden_operator.watchdog import ladder
from pdwarden_operator.watchdog.brake import BrakeLimits, FleetBrake, judge
from pdwarden_operator.watchdog.history import Observation
from pdwarden_operator.watchdog.outcome import Outcome
from pdwarden_operator.watchdog.parse import PodSample
from pdwarden_operator.watchdog.rule import Verdict
from pdwarden_operator.watchdog.rule import judge as judge_pod
from pdwarden_operator.watchdog.state import WatchdogState
from tests.unit.test_watchdog_ladder import DESIRED, FOUR, RESTART, T0, WEDGED, step

pytestmark = pytest.mark.unit
LIMITS = BrakeLimits(max_remediations_per_hour=3, max_wedged_models=2, max_wedged_pods=4)


def test_judge_engages_above_each_limit_and_names_it() -> None:
    assert not judge({("a", "m1"): 1, ("a", "m2"): 1}, 0, LIMITS).engaged
    many_models = judge({("a", "m1"): 1, ("a", "m2"): 1, ("b", "m3"): 1}, 0, LIMITS)
    assert many_models.engaged and "3 models have wedged pods at once (limit 2)" in many_models.reason
    many_pods = judge({("a", "m1"): 5}, 0, LIMITS)
    assert many_pods.engaged and "5 pods" in many_pods.reason
    busy_hour = judge({}, 3, LIMITS)
    assert busy_hour.engaged and "3 remediations in the last hour" in busy_hour.reason


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="max_wedged_models"):
        BrakeLimits(max_wedged_models=0)


def test_brake_releases_on_its_own_and_exports_its_state() -> None:
    clock = [T0]
    metrics = OperatorMetrics(CollectorRegistry())
    brake = FleetBrake(LIMITS, clock=lambda: clock[0], metrics=metrics)
    for model in ("m1", "m2", "m3"):
        brake.report(("ns", model), 1)
    assert brake.evaluate().engaged
    assert metrics.registry.get_sample_value("pdwarden_operator_brake_engaged") == 1
    brake.report(("ns", "m3"), 0)  # one model recovered
    assert not brake.evaluate().engaged
    assert metrics.registry.get_sample_value("pdwarden_operator_brake_engaged") == 0
    for _ in range(3):
        brake.record_action()
    assert brake.evaluate().engaged
    clock[0] += 3600  # the hour slides past the actions
    assert not brake.evaluate().engaged
    brake.forget(("ns", "m1"))
    brake.forget(("ns", "m2"))
    assert "0 model(s)" in brake.evaluate().reason


def test_an_engaged_brake_touches_no_pod_and_holds_open_remediations() -> None:
    p = ladder.plan(
        verdicts={"uid-p1": WEDGED},
        pods=FOUR,
        state=WatchdogState(),
        settings=RESTART,
        now=T0,
        desired=DESIRED,
        brake=True,
    )
    assert p.actions == () and p.state.used == 0
    assert [r.outcome for r in p.state.remediations] == [Outcome.SKIPPED_BRAKE]
    assert [n.event_reason for n in p.notices] == ["FleetBrakeEngaged"]
    # a remediation already open (an error, to be retried) waits while the brake holds
    _, state = step(WatchdogState(), {"uid-p1": WEDGED}, T0, outcome=Outcome.ERROR)
    held = ladder.plan(
        verdicts={}, pods=FOUR, state=state, settings=RESTART, now=T0 + 10, desired=DESIRED, brake=True
    )
    assert held.actions == () and held.state.in_flight == state.in_flight
    released = ladder.plan(
        verdicts={}, pods=FOUR, state=state, settings=RESTART, now=T0 + 20, desired=DESIRED
    )
    assert [(a.pod, a.resumed) for a in released.actions] == [("p1", True)]


def test_a_stalling_pod_counts_before_it_is_wedged() -> None:
    # busy without progress for half of stuckAfterSeconds: troubled, not yet wedged
    obs = [Observation(T0 + 10 * i, PodSample(3, 5 + 10 * i, 7)) for i in range(5)]
    verdict: Verdict = judge_pod(obs, 60)
    assert verdict.state == "ok" and verdict.stalling and verdict.troubled
    progressing = [Observation(T0 + 10 * i, PodSample(3, 5, 7 + i)) for i in range(5)]
    assert not judge_pod(progressing, 60).troubled


def test_a_pod_stalled_after_earlier_progress_counts_too() -> None:
    # one room finished long ago (counter 0 -> 1), then the queue stalled for half the threshold
    obs = [Observation(T0, PodSample(1, 1, 0))] + [
        Observation(T0 + 10 * i, PodSample(1, 10 * i, 1)) for i in range(1, 5)
    ]
    verdict = judge_pod(obs, 60)
    assert verdict.state == "ok" and verdict.troubled

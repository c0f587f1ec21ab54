"""The brakes: per-namespace and fleet limits, engaged and released from the counts alone; one
namespace alone never engages the fleet brake; counts survive a failover through status."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from pdwarden_operator.metrics import OperatorMetrics
from pdwarden_operator.watchdog import ladder
from pdwarden_operator.watchdog.brake import BrakeLimits, Brakes, check_limits, judge, judge_all
from pdwarden_operator.watchdog.history import Observation
from pdwarden_operator.watchdog.outcome import Outcome
from pdwarden_operator.watchdog.parse import PodSample
from pdwarden_operator.watchdog.rule import judge as judge_pod
from pdwarden_operator.watchdog.state import Remediation, WatchdogState
from pdwarden_operator.watchdog.verdict import Verdict
from tests.unit.test_watchdog_ladder import DESIRED, FOUR, RESTART, T0, WEDGED, step

pytestmark = pytest.mark.unit
LIMITS = BrakeLimits(max_remediations_per_hour=3, max_wedged_models=2, max_wedged_pods=4)
PER_NS = BrakeLimits(max_remediations_per_hour=2, max_wedged_models=1, max_wedged_pods=2)


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
    brake = Brakes(LIMITS, PER_NS, clock=lambda: clock[0], metrics=metrics)
    for ns in ("a", "b", "c"):  # one troubled model in each of three namespaces
        brake.report((ns, "m"), 1)
    assert brake.evaluate("a").scope == "fleet"
    assert metrics.registry.get_sample_value("pdwarden_operator_brake_engaged") == 1
    brake.report(("c", "m"), 0)  # one model recovered
    assert not brake.evaluate("a").engaged
    assert metrics.registry.get_sample_value("pdwarden_operator_brake_engaged") == 0
    for ns in ("a", "b", "b"):
        brake.record_action((ns, "m"))
    assert brake.evaluate("c").scope == "fleet", "3 remediations across namespaces"
    clock[0] += 3600  # the hour slides past the actions
    assert not brake.evaluate("a").engaged
    for ns in ("a", "b", "c"):
        brake.forget((ns, "m"))
    assert "0 model(s)" in brake.evaluate("a").reason


def test_one_namespace_alone_engages_only_its_own_brake() -> None:
    troubled = {("a", "m1"): 3, ("a", "m2"): 2, ("a", "m3"): 1, ("b", "m4"): 1}
    held = judge_all(troubled, {("a", "m1"): 9}, "a", LIMITS, PER_NS)
    assert held.scope == "namespace" and "namespace a brake" in held.reason
    free = judge_all(troubled, {("a", "m1"): 9}, "b", LIMITS, PER_NS)
    assert not free.engaged, free.reason
    # a second namespace in trouble too: the fault is wider than one tenant
    wider = {**troubled, ("b", "m5"): 1, ("c", "m6"): 1}
    assert judge_all(wider, {}, "b", LIMITS, PER_NS).scope == "fleet"


def test_namespace_limits_must_stay_below_the_fleets() -> None:
    check_limits(LIMITS, PER_NS)
    with pytest.raises(ValueError, match="remediations per hour, wedged models"):
        check_limits(LIMITS, BrakeLimits(max_remediations_per_hour=3, max_wedged_models=3, max_wedged_pods=4))


def test_a_new_leader_waits_for_every_model_and_remembers_the_hour_from_status() -> None:
    clock = [T0]
    brake = Brakes(LIMITS, PER_NS, clock=lambda: clock[0], metrics=OperatorMetrics(CollectorRegistry()))
    brake.expect(("a", "m1"))
    brake.expect(("b", "m2"))
    brake.report(("a", "m1"), 0)
    waiting = brake.evaluate("a")
    assert waiting.scope == "startup" and "1 of 2 not yet" in waiting.reason
    done = [
        Remediation(1, "p", "prefill", "wedged", "restart", T0 - 60, Outcome.DELETED),
        Remediation(
            2, "p", "prefill", "wedged", "drain", T0 - 30, Outcome.DELETED, ((Outcome.QUARANTINED, T0 - 30),)
        ),
        Remediation(3, "p", "prefill", "wedged", "alert", T0 - 20, Outcome.ALERTED),
        Remediation(4, "p", "prefill", "wedged", "restart", T0 - 10, Outcome.SKIPPED_BUDGET),
        Remediation(5, "p", "prefill", "wedged", "restart", T0 - 4000, Outcome.DELETED),
    ]
    brake.seed(("b", "m2"), done)
    brake.report(("b", "m2"), 0)
    held = brake.evaluate("b")
    assert held.scope == "namespace" and "2 remediations in the last hour" in held.reason
    brake.seed(("b", "m2"), ())  # seeded once: this process's own records win afterwards
    assert brake.evaluate("b").engaged
    assert not brake.evaluate("a").engaged


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


def test_a_namespaces_brake_series_goes_with_its_last_model() -> None:
    metrics = OperatorMetrics(CollectorRegistry())
    brake = Brakes(LIMITS, PER_NS, metrics=metrics)
    name = "pdwarden_operator_namespace_brake_engaged"
    for model in ("m1", "m2"):
        brake.report(("a", model), 0)
    brake.evaluate("a")
    assert metrics.registry.get_sample_value(name, {"namespace": "a"}) == 0
    brake.forget(("a", "m1"))
    assert metrics.registry.get_sample_value(name, {"namespace": "a"}) == 0, "m2 is still there"
    brake.forget(("a", "m2"))
    assert metrics.registry.get_sample_value(name, {"namespace": "a"}) is None

"""The brakes: per-namespace and fleet limits, engaged and released from the counts alone; one
namespace alone, or two, never engage the fleet brake; alert-only models engage none; counts
survive a failover through status."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from pdwarden_operator.metrics import OperatorMetrics
from pdwarden_operator.watchdog import ladder
from pdwarden_operator.watchdog.brake import (
    DEFAULT_FLEET,
    DEFAULT_NAMESPACE,
    BrakeLimits,
    Brakes,
    FleetLimits,
    check_limits,
    fleet_holds_any,
    judge,
    judge_all,
)
from pdwarden_operator.watchdog.history import PodScrape
from pdwarden_operator.watchdog.outcome import Outcome
from pdwarden_operator.watchdog.parse import PodSample
from pdwarden_operator.watchdog.rule import judge as judge_pod
from pdwarden_operator.watchdog.state import Remediation, WatchdogState
from pdwarden_operator.watchdog.verdict import Verdict
from tests.unit.test_watchdog_ladder import DESIRED, FOUR, RESTART, T0, WEDGED, step

pytestmark = pytest.mark.unit
# two other namespaces suffice here (the default is three): these tests are about the counts
LIMITS = FleetLimits(
    max_remediations_per_hour=3, max_wedged_models=2, max_wedged_pods=4, min_other_troubled_namespaces=2
)
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
    with pytest.raises(ValueError, match="min_other_troubled_namespaces must be at least 2"):
        FleetLimits(min_other_troubled_namespaces=1)
    assert FleetLimits(min_other_troubled_namespaces=2).min_other_troubled_namespaces == 2


def test_brake_releases_on_its_own_and_exports_its_state() -> None:
    clock = [T0]
    metrics = OperatorMetrics(CollectorRegistry())
    brake = Brakes(LIMITS, PER_NS, clock=lambda: clock[0], metrics=metrics)
    for ns in ("a", "b", "c"):  # one troubled model in each of three namespaces
        brake.report((ns, "m"), 1, remediated=True)
    assert brake.evaluate("a").scope == "fleet"
    assert metrics.registry.get_sample_value("pdwarden_operator_brake_engaged") == 1
    brake.report(("c", "m"), 0, remediated=True)  # one model recovered
    assert not brake.evaluate("a").engaged
    assert metrics.registry.get_sample_value("pdwarden_operator_brake_engaged") == 0
    for ns in ("a", "b", "b"):
        brake.record_action((ns, "m"))
    assert brake.evaluate("c").scope == "fleet", "3 remediations across namespaces"
    clock[0] += 3600  # the hour slides past the actions
    assert not brake.evaluate("a").engaged
    for ns in ("a", "b", "c"):
        brake.forget(ns, "m")
    assert "0 model(s)" in brake.evaluate("a").reason


def test_one_namespace_alone_engages_only_its_own_brake() -> None:
    troubled = {("a", "m1"): 3, ("a", "m2"): 2, ("a", "m3"): 1, ("b", "m4"): 1}
    held = judge_all(troubled, {("a", "m1"): 9}, "a", LIMITS, PER_NS)
    assert held.scope == "namespace" and "namespace a brake" in held.reason
    free = judge_all(troubled, {("a", "m1"): 9}, "b", LIMITS, PER_NS)
    assert not free.engaged, free.reason
    # a third namespace in trouble too: the fault is wider than one tenant
    wider = {**troubled, ("b", "m5"): 1, ("c", "m6"): 1}
    assert judge_all(wider, {}, "b", LIMITS, PER_NS).scope == "fleet"


def test_four_troubled_models_in_two_namespaces_do_not_stop_a_third_namespaces_remediation() -> None:
    # one author, two namespaces, each over its own limits (pods and the hour's remediations)
    troubled = {("t1", "m1"): 3, ("t1", "m2"): 3, ("t2", "m3"): 3, ("t2", "m4"): 3}
    done = {("t1", "m1"): 10, ("t2", "m3"): 10}
    # the third namespace has a wedge of its own: the one thing a brake could stop there
    everyone = {**troubled, ("victim", "m5"): 1}
    victim = judge_all(everyone, done, "victim", DEFAULT_FLEET, DEFAULT_NAMESPACE)
    assert not victim.engaged, victim.reason
    for ns in ("t1", "t2"):
        own = judge_all(everyone, done, ns, DEFAULT_FLEET, DEFAULT_NAMESPACE)
        assert own.scope == "namespace", "the author's namespaces are held by their own brakes"
    assert not fleet_holds_any(everyone, done, DEFAULT_FLEET, DEFAULT_NAMESPACE)


def test_three_namespaces_in_trouble_engage_the_fleet_brake() -> None:
    troubled = {(ns, m): 1 for ns in ("a", "b", "c") for m in ("m1", "m2")}
    # a fourth namespace's new wedge is held, and then so is every namespace in trouble
    spread = {**troubled, ("d", "m1"): 1}
    held = judge_all(spread, {}, "d", DEFAULT_FLEET, DEFAULT_NAMESPACE)
    assert held.scope == "fleet", held.reason
    assert "3 other namespaces in trouble; 7 models have wedged pods at once (limit 3)" in held.reason
    for ns in ("a", "b", "c"):
        assert judge_all(spread, {}, ns, DEFAULT_FLEET, DEFAULT_NAMESPACE).scope == "fleet"
    assert fleet_holds_any(spread, {}, DEFAULT_FLEET, DEFAULT_NAMESPACE)
    # the hour's remediations: two namespaces at their limit are not enough, a third's add up
    two = {("a", "m1"): 10, ("b", "m1"): 10}
    assert not judge_all({("d", "m1"): 1}, two, "d", DEFAULT_FLEET, DEFAULT_NAMESPACE).engaged
    three = judge_all({("d", "m1"): 1}, {**two, ("c", "m1"): 1}, "d", DEFAULT_FLEET, DEFAULT_NAMESPACE)
    assert three.scope == "fleet" and "21 remediations in the last hour" in three.reason
    # how many other namespaces it takes is the installation's to choose
    two_others = FleetLimits(min_other_troubled_namespaces=2)
    assert judge_all({("d", "m1"): 1}, two, "d", two_others, DEFAULT_NAMESPACE).scope == "fleet"


def test_alert_only_models_engage_no_brake() -> None:
    metrics = OperatorMetrics(CollectorRegistry())
    brake = Brakes(DEFAULT_FLEET, DEFAULT_NAMESPACE, metrics=metrics)
    keys = [(ns, m) for ns in ("a", "b", "c", "d") for m in ("m1", "m2", "m3")]
    for key in keys:  # every model of four namespaces wedged, none of them remediated
        brake.report(key, 5, remediated=False)
    brake.report(("e", "m1"), 1, remediated=True)
    for ns in ("a", "b", "c", "d", "e"):
        state = brake.evaluate(ns)
        assert not state.engaged, state.reason
    assert "0 model(s), 0 pod(s) in trouble" in brake.evaluate("a").reason
    assert metrics.registry.get_sample_value("pdwarden_operator_brake_engaged") == 0
    for key in keys:  # the same wedges on models that are remediated engage both brakes
        brake.report(key, 5, remediated=True)
    assert brake.evaluate("e").scope == "fleet"
    assert brake.evaluate("a").scope == "fleet"
    assert metrics.registry.get_sample_value("pdwarden_operator_brake_engaged") == 1
    for key in keys[:9]:  # a's, b's and c's models switched to alert stop counting at once
        brake.report(key, 5, remediated=False)
    assert not brake.evaluate("e").engaged, "d and e are two namespaces"
    assert brake.evaluate("d").scope == "namespace"
    assert metrics.registry.get_sample_value("pdwarden_operator_brake_engaged") == 0


def test_the_fleet_gauge_does_not_depend_on_the_namespace_evaluated_last() -> None:
    metrics = OperatorMetrics(CollectorRegistry())
    brake = Brakes(DEFAULT_FLEET, DEFAULT_NAMESPACE, metrics=metrics)
    for ns in ("a", "b", "c"):
        for m in ("m1", "m2"):
            brake.report((ns, m), 1, remediated=True)
    brake.report(("d", "m1"), 0, remediated=True)  # trouble-free: the fleet brake holds it alone
    gauge = "pdwarden_operator_brake_engaged"
    assert brake.evaluate("d").scope == "fleet"
    assert metrics.registry.get_sample_value(gauge) == 1
    assert brake.evaluate("a").engaged is False, "two other namespaces only"
    assert metrics.registry.get_sample_value(gauge) == 1, "still held: d"


def test_namespace_limits_must_stay_below_the_fleets() -> None:
    check_limits(LIMITS, PER_NS)
    with pytest.raises(ValueError, match="remediations per hour, wedged models"):
        check_limits(LIMITS, BrakeLimits(max_remediations_per_hour=3, max_wedged_models=3, max_wedged_pods=4))


def test_a_new_leader_waits_for_every_model_and_remembers_the_hour_from_status() -> None:
    clock = [T0]
    brake = Brakes(LIMITS, PER_NS, clock=lambda: clock[0], metrics=OperatorMetrics(CollectorRegistry()))
    brake.expect(("a", "m1"))
    brake.expect(("b", "m2"))
    brake.report(("a", "m1"), 0, remediated=True)
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
    brake.report(("b", "m2"), 0, remediated=True)
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
    obs = [PodScrape(T0 + 10 * i, PodSample(3, 5 + 10 * i, 7)) for i in range(5)]
    verdict: Verdict = judge_pod(obs, 60)
    assert verdict.state == "ok" and verdict.stalling and verdict.troubled
    progressing = [PodScrape(T0 + 10 * i, PodSample(3, 5, 7 + i)) for i in range(5)]
    assert not judge_pod(progressing, 60).troubled


def test_a_pod_stalled_after_earlier_progress_counts_too() -> None:
    # one room finished long ago (counter 0 -> 1), then the queue stalled for half the threshold
    obs = [PodScrape(T0, PodSample(1, 1, 0))] + [
        PodScrape(T0 + 10 * i, PodSample(1, 10 * i, 1)) for i in range(1, 5)
    ]
    verdict = judge_pod(obs, 60)
    assert verdict.state == "ok" and verdict.troubled


def test_a_namespaces_brake_series_goes_with_its_last_model() -> None:
    metrics = OperatorMetrics(CollectorRegistry())
    brake = Brakes(LIMITS, PER_NS, metrics=metrics)
    name = "pdwarden_operator_namespace_brake_engaged"
    for model in ("m1", "m2"):
        brake.report(("a", model), 0, remediated=True)
    brake.evaluate("a")
    assert metrics.registry.get_sample_value(name, {"namespace": "a"}) == 0
    brake.forget("a", "m1")
    assert metrics.registry.get_sample_value(name, {"namespace": "a"}) == 0, "m2 is still there"
    brake.forget("a", "m2")
    assert metrics.registry.get_sample_value(name, {"namespace": "a"}) is None

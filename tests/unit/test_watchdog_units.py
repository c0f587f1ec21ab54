"""The pieces the per-model round is built from: units (a pod or a group), the ladder's
first-step table, alerts as records of their own, the judge over a frozen observation, and
the autoscaler's aims (what its executor writes, taken from the plan)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from pdwarden_operator.models import parse_spec
from pdwarden_operator.resource.watchdog import WatchdogSpec
from pdwarden_operator.watchdog import autoscale, ladder, remediate
from pdwarden_operator.watchdog.executor import DONE, REPORT_ONLY, ModelIdentity
from pdwarden_operator.watchdog.history import PodScrape
from pdwarden_operator.watchdog.observe import ModelObservation
from pdwarden_operator.watchdog.outcome import Outcome
from pdwarden_operator.watchdog.parse import PodSample
from pdwarden_operator.watchdog.scaler import RolePod, aim
from pdwarden_operator.watchdog.state import WatchdogState, state_from_status, state_to_status
from pdwarden_operator.watchdog.verdict import PodView, Unit, Verdict, VerdictState

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0
WEDGED = Verdict(VerdictState.WEDGED, "no progress for 400s: inflight=3", {"inflight": 3})
OK = Verdict(VerdictState.OK, "idle", cleared=True)
SETTINGS = WatchdogSpec(
    stuck_after_seconds=60,
    scrape_interval_seconds=10,
    action="drain",
    max_remediations=3,
    budget_window_seconds=3600,
    max_unavailable=1,
    drain_seconds=120,
)
GROUP = Unit(
    "group", "m-decode-0", "uid-leader", (("m-decode-0-0", "uid-leader"), ("m-decode-0-1", "uid-r1"))
)


def _pod(name: str, role: str = "decode") -> PodView:
    return PodView(name=name, uid=f"uid-{name}", role=role, ready=True, terminating=False)


def _group_view() -> PodView:
    return PodView(GROUP.name, GROUP.key, "decode", True, False, group=GROUP)


def test_a_pods_unit_is_itself_and_a_groups_key_differs_from_its_leaders_uid() -> None:
    pod = _pod("d0")
    assert pod.unit == Unit("pod", "d0", "uid-d0") and pod.unit.key == pod.uid
    assert GROUP.key != GROUP.uid and Unit.kind_of_key(GROUP.key) == "group"
    assert Unit.kind_of_key(pod.uid) == "pod"
    assert _group_view().unit is GROUP


@pytest.mark.parametrize(
    ("action", "kind", "recorded", "first"),
    [
        ("restart", "pod", "restart", "restart"),
        ("evict", "pod", "evict", "evict"),
        ("drain", "pod", "drain", "quarantine"),
        ("restart", "group", "restart", "restart"),
        ("evict", "group", "evict", "evict"),
        ("drain", "group", "evict", "evict"),  # a group is restarted whole, never drained rank by rank
    ],
)
def test_the_first_step_of_a_remediation_by_action_and_unit(
    action: Any, kind: Any, recorded: str, first: str
) -> None:
    assert ladder.FIRST_STEP[(action, kind)] == (recorded, first)
    view = _pod("d0") if kind == "pod" else _group_view()
    settings = SETTINGS.model_copy(update={"action": action})
    plan = ladder.plan(
        verdicts={view.uid: WEDGED}, pods=[view], state=WatchdogState(), settings=settings, now=T0, desired={}
    )
    assert [(a.kind, a.target.kind) for a in plan.actions] == [(first, kind)]
    assert [f.action for f in plan.state.in_flight] == [recorded]
    assert plan.actions[0].target == view.unit  # the ranks travel with the action


def test_every_step_has_an_outcome_and_only_alerts_touch_no_pod() -> None:
    assert set(DONE) == {"alert", "restart", "evict", "quarantine", "finish-drain"}
    assert {"alert"} == REPORT_ONLY and DONE["alert"] == Outcome.ALERTED


def test_an_alert_is_a_record_of_its_own_and_takes_no_remediation_slot() -> None:
    settings = SETTINGS.model_copy(update={"action": "alert", "max_unavailable": 1})
    pods = [_pod("d0"), _pod("d1")]
    plan = ladder.plan(
        verdicts={"uid-d0": WEDGED}, pods=pods, state=WatchdogState(), settings=settings, now=T0, desired={}
    )
    assert [a.kind for a in plan.actions] == ["alert"] and plan.state.in_flight == ()
    assert [(a.pod, a.remediation_id) for a in plan.state.alerts] == [("d0", 1)]
    # the status lists it among inFlight, as before; read back, it is an alert again
    status = state_to_status(
        plan.state, last_scrape=T0, wedged_pods=[], unobserved_pods=[], max_remediations=3
    )
    [entry] = status["watchdog"]["inFlight"]
    assert (entry["action"], entry["lastOutcome"], entry["attempts"]) == ("alert", "alerted", 1)
    back = state_from_status(status)
    assert back.in_flight == () and back.alerts == plan.state.alerts
    # performing it changes no in-flight entry; the episode ends once the pod is healthy
    state = ladder.apply_results(plan.state, [ladder.ActionResult(plan.actions[0], Outcome.ALERTED)], T0)
    assert state == plan.state
    later = ladder.plan(
        verdicts={"uid-d0": OK}, pods=pods, state=state, settings=settings, now=T0 + 10, desired={}
    )
    assert later.state.alerts == () and later.actions == ()


def _obs(histories: dict[str, tuple[PodScrape, ...]], views: list[PodView]) -> ModelObservation:
    spec = parse_spec(
        {
            "model": {"path": "synthetic/bench"},
            "engine": "synthetic",
            "transfer": {"inflightDeadlineSeconds": 30, "transferDeadlineSeconds": 20},
            "watchdog": {"stuckAfterSeconds": 60, "scrapeIntervalSeconds": 10},
        }
    )
    objs = [{"metadata": {"name": v.name, "uid": v.uid, "labels": {}}} for v in views]
    return ModelObservation(
        model=ModelIdentity("ns", "m", "uid-m"),
        spec=spec,
        body={},
        now=T0,
        at=1000.0,
        pods=tuple(objs),
        paired=tuple(zip(views, objs, strict=True)),
        scraped=tuple(histories),
        histories=histories,
        deployments={},
    )


def _sample(inflight: float, transfers: float) -> PodSample:
    return PodSample(inflight=inflight, oldest_age=30.0 if inflight else 0.0, transfers=transfers)


def test_the_judge_reads_only_the_frozen_observation() -> None:
    stuck = tuple(PodScrape(1000.0 - 10 * i, _sample(3, 5)) for i in reversed(range(9)))
    idle = tuple(PodScrape(1000.0 - 10 * i, _sample(0, 5)) for i in reversed(range(9)))
    views = [_pod("d0"), _pod("d1"), _pod("d2")]  # d2 not scraped this round: no verdict
    judged = remediate.judge(_obs({"uid-d0": stuck, "uid-d1": idle}, views))
    assert judged.pods["uid-d0"].wedged and not judged.pods["uid-d1"].wedged
    assert set(judged.verdicts) == {"uid-d0", "uid-d1"} and judged.named(VerdictState.WEDGED) == ["d0"]
    assert judged.troubled() == 1


def _role_pod(name: str, transferring: float = 0.0) -> RolePod:
    sample = replace(_sample(1, 5), transferring=transferring)
    return RolePod(_pod(name), OK, sample, {})


def _decision(current: int, desired: int) -> autoscale.RoleDecision:
    return autoscale.RoleDecision(
        "decode", current, desired, desired, autoscale.Reason.LOAD_BELOW_TARGET, "decode: down", False, 0.5
    )


MEMORY = autoscale.RoleMemory(started_at=0.0, changes=((900.0, 1), (T0, -2)))


@pytest.mark.parametrize(
    ("pods", "writes", "victim", "reason"),
    [
        ([_role_pod("d0"), _role_pod("d1", transferring=1)], 2, "d0", autoscale.Reason.LOAD_BELOW_TARGET),
        ([_role_pod("d0", 1), _role_pod("d1", 1)], 3, None, autoscale.Reason.HELD),
    ],
    ids=["one pod fewer, the idle one first", "every pod moves KV: held"],
)
def test_a_scale_in_is_aimed_one_pod_at_a_time(
    pods: list[RolePod], writes: int, victim: str | None, reason: autoscale.Reason
) -> None:
    aimed = aim("decode", _decision(3, 1), MEMORY, pods, T0)
    assert aimed.decision.desired == writes and aimed.decision.reason == reason
    assert (aimed.victim.view.name if aimed.victim else None) == victim
    # the memory before this round's change: what is recorded comes from the write
    assert aimed.memory.changes == ((900.0, 1),)


def test_what_a_role_records_is_what_was_written() -> None:
    aimed = aim("decode", _decision(3, 1), MEMORY, [_role_pod("d0"), _role_pod("d1")], T0)
    decision, memory = aimed.settled(2, T0)
    assert decision.desired == 2 and memory.changes == ((900.0, 1), (T0, -1))
    decision, memory = aimed.settled(None, T0)  # refused, or not leading: nothing changed
    assert decision.desired == 3 and memory.changes == ((900.0, 1),)
    up = aim("decode", _decision(2, 4), MEMORY, [], T0)
    assert up.writes and up.victim is None and up.settled(4, T0)[1].changes == ((900.0, 1), (T0, 2))

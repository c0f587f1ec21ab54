"""Groups as the unit of health: folding, breakage, and the ladder's decisions on groups."""

from __future__ import annotations

from typing import Any

import pytest

import pdwarden_contract as contract
from pdwarden_operator.resource.watchdog import WatchdogSpec
from pdwarden_operator.watchdog import group_health
from pdwarden_operator.watchdog.ladder import plan
from pdwarden_operator.watchdog.outcome import Outcome
from pdwarden_operator.watchdog.state import WatchdogState
from pdwarden_operator.watchdog.verdict import PodView, Verdict, VerdictState

pytestmark = pytest.mark.unit

NOW = 1_800_000_000.0
T0 = "2027-01-15T08:00:00Z"  # group pods' creation
T_LATE = "2027-01-15T08:05:00Z"


def _pod(
    role: str,
    group: int,
    rank: int,
    *,
    ready: bool = True,
    restarts: int = 0,
    created: str = T0,
    finished: str = T0,
    code: int = 1,
) -> tuple[PodView, dict[str, Any]]:
    name = f"m-{role}-{group}-{rank}"
    obj: dict[str, Any] = {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "labels": {
                contract.LABEL_ROLE: role,
                contract.LABEL_GROUP: str(group),
                contract.LABEL_POD_INDEX: str(rank),
            },
        },
        "status": {
            "containerStatuses": [
                {
                    "restartCount": restarts,
                    "lastState": (
                        {"terminated": {"reason": "Error", "exitCode": code, "finishedAt": finished}}
                        if restarts
                        else {}
                    ),
                }
            ]
        },
    }
    return PodView(name, f"uid-{name}", role, ready, False), obj


NODES = {contract.ROLE_PREFILL: 1, contract.ROLE_DECODE: 2}
T0_EPOCH = group_health._epoch(T0)


def _fold(
    pods: list[tuple[PodView, dict[str, Any]]], verdicts: dict[str, Verdict] | None = None
) -> tuple[dict[str, PodView], dict[str, Verdict], dict[str, group_health.Group]]:
    found = group_health.groups_of(pods, "m", NODES)
    views = {v.uid: v for v, _ in pods}
    ok = {v.uid: Verdict(VerdictState.OK, "idle", cleared=True) for v, _ in pods}
    folded_views, folded = group_health.fold(views, {**ok, **(verdicts or {})}, found, T0_EPOCH + 300)
    return folded_views, folded, found


def test_whole_groups_are_one_healthy_entry_each_and_single_pods_stay_as_they_are() -> None:
    single: tuple[PodView, dict[str, Any]] = (
        PodView("m-prefill-abc", "uid-p", contract.ROLE_PREFILL, True, False),
        {"metadata": {}},
    )
    pods = [_pod("decode", 0, 0), _pod("decode", 0, 1), _pod("decode", 1, 0), _pod("decode", 1, 1), single]
    views, verdicts, found = _fold(pods)
    assert sorted(v.name for v in views.values()) == ["m-decode-0", "m-decode-1", "m-prefill-abc"]
    assert all(v.ready for v in views.values())
    assert all(v.state == VerdictState.OK for v in verdicts.values())
    assert group_health.members(found)[found["m-decode-1"].uid] == (
        ("m-decode-1-0", "uid-m-decode-1-0"),
        ("m-decode-1-1", "uid-m-decode-1-1"),
    )


@pytest.mark.parametrize(
    ("pods", "rank", "words"),
    [
        (
            [_pod("decode", 0, 0), _pod("decode", 0, 1, restarts=1)],
            1,
            "crashed (Error, exit code 1)",
        ),
        ([_pod("decode", 0, 0), _pod("decode", 0, 1, created=T_LATE)], 1, "was replaced alone"),
        ([_pod("decode", 0, 0)], 1, "rank 1 is missing"),
    ],
)
def test_a_crashed_replaced_or_missing_rank_breaks_its_group_naming_the_rank(
    pods: list[tuple[PodView, dict[str, Any]]], rank: int, words: str
) -> None:
    _, verdicts, found = _fold(pods)
    verdict = verdicts[found["m-decode-0"].uid]
    assert verdict.wedged and words in verdict.reason and "group m-decode-0" in verdict.reason
    assert verdict.figures["rank"] == rank


def test_a_starting_group_is_not_broken() -> None:
    group = group_health.groups_of([_pod("decode", 0, 0, ready=False)], "m", NODES)["m-decode-0"]
    assert group_health.broken(group, T0_EPOCH + 5) is None
    assert not group.view().ready


def test_a_wedged_rank_wedges_its_group() -> None:
    pods = [_pod("decode", 0, 0), _pod("decode", 0, 1)]
    stuck = {"uid-m-decode-0-0": Verdict(VerdictState.WEDGED, "no progress for 400s", {"inflight": 3.0})}
    _, verdicts, found = _fold(pods, stuck)
    verdict = verdicts[found["m-decode-0"].uid]
    assert verdict.wedged and "rank 0 (pod m-decode-0-0) is wedged: no progress" in verdict.reason


def test_the_ladder_restarts_one_group_at_a_time_counting_groups_against_max_unavailable() -> None:
    pods = [
        _pod("decode", 0, 0),
        _pod("decode", 0, 1, restarts=2),
        _pod("decode", 1, 0),
        _pod("decode", 1, 1, restarts=1),
        _pod("decode", 2, 0),
        _pod("decode", 2, 1),
    ]
    views, verdicts, found = _fold(pods)
    settings = WatchdogSpec.model_validate({"action": "restart", "maxUnavailable": 1})
    decided = plan(
        verdicts=verdicts,
        pods=list(views.values()),
        state=WatchdogState(),
        settings=settings,
        now=NOW,
        desired={contract.ROLE_DECODE: 3, contract.ROLE_PREFILL: 0},
    )
    assert [(a.pod, a.uid) for a in decided.actions] == [("m-decode-0", found["m-decode-0"].uid)]
    entries = decided.state.remediations
    assert [(e.pod, e.outcome) for e in entries if e.outcome == Outcome.PENDING] == [
        ("m-decode-0", Outcome.PENDING)
    ]
    assert "rank 1 (pod m-decode-0-1) crashed" in entries[0].reason
    # the second broken group waits: the first one counts as the one unavailable group
    assert any(n.pod == "m-decode-1" and n.event_reason == "RemediationDeferred" for n in decided.notices)


def test_a_restarted_group_is_a_new_entry_so_the_open_remediation_settles() -> None:
    before = group_health.groups_of([_pod("decode", 0, 0), _pod("decode", 0, 1, restarts=1)], "m", NODES)
    new_leader = _pod("decode", 0, 0)
    renamed = (
        PodView(new_leader[0].name, "uid-new-leader", "decode", True, False),
        {**new_leader[1], "metadata": {**new_leader[1]["metadata"], "uid": "uid-new-leader"}},
    )
    after = group_health.groups_of([renamed, _pod("decode", 0, 1)], "m", NODES)
    assert before["m-decode-0"].uid != after["m-decode-0"].uid


def test_the_rank_that_went_down_first_is_named_not_the_one_that_followed_it() -> None:
    killed = _pod("decode", 0, 1, restarts=1, finished="2027-01-15T08:01:00Z")
    followed = _pod("decode", 0, 0, restarts=1, finished="2027-01-15T08:01:02Z")
    _, verdicts, found = _fold([followed, killed])
    assert "rank 1 (pod m-decode-0-1) crashed" in verdicts[found["m-decode-0"].uid].reason


def test_group_pods_without_their_rank_label_are_found_once() -> None:
    pods = [_pod("decode", 0, 0)[1], _pod("decode", 0, 1)[1], {"metadata": {"name": "single", "uid": "u"}}]
    pods[0]["metadata"]["labels"][contract.LABEL_RANK] = "0"
    assert group_health.unlabelled_ranks(pods) == [("m-decode-0-1", "uid-m-decode-0-1", "1")]


def test_drain_restarts_a_broken_group_whole_as_evict_does() -> None:
    views, verdicts, found = _fold([_pod("decode", 0, 0), _pod("decode", 0, 1, restarts=1)])
    decided = plan(
        verdicts=verdicts,
        pods=list(views.values()),
        state=WatchdogState(),
        settings=WatchdogSpec.model_validate({"action": "drain", "maxUnavailable": 1}),
        now=NOW,
        desired={contract.ROLE_DECODE: 1, contract.ROLE_PREFILL: 0},
    )
    assert [(a.pod, a.kind) for a in decided.actions] == [("m-decode-0", "evict")]
    assert [(e.pod, e.action, e.phases) for e in decided.state.remediations] == [("m-decode-0", "evict", ())]
    assert [f.uid for f in decided.state.in_flight] == [found["m-decode-0"].uid]


def test_within_one_second_the_rank_a_signal_ended_is_named_before_the_one_that_exited_on_it() -> None:
    same_second = "2027-01-15T08:01:00Z"
    leader = _pod("decode", 0, 0, restarts=1, finished=same_second, code=1)  # saw its worker go
    killed = _pod("decode", 0, 1, restarts=1, finished=same_second, code=137)  # SIGKILL
    _, verdicts, found = _fold([leader, killed])
    assert (
        "rank 1 (pod m-decode-0-1) crashed (Error, exit code 137)" in verdicts[found["m-decode-0"].uid].reason
    )

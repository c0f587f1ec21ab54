"""The wedge rule over recorded metric histories (bodies as a runtime pod serves them)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pdwarden_operator.watchdog.history import PodHistory, PodScrape
from pdwarden_operator.watchdog.parse import ParseError, parse_metrics
from pdwarden_operator.watchdog.rule import judge
from pdwarden_operator.watchdog.verdict import Verdict, VerdictState

pytestmark = pytest.mark.unit

STUCK = 60.0
INTERVAL = 10.0


def body(
    inflight: float,
    age: float,
    success: float,
    failed: float = 0,
    role: str = "prefill",
    transferring: float | None = None,
    bootstrapping: float = 0.0,
) -> str:
    """A runtime pod's /metrics body, with the noise a real one carries. `transferring` is the
    age in state of its oldest Transferring room (None: the pod does not export per-state ages)."""
    in_state = ""
    if transferring is not None:
        in_state = f"""# HELP pdwarden_kv_oldest_in_state_seconds Oldest room per state, since it entered it
# TYPE pdwarden_kv_oldest_in_state_seconds gauge
pdwarden_kv_oldest_in_state_seconds{{role="{role}",state="bootstrapping"}} {bootstrapping}
pdwarden_kv_oldest_in_state_seconds{{role="{role}",state="waiting_for_input"}} 0.0
pdwarden_kv_oldest_in_state_seconds{{role="{role}",state="transferring"}} {transferring}
"""
    return (
        in_state
        + f"""# HELP pdwarden_inflight_requests Requests holding KV in flight
# TYPE pdwarden_inflight_requests gauge
pdwarden_inflight_requests{{role="{role}"}} {inflight}
# HELP pdwarden_inflight_oldest_age_seconds Age of the oldest non-terminal room
# TYPE pdwarden_inflight_oldest_age_seconds gauge
pdwarden_inflight_oldest_age_seconds{{role="{role}"}} {age}
# HELP pdwarden_kv_transfers_total Finished rooms
# TYPE pdwarden_kv_transfers_total counter
pdwarden_kv_transfers_total{{outcome="success",role="{role}"}} {success}
pdwarden_kv_transfers_total{{outcome="failed",role="{role}"}} {failed}
pdwarden_kv_transfers_total{{outcome="aborted",role="{role}"}} 0.0
pdwarden_kv_transfers_total{{outcome="deadline",role="{role}"}} 0.0
# HELP pdwarden_kv_transfers_created Finished rooms
# TYPE pdwarden_kv_transfers_created gauge
pdwarden_kv_transfers_created{{outcome="success",role="{role}"}} 1.79e+09
# HELP pdwarden_kv_transfer_seconds Room start to terminal
# TYPE pdwarden_kv_transfer_seconds histogram
pdwarden_kv_transfer_seconds_bucket{{le="0.1",role="{role}"}} 3.0
pdwarden_kv_transfer_seconds_bucket{{le="+Inf",role="{role}"}} 4.0
pdwarden_kv_transfer_seconds_count{{role="{role}"}} 4.0
pdwarden_kv_transfer_seconds_sum{{role="{role}"}} 0.3
# HELP pdwarden_runtime_info identity
# TYPE pdwarden_runtime_info gauge
pdwarden_runtime_info{{engine="synthetic",transfer_backend="nixl",version="0.1.0"}} 1.0
"""
    )


def replay(bodies: Sequence[str | None], start: float = 1000.0, interval: float = INTERVAL) -> list[Verdict]:
    """Feed recorded bodies (None: the scrape failed) through parse + history + rule, one per interval."""
    history = PodHistory(keep_seconds=STUCK + 3 * interval)
    verdicts = []
    for i, text in enumerate(bodies):
        at = start + i * interval
        if text is None:
            history.add(PodScrape(at, None, "timeout after 5s"))
        else:
            try:
                history.add(PodScrape(at, parse_metrics(text)))
            except ParseError as exc:
                history.add(PodScrape(at, None, str(exc)))
        verdicts.append(judge(history.observations(), STUCK))
    return verdicts


def test_busy_pod_that_keeps_finishing_transfers_is_never_wedged() -> None:
    # a deep queue (500 in flight) for 30 minutes, but transfers complete between every scrape
    verdicts = replay([body(500, 40, 100 + 7 * i) for i in range(180)])
    assert all(v.state == "ok" for v in verdicts)
    assert verdicts[-1].cleared and "progressing" in verdicts[-1].reason


def test_idle_pod_is_ok() -> None:
    verdicts = replay([body(0, 0, 42) for _ in range(30)])
    assert {v.state for v in verdicts} == {"ok"}
    assert verdicts[-1].reason == "idle"


def test_no_progress_while_inflight_is_wedged_after_stuck_after_seconds() -> None:
    bodies = [body(3, 5 + i, 10 + i) for i in range(5)] + [body(3, 9 + i, 14) for i in range(1, 12)]
    verdicts = replay(bodies)
    states = [v.state for v in verdicts]
    first_wedged = states.index(VerdictState.WEDGED)
    # the counter last moved at index 4 (value 14); 60 s later is index 10
    assert first_wedged == 4 + int(STUCK / INTERVAL)
    assert all(s == "wedged" for s in states[first_wedged:])
    wedged = verdicts[first_wedged]
    assert "no progress for 60s" in wedged.reason and "inflight=3" in wedged.reason
    assert "transfers_total stayed 14" in wedged.reason
    assert wedged.figures["stalledSeconds"] == 60.0 and wedged.figures["inflight"] == 3


def test_just_under_stuck_after_is_not_wedged() -> None:
    verdicts = replay([body(2, 1, 7)] * int(STUCK / INTERVAL))  # 6 scrapes span 50 s
    assert all(v.state == "ok" for v in verdicts)
    assert not verdicts[-1].cleared and "busy, no progress" in verdicts[-1].reason


def test_wedged_by_age_in_transferring_although_other_rooms_progress() -> None:
    # one room stuck in Transferring since t=0 while others keep finishing: the counter moves,
    # its age in that state grows
    bodies = [body(4, 10 * i + 1, 100 + 5 * i, transferring=10 * i + 1) for i in range(12)]
    verdicts = replay(bodies)
    states = [v.state for v in verdicts]
    # age > 60 first at i=6 (61 s); confirmed on the next scrape, i=7
    assert states.index(VerdictState.WEDGED) == 7
    assert "oldest room in state transferring for 71s (previous scrape 61s)" in verdicts[7].reason
    assert verdicts[7].figures["transferringSeconds"] == 71


def test_busy_pod_with_old_queueing_rooms_is_not_wedged() -> None:
    # 54 rooms in flight, the oldest opened 65 s+ ago and still growing, but every room waits
    # for bootstrap or its forward pass (Transferring ages stay short) and transfers finish
    bodies = [
        body(54, 65 + 10 * i, 100 + 9 * i, transferring=2.0, bootstrapping=65 + 10 * i) for i in range(12)
    ]
    assert all(v.state == "ok" for v in replay(bodies))


def test_old_room_without_per_state_ages_is_judged_by_progress_alone() -> None:
    # a pod that does not export pdwarden_kv_oldest_in_state_seconds: an old, ageing oldest room
    # does not wedge it while transfers complete...
    assert all(v.state == "ok" for v in replay([body(4, 10 * i + 1, 100 + 5 * i) for i in range(12)]))
    # ...and the progress clause still wedges it once nothing finishes
    verdicts = replay([body(4, 10 * i + 1, 100) for i in range(8)])
    assert verdicts[-1].state == "wedged" and "no progress" in verdicts[-1].reason


def test_slow_transfers_that_finish_are_not_wedged_by_age() -> None:
    # overloaded but working: each oldest Transferring room is over the threshold, yet a
    # different one every scrape (ages do not grow with time) while transfers complete
    bodies = [body(2, 65 + (i % 3), 100 + 3 * i, transferring=65 + (i % 3)) for i in range(12)]
    assert all(v.state == "ok" for v in replay(bodies))


def test_transferring_age_over_threshold_once_then_a_younger_oldest_is_not_wedged() -> None:
    # a slow room finished; the new oldest is young: not the same stuck room
    ages = (70, 20, 75, 30)
    bodies = [body(4, a, 100 + 5 * i, transferring=a) for i, a in enumerate(ages)]
    assert all(v.state == "ok" for v in replay(bodies))


def test_counter_reset_after_a_pod_restart_discards_old_evidence() -> None:
    stuck_before = [body(3, 1, 500)] * 5  # 40 s without progress...
    after_restart = [body(3, 1, 2)] * 5  # ...then the process restarted: counter went down
    verdicts = replay(stuck_before + after_restart)
    assert all(v.state == "ok" for v in verdicts)
    # and the new process is judged on its own: 60 s more without progress wedges it
    verdicts = replay(stuck_before + after_restart + [body(3, 1, 2)] * 3)
    assert verdicts[-1].state == "wedged"
    assert verdicts[-1].figures["stalledSeconds"] == 70.0


def test_unobserved_pod_is_never_wedged() -> None:
    bodies: list[str | None] = [body(3, 1, 9)] * 8 + [None] * 10
    verdicts = replay(bodies)
    assert verdicts[7].state == "wedged"
    assert all(v.state == "unobserved" for v in verdicts[8:])
    assert "timeout" in verdicts[-1].reason


def test_gap_in_scrapes_restarts_the_consecutive_count() -> None:
    bodies: list[str | None] = []
    for _ in range(20):
        bodies += [body(3, 1, 9), None]  # every other scrape fails: never two consecutive
    assert all(v.state != "wedged" for v in replay(bodies))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage\x00\x01",
        'pdwarden_inflight_requests{role="prefill"} NaN\n',
        body(3, 1, 9).replace(" 9\n", " -9\n"),
        body(3, 1, 9).replace(
            'pdwarden_inflight_oldest_age_seconds{role="prefill"} 1',
            'pdwarden_inflight_oldest_age_seconds{role="prefill"} +Inf',
        ),
        body(3, 1, 9).replace(
            "# TYPE pdwarden_inflight_requests gauge", "# TYPE pdwarden_inflight_requests counter"
        ),
        body(3, 1, 9) + 'pdwarden_inflight_requests{role="prefill"} 5\n',
        body(3, 1, 9)[:120],
        body(3, 1, 9, transferring=-5),
    ],
    ids=[
        "empty",
        "binary",
        "nan",
        "negative-counter",
        "inf-age",
        "wrong-type",
        "duplicate",
        "truncated",
        "negative-age-in-state",
    ],
)
def test_garbage_input_is_unobserved(text: str) -> None:
    # a pod judged wedged whose next bodies are garbage is unobserved, not (still) wedged
    verdicts = replay([body(3, 1, 9)] * 7 + [text] * 3)
    assert verdicts[6].state == "wedged"
    assert [v.state for v in verdicts[7:]] == ["unobserved"] * 3


def test_no_history_is_unobserved() -> None:
    assert judge([], STUCK).state == "unobserved"


def test_history_keeps_only_what_the_rule_needs() -> None:
    history = PodHistory(keep_seconds=90)
    for i in range(1000):
        history.add(PodScrape(float(i * 10), None, "x"))
    assert 3 <= len(history) <= 11


def test_docs_and_rule_define_wedged_word_for_word_in_one_place() -> None:
    from pathlib import Path

    from pdwarden_operator.watchdog import rule

    root = Path(__file__).resolve().parents[2]

    def words(text: str) -> str:
        return " ".join(text.replace("**", "").split())

    doc = words(rule.__doc__ or "")
    definition = doc[doc.index("A pod is wedged") : doc.index("judged by the progress clause alone.")]
    assert "Transferring" in definition
    # one source for each fact: the rule's docstring and docs/wedges.md, no other page
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    holding = [page.relative_to(root).as_posix() for page in pages if definition in words(page.read_text())]
    assert holding == ["docs/wedges.md"]


def test_the_judged_state_is_the_runtimes_transferring_label() -> None:
    from pdwarden_operator.watchdog.parse import STUCK_STATE
    from pdwarden_runtime.kvpoll import KVPoll

    assert KVPoll.Transferring.label == STUCK_STATE


def rooms_body(
    inflight: float, success: float, states: dict[str, float], abandoned: float | None = None
) -> str:
    """`body` plus the per-state room counts (and the abandoned-rooms gauge) a runtime serves."""
    lines = ["# HELP pdwarden_kv_rooms Rooms per KV status.", "# TYPE pdwarden_kv_rooms gauge"]
    lines += [f'pdwarden_kv_rooms{{role="prefill",state="{s}"}} {n}' for s, n in states.items()]
    if abandoned is not None:
        lines += [
            "# HELP pdwarden_kv_rooms_abandoned Rooms held for requests that ended.",
            "# TYPE pdwarden_kv_rooms_abandoned gauge",
            f'pdwarden_kv_rooms_abandoned{{role="prefill"}} {abandoned}',
        ]
    return "\n".join(lines) + "\n" + body(inflight, 120, success, transferring=0.0)


def test_rooms_waiting_on_a_peer_to_bootstrap_are_not_a_wedge() -> None:
    # 55 rooms wait for decode's metadata for minutes (their decode legs gave up) and nothing
    # finishes: the pod has nothing of its own to move; the verdict names the rooms
    bodies = [rooms_body(55, 544, {"bootstrapping": 55}) for _ in range(20)]
    verdicts = replay(bodies)
    assert {v.state for v in verdicts} == {"ok"}
    last = verdicts[-1]
    assert last.reason.startswith("idle") and "55 waiting on a peer to bootstrap" in last.reason
    assert last.figures["bootstrapping"] == 55 and last.figures["inflight"] == 55


def test_rooms_of_its_own_beside_bootstrapping_ones_still_make_a_wedge() -> None:
    bodies = [rooms_body(10, 544, {"bootstrapping": 7, "waiting_for_input": 3}) for _ in range(12)]
    verdicts = replay(bodies)
    assert verdicts[-1].state == "wedged"
    assert "no progress" in verdicts[-1].reason and "7 waiting on a peer" in verdicts[-1].reason


def test_abandoned_rooms_are_named_and_never_make_a_wedge() -> None:
    bodies = [rooms_body(0, 300, {"failed": 4}, abandoned=4) for _ in range(20)]
    verdicts = replay(bodies)
    assert {v.state for v in verdicts} == {"ok"}
    assert verdicts[-1].figures["abandonedRooms"] == 4
    assert "4 abandoned" in verdicts[-1].reason


def test_a_runtime_without_per_state_counts_is_judged_on_all_its_rooms() -> None:
    # an older runtime: no pdwarden_kv_rooms; every room in flight counts, as before
    sample = parse_metrics(body(5, 10, 3))
    assert sample.bootstrapping is None and sample.abandoned is None and sample.working == 5


@pytest.mark.parametrize(
    "garbage",
    [
        'pdwarden_kv_rooms{role="prefill",state="stuck-forever"} 3\n',
        'pdwarden_kv_rooms{role="prefill",state="bootstrapping"} -1\n',
        'pdwarden_kv_rooms{role="prefill",state="bootstrapping"} NaN\n',
        "# TYPE pdwarden_kv_rooms_abandoned counter\npdwarden_kv_rooms_abandoned_total 3\n",
    ],
)
def test_garbage_per_state_or_abandoned_figures_leave_the_pod_unobserved(garbage: str) -> None:
    with pytest.raises(ParseError):
        parse_metrics(garbage + body(5, 10, 3))


def test_per_state_counts_above_inflight_are_clamped() -> None:
    # the two gauges are read at slightly different instants
    sample = parse_metrics(rooms_body(3, 10, {"bootstrapping": 5}))
    assert sample.bootstrapping == 3 and sample.working == 0

"""Pair-aware blame (operator/pdwarden_operator/watchdog/blame.py): the pure rule, and the
per-peer figures' parse (garbage there never makes a pod unobserved nor blamed)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pdwarden_contract as c
from pdwarden_operator.watchdog.blame import attribute
from pdwarden_operator.watchdog.history import PodScrape
from pdwarden_operator.watchdog.parse import PeerFigures, PodSample, parse_metrics
from pdwarden_operator.watchdog.verdict import PodView, Verdict, VerdictState

pytestmark = pytest.mark.unit

STUCK = 20.0
P0 = PodView("m-prefill-0", "u-p0", c.ROLE_PREFILL, True, False, ip="198.18.0.10")
P1 = PodView("m-prefill-1", "u-p1", c.ROLE_PREFILL, True, False, ip="198.18.0.11")
D0 = PodView("m-decode-0", "u-d0", c.ROLE_DECODE, True, False, ip="198.18.0.20")
D1 = PodView("m-decode-1", "u-d1", c.ROLE_DECODE, True, False, ip="198.18.0.21")
PODS = [P0, P1, D0, D1]
OK = Verdict(VerdictState.OK, "progressing", cleared=True)


def figures(step: int, per_peer: dict[str, tuple[int, int, int]]) -> PeerFigures:
    """per_peer: peer -> (successes per step, bad per step, in flight)."""
    return PeerFigures(
        inflight={p: float(f[2]) for p, f in per_peer.items()},
        outcomes={
            p: {
                c.OUTCOME_SUCCESS: float(f[0] * step),
                c.OUTCOME_DEADLINE: float(f[1] * step),
                c.OUTCOME_FAILED: 0.0,
                c.OUTCOME_ABORTED: 0.0,
            }
            for p, f in per_peer.items()
        },
    )


def history(
    per_peer: dict[str, tuple[int, int, int]], scrapes: int = 6, every: float = 5.0, peers: bool = True
) -> tuple[PodScrape, ...]:
    return tuple(
        PodScrape(
            100.0 + i * every,
            PodSample(
                inflight=1, oldest_age=1, transfers=float(i), peers=figures(i, per_peer) if peers else None
            ),
        )
        for i in range(scrapes)
    )


STALLED_D0 = {D0.ip: (0, 3, 2), D1.ip: (4, 0, 1)}  # nothing with d0 succeeds, d1 is fine
HEALTHY = {D0.ip: (4, 0, 1), D1.ip: (4, 0, 1)}


def run(
    obs: dict[str, tuple[PodScrape, ...]],
    verdicts: dict[str, Verdict] | None = None,
    pods: list[PodView] | None = None,
):  # type: ignore[no-untyped-def]
    verdicts = verdicts if verdicts is not None else {p.uid: OK for p in PODS}
    return attribute(pods=pods or PODS, observations=obs, verdicts=verdicts, stuck_after=STUCK)


def test_two_prefills_stalled_on_one_decode_blame_that_decode_and_not_themselves() -> None:
    wedged = Verdict(VerdictState.WEDGED, "no progress for 25s")
    result = run(
        {P0.uid: history(STALLED_D0), P1.uid: history(STALLED_D0)},
        verdicts={P0.uid: wedged, P1.uid: OK, D0.uid: OK, D1.uid: OK},
    )
    assert [b.pod for b in result.blames] == [D0.name]
    blamed = result.verdicts[D0.uid]
    assert blamed.wedged and blamed.blame is not None
    assert blamed.blame.role == c.ROLE_DECODE and blamed.blame.ip == D0.ip
    assert {p.pod for p in blamed.blame.pointers} == {P0.name, P1.name}
    for name in (D0.name, P0.name, P1.name):
        assert name in blamed.reason
    assert blamed.figures["pointingPods"] == 2 and blamed.figures["peerFailedOrDeadline"] == 30
    assert (
        not result.verdicts[P0.uid].wedged
        and "waiting on decode pod m-decode-0" in result.verdicts[P0.uid].reason
    )
    assert not result.verdicts[P1.uid].wedged and not result.verdicts[D1.uid].wedged


def test_one_pointing_pod_is_not_enough() -> None:
    result = run({P0.uid: history(STALLED_D0), P1.uid: history(HEALTHY)})
    assert result.blames == () and not any(v.wedged for v in result.verdicts.values())


def test_a_pod_pointing_at_every_peer_is_suspect_itself() -> None:
    everyone = {D0.ip: (0, 3, 1), D1.ip: (0, 3, 1)}
    wedged = Verdict(VerdictState.WEDGED, "no progress")
    verdicts = {P0.uid: wedged, P1.uid: wedged, D0.uid: OK, D1.uid: OK}
    result = run({P0.uid: history(everyone), P1.uid: history(everyone)}, verdicts=verdicts)
    assert result.blames == ()
    assert result.verdicts == verdicts  # blamed as today


def test_decode_peers_blame_a_prefill_that_stalls_both() -> None:
    stalled = {P0.ip: (0, 2, 1), P1.ip: (3, 0, 0)}
    result = run({D0.uid: history(stalled), D1.uid: history(stalled)})
    assert [(b.pod, b.role) for b in result.blames] == [(P0.name, c.ROLE_PREFILL)]


def test_missing_per_peer_metrics_change_nothing() -> None:
    verdicts = {P0.uid: Verdict(VerdictState.WEDGED, "x"), P1.uid: OK, D0.uid: OK, D1.uid: OK}
    result = run(
        {P0.uid: history(STALLED_D0, peers=False), P1.uid: history(STALLED_D0, peers=False)},
        verdicts=verdicts,
    )
    assert result.blames == () and result.verdicts == verdicts


def test_too_short_a_span_is_not_evidence() -> None:
    result = run({P0.uid: history(STALLED_D0, scrapes=3), P1.uid: history(STALLED_D0, scrapes=3)})
    assert result.blames == ()


def test_a_counter_that_went_down_ends_the_evidence() -> None:
    reset = list(history(STALLED_D0))
    reset[-1] = PodScrape(reset[-1].at, PodSample(1, 1, 1, peers=figures(0, STALLED_D0)))
    result = run({P0.uid: tuple(reset), P1.uid: history(STALLED_D0)})
    assert result.blames == ()


@pytest.mark.parametrize(
    "pods",
    [
        [P0, P1, D1],  # the IP names no pod
        [P0, P1, D0, PodView("dup", "u-dup", c.ROLE_DECODE, True, False, ip=D0.ip), D1],  # two pods
        [P0, P1, PodView(D0.name, D0.uid, c.ROLE_DECODE, True, True, ip=D0.ip), D1],  # terminating
    ],
)
def test_an_ip_that_maps_to_no_single_live_pod_blames_nobody(pods: list[PodView]) -> None:
    result = run({P0.uid: history(STALLED_D0), P1.uid: history(STALLED_D0)}, pods=pods)
    assert result.blames == ()


def test_a_minority_of_reporters_does_not_blame() -> None:
    p2 = PodView("m-prefill-2", "u-p2", c.ROLE_PREFILL, True, False, ip="198.18.0.12")
    p3 = PodView("m-prefill-3", "u-p3", c.ROLE_PREFILL, True, False, ip="198.18.0.13")
    obs = {
        P0.uid: history(STALLED_D0),
        P1.uid: history(STALLED_D0),
        p2.uid: history(HEALTHY),
        p3.uid: history(HEALTHY),
    }
    result = run(obs, pods=[*PODS, p2, p3])
    assert result.blames == ()  # 2 of 4 is not a strict majority


peer_figs = st.builds(
    lambda inflight, outcomes: PeerFigures(inflight=inflight, outcomes=outcomes),
    st.dictionaries(
        st.sampled_from([P0.ip, P1.ip, D0.ip, D1.ip, "198.18.9.9", c.PEER_OTHER]), st.floats(0, 5), max_size=4
    ),
    st.dictionaries(
        st.sampled_from([P0.ip, P1.ip, D0.ip, D1.ip, "198.18.9.9"]),
        st.dictionaries(st.sampled_from(c.OUTCOMES), st.floats(0, 50), max_size=4),
        max_size=4,
    ),
)
observations = st.lists(st.one_of(st.none(), peer_figs), min_size=0, max_size=8).map(
    lambda figs: tuple(
        PodScrape(100.0 + 10 * i, PodSample(1, 1, float(i), peers=f)) for i, f in enumerate(figs)
    )
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from([p.uid for p in PODS]), observations))
def test_any_figures_only_blame_with_a_strict_majority_of_two_or_more(
    obs: dict[str, tuple[PodScrape, ...]],
) -> None:
    result = run(obs)
    uids = {p.uid for p in PODS}
    assert set(result.verdicts) == uids
    for b in result.blames:
        assert len(b.pointers) >= 2 and 2 * len(b.pointers) > b.reporters
        assert b.uid in uids and result.verdicts[b.uid].wedged
        assert all(p.role != b.role for p in b.pointers)
    newly_wedged = {u for u, v in result.verdicts.items() if v.wedged}
    assert newly_wedged <= {b.uid for b in result.blames}  # nothing else turns wedged


BASE = (
    '# TYPE pdwarden_inflight_requests gauge\npdwarden_inflight_requests{role="prefill"} 1\n'
    "# TYPE pdwarden_inflight_oldest_age_seconds gauge\n"
    'pdwarden_inflight_oldest_age_seconds{role="prefill"} 2\n'
    '# TYPE pdwarden_kv_transfers counter\npdwarden_kv_transfers_total{role="prefill",outcome="success"} 5\n'
)


def test_parse_reads_per_peer_figures() -> None:
    body = BASE + (
        "# TYPE pdwarden_kv_peer_inflight gauge\n"
        'pdwarden_kv_peer_inflight{role="prefill",peer="198.18.0.20"} 3\n'
        "# TYPE pdwarden_kv_peer_transfers counter\n"
        'pdwarden_kv_peer_transfers_total{role="prefill",peer="198.18.0.20",outcome="deadline"} 7\n'
    )
    sample = parse_metrics(body)
    assert sample.peers == PeerFigures(
        inflight={"198.18.0.20": 3.0}, outcomes={"198.18.0.20": {"deadline": 7.0}}
    )


@pytest.mark.parametrize(
    "junk",
    [
        'pdwarden_kv_peer_inflight{role="prefill",peer="198.18.0.20"} NaN\n',
        'pdwarden_kv_peer_inflight{role="prefill",peer="198.18.0.20"} -1\n',
        'pdwarden_kv_peer_inflight{role="prefill"} 1\n',
        'pdwarden_kv_peer_inflight{peer="a"} 1\npdwarden_kv_peer_inflight{peer="a"} 2\n',
        'pdwarden_kv_peer_transfers_total{peer="a"} 1\n',
        'pdwarden_kv_peer_transfers_total{peer="a",outcome="failed"} 1e300\n',
    ],
)
def test_garbage_per_peer_figures_leave_the_pod_observed_without_peer_evidence(junk: str) -> None:
    sample = parse_metrics(BASE + junk)
    assert sample.peers is None and sample.inflight == 1 and sample.transfers == 5


def scripted(
    steps: list[tuple[int, int, int]], peer: str = D0.ip, every: float = 5.0
) -> tuple[PodScrape, ...]:
    """Observations whose figures for `peer` move by (successes, bad, in flight) per interval;
    the other decode keeps succeeding."""
    good = bad = 0.0
    out = [PodScrape(100.0, PodSample(1, 1, 0, peers=figures(0, {peer: (0, 0, 0), D1.ip: (1, 0, 0)})))]
    for i, (g, b, inflight) in enumerate(steps, start=1):
        good, bad = good + g, bad + b
        peers = PeerFigures(
            inflight={peer: float(inflight), D1.ip: 0.0},
            outcomes={
                peer: {c.OUTCOME_SUCCESS: good, c.OUTCOME_DEADLINE: bad},
                D1.ip: {c.OUTCOME_SUCCESS: float(i)},
            },
        )
        out.append(PodScrape(100.0 + i * every, PodSample(1, 1, float(i), peers=peers)))
    return tuple(out)


def test_intervals_without_traffic_to_the_peer_are_neutral() -> None:
    sparse = scripted([(0, 1, 0), (0, 0, 0), (0, 1, 0), (0, 0, 0), (0, 1, 0)])
    result = run({P0.uid: sparse, P1.uid: sparse})
    assert [b.pod for b in result.blames] == [D0.name]
    assert result.blames[0].pointers[0].bad == 3


def test_a_success_with_the_peer_ends_the_case() -> None:
    healed = scripted([(0, 1, 0), (0, 1, 0), (0, 1, 0), (0, 1, 0), (1, 0, 0)])
    result = run({P0.uid: healed, P1.uid: healed})
    assert result.blames == ()


def test_stale_evidence_does_not_blame() -> None:
    stale = scripted([(0, 1, 0), (0, 1, 0), (0, 1, 0), (0, 0, 0), (0, 0, 0)])
    result = run({P0.uid: stale, P1.uid: stale})
    assert result.blames == ()


def test_a_single_stuck_room_in_flight_is_evidence_in_every_interval() -> None:
    held = scripted([(0, 0, 1)] * 5)
    assert [b.pod for b in run({P0.uid: held, P1.uid: held}).blames] == [D0.name]


def held_history(held: dict[str, float], good: dict[str, int], scrapes: int = 6, every: float = 5.0):  # type: ignore[no-untyped-def]
    """A decode's history: pages held per writer (its rooms with that writer concluded long
    ago: no traffic, no failures, only the hostage pages), successes per step per peer."""
    out = []
    for i in range(scrapes):
        peers = set(held) | set(good)
        fig = PeerFigures(
            inflight=dict.fromkeys(peers, 0.0),
            outcomes={p: {c.OUTCOME_SUCCESS: float(good.get(p, 0) * i)} for p in peers},
            held=dict(held),
            held_seconds=dict.fromkeys(held, 60.0 + i * every),
        )
        out.append(PodScrape(100.0 + i * every, PodSample(0, 0, float(i), peers=fig, pool_pages=64)))
    return tuple(out)


def test_a_prefill_that_keeps_two_decodes_pages_hostage_is_blamed() -> None:
    # both decodes hold pages for p0 (it neither drains nor is gone); p1 serves them fine
    hostage = {P0.ip: 48.0}
    result = run(
        {D0.uid: held_history(hostage, {P1.ip: 3}), D1.uid: held_history(hostage, {P1.ip: 3})},
    )
    assert [b.pod for b in result.blames] == [P0.name]
    blamed = result.verdicts[P0.uid]
    assert blamed.wedged and "pages held 48" in blamed.reason
    assert blamed.figures["peerPagesHeld"] == 96
    assert not result.verdicts[P1.uid].wedged


def test_one_decode_holding_pages_for_a_prefill_is_not_enough_to_blame_it() -> None:
    result = run({D0.uid: held_history({P0.ip: 48.0}, {P1.ip: 3}), D1.uid: held_history({}, {P0.ip: 3})})
    assert result.blames == ()


def test_a_decode_whose_pool_runs_low_on_held_pages_says_so_and_is_not_wedged() -> None:
    from pdwarden_operator.watchdog.rule import judge

    verdict = judge(held_history({P0.ip: 40.0}, {P1.ip: 3}), STUCK)
    assert verdict.state == VerdictState.OK
    assert "KV pool low: 40 of 64 pages held for writers that neither drained nor are gone" in verdict.reason
    assert P0.ip in verdict.reason and verdict.figures["pagesHeld"] == 40
    assert "KV pool low" not in judge(held_history({P0.ip: 8.0}, {P1.ip: 3}), STUCK).reason


def test_garbage_held_page_series_give_no_evidence_and_leave_the_pod_observed() -> None:
    text = (
        "# TYPE pdwarden_kv_pages_held gauge\n"
        'pdwarden_kv_pages_held{peer="198.18.0.10",role="decode"} 4\n'
        'pdwarden_kv_pages_held{peer="198.18.0.10",role="decode"} 5\n'
        "# TYPE pdwarden_kv_peer_inflight gauge\n"
        'pdwarden_kv_peer_inflight{peer="198.18.0.10",role="decode"} 0\n'
        "# TYPE pdwarden_inflight_requests gauge\npdwarden_inflight_requests 0\n"
        "# TYPE pdwarden_inflight_oldest_age_seconds gauge\npdwarden_inflight_oldest_age_seconds 0\n"
        '# TYPE pdwarden_kv_transfers counter\npdwarden_kv_transfers_total{outcome="success"} 3\n'
    )
    sample = parse_metrics(text)
    assert sample.peers is None  # a duplicate series: no per-peer evidence at all

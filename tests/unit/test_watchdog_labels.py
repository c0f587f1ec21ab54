"""Label values from known sets only: what a body may name (peers of the model's own pods, the
contract's outcomes, thread kinds and states), bounded in length and in series; anything else
makes the pod unobserved (a ParseError naming why), never evidence for an action."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import pdwarden_contract as c
from pdwarden_operator.watchdog import parse
from pdwarden_operator.watchdog.blame import attribute
from pdwarden_operator.watchdog.history import PodScrape
from pdwarden_operator.watchdog.parse import ParseError, PeerFigures, PodSample, parse_metrics
from pdwarden_operator.watchdog.targets import peer_addresses
from pdwarden_operator.watchdog.verdict import PodView, Verdict, VerdictState
from pdwarden_runtime.hardening.threads import THREAD_KINDS, ThreadWatch
from pdwarden_runtime.inflight import InflightTracker
from pdwarden_runtime.kvpoll import KVPoll
from pdwarden_runtime.metrics import RuntimeMetrics
from pdwarden_runtime.status import RoomStatusTable

pytestmark = pytest.mark.unit

DECODE_IP = "198.18.0.20"
OTHER_DECODE_IP = "198.18.0.21"
MODEL_PODS = frozenset({"198.18.0.10", DECODE_IP, OTHER_DECODE_IP})

BASE = (
    '# TYPE pdwarden_inflight_requests gauge\npdwarden_inflight_requests{role="prefill"} 1\n'
    "# TYPE pdwarden_inflight_oldest_age_seconds gauge\n"
    'pdwarden_inflight_oldest_age_seconds{role="prefill"} 2\n'
    "# TYPE pdwarden_kv_transfers counter\n"
    'pdwarden_kv_transfers_total{role="prefill",outcome="success"} 5\n'
)


def peer_inflight(peer: str) -> str:
    return (
        "# TYPE pdwarden_kv_peer_inflight gauge\n"
        f'pdwarden_kv_peer_inflight{{role="prefill",peer="{peer}"}} 1\n'
    )


def peer_outcome(peer: str, outcome: str) -> str:
    return (
        "# TYPE pdwarden_kv_peer_transfers counter\n"
        f'pdwarden_kv_peer_transfers_total{{role="prefill",peer="{peer}",outcome="{outcome}"}} 1\n'
    )


def threads(*kinds: str) -> str:
    return "".join(
        f"# TYPE {name} gauge\n" + "".join(f'{name}{{role="prefill",thread="{k}"}} 1\n' for k in kinds)
        for name in (c.METRIC_RUNTIME_THREADS, c.METRIC_RUNTIME_THREADS_EXPECTED)
    )


def in_state(state: str) -> str:
    return (
        "# TYPE pdwarden_kv_oldest_in_state_seconds gauge\n"
        f'pdwarden_kv_oldest_in_state_seconds{{role="prefill",state="{state}"}} 3\n'
    )


GOOD = {
    "a peer that is a pod of the model": peer_inflight(DECODE_IP) + peer_outcome(DECODE_IP, "deadline"),
    "the runtime's overflow peer": peer_inflight(c.PEER_OTHER) + peer_outcome(c.PEER_OTHER, "failed"),
    "every outcome": "# TYPE pdwarden_kv_peer_transfers counter\n"
    + "".join(peer_outcome(DECODE_IP, o).split("\n", 1)[1] for o in c.OUTCOMES),
    "every thread kind": threads(*c.RUNTIME_THREAD_KINDS),
    "a known state": in_state(c.KV_STATE_TRANSFERRING),
    "a long line of a metric the watchdog does not read": f'other_metric{{x="{"y" * 5000}"}} 1\n',
    "many series of other metrics": "".join(f'other_metric{{i="{i}"}} 1\n' for i in range(5000)),
    # documentation is never read: a HELP comment of any length is passed over
    "a long HELP comment": f"# HELP pdwarden_kv_rooms {'h' * 600}\n",
}

BAD = {
    "a peer that is no pod of the model": (
        peer_inflight("203.0.113.7"),
        "peer '203.0.113.7' is not a pod of this model",
    ),
    "a peer in the outcome family only": (
        peer_outcome("203.0.113.7", "success"),
        "is not a pod of this model",
    ),
    "a peer in the held pages": (
        '# TYPE pdwarden_kv_pages_held gauge\npdwarden_kv_pages_held{role="decode",peer="10.9.9.9"} 4\n',
        "is not a pod of this model",
    ),
    "an unknown outcome": (
        peer_outcome(DECODE_IP, "exploded"),
        "outcome 'exploded' is not one of the contract's",
    ),
    "an unknown outcome of the progress counter": (
        'pdwarden_kv_transfers_total{role="prefill",outcome="maybe"} 1\n',
        "outcome 'maybe' is not one of the contract's",
    ),
    "an unknown thread kind": (threads("miner"), "thread 'miner' is not one of the contract's"),
    "an unknown state": (in_state("limbo"), "state 'limbo' is not one of the contract's"),
    "a label value too long": (
        f'pdwarden_inflight_requests{{role="prefill",note="{"n" * 129}"}} 1\n',
        "has a value of 129 characters, at most 128",
    ),
    "a peer too long": (peer_inflight("1" * 200), "has a value of 200 characters"),
    "an escaped peer": (peer_inflight(DECODE_IP + '\\"'), "is not a pod of this model"),
    "a line too long": (
        f'pdwarden_kv_peer_inflight{{role="prefill",peer="{DECODE_IP}"}} 1{" " * 600}\n',
        "at most 512",
    ),
    "a TYPE line too long": (f"# TYPE pdwarden_kv_rooms gauge{' ' * 600}\n", "at most 512"),
    "too many series": (
        "".join(
            f'pdwarden_kv_peer_inflight{{role="prefill",peer="{DECODE_IP}",n="{i}"}} 1\n'
            for i in range(parse.MAX_SERIES + 1)
        ),
        f"more than {parse.MAX_SERIES} series",
    ),
}


@pytest.mark.parametrize("extra", list(GOOD.values()), ids=list(GOOD))
def test_known_label_values_parse(extra: str) -> None:
    sample = parse_metrics(BASE + extra, peers=MODEL_PODS)
    assert sample.inflight == 1 and sample.transfers == 5


@pytest.mark.parametrize(("extra", "reason"), list(BAD.values()), ids=list(BAD))
def test_unknown_label_values_make_the_pod_unobserved(extra: str, reason: str) -> None:
    with pytest.raises(ParseError) as caught:
        parse_metrics(BASE + extra, peers=MODEL_PODS)
    assert reason in str(caught.value)


def test_untyped_rooms_per_state_count_every_series_and_refuse_a_repeated_one() -> None:
    # no TYPE comment: each sample is a family of its own, as prometheus_client reads it
    rooms = "".join(
        f'pdwarden_kv_rooms{{role="prefill",state="{s}"}} {n}\n'
        for s, n in ((c.KV_STATE_BOOTSTRAPPING, 1), (c.KV_STATE_TRANSFERRING, 2))
    )
    for documented in ("", "# HELP pdwarden_kv_rooms Rooms per KV status.\n"):
        sample = parse_metrics(BASE + documented + rooms, peers=MODEL_PODS)
        assert (sample.bootstrapping, sample.transferring) == (1.0, 1.0)  # each at most inflight
        repeated = rooms + f'pdwarden_kv_rooms{{state="{c.KV_STATE_TRANSFERRING}",role="prefill"}} 2\n'
        with pytest.raises(ParseError, match="duplicate series"):
            parse_metrics(BASE + documented + repeated, peers=MODEL_PODS)


def test_peers_are_unchecked_only_when_no_pod_list_is_given() -> None:
    body = BASE + peer_inflight("203.0.113.7")
    assert parse_metrics(body).peers == PeerFigures(inflight={"203.0.113.7": 1.0}, outcomes={})
    with pytest.raises(ParseError):
        parse_metrics(body, peers=frozenset())


def test_the_runtime_exposes_only_contract_label_values_and_the_watchdog_reads_them() -> None:
    """The real exposition, with a peer of the model, a peer that overflowed and every watched
    thread kind, passes; a thread the runtime tracks under an unknown kind is not exported."""
    table = RoomStatusTable("sticky")
    tracker = InflightTracker(table)
    watch = ThreadWatch()
    alive = threading.Event()
    started = [threading.Thread(target=alive.wait, daemon=True) for _ in range(2)]
    for thread in started:
        thread.start()
    watch.watch(started[0], kind=c.THREAD_NIXL_BOOTSTRAP)
    watch.watch(started[1], kind="not_in_the_contract")
    metrics = RuntimeMetrics(
        c.ROLE_PREFILL, table, tracker, engine="synthetic", transfer_backend="nixl", threads=watch
    )
    try:
        for room, peer in ((1, DECODE_IP), (2, OTHER_DECODE_IP)):
            table.open(room, KVPoll.Bootstrapping)
            metrics.peers.bind(room, [peer])
        table.update(1, KVPoll.Success)
        text = metrics.exposition()[0].decode()
        assert "not_in_the_contract" not in text
        sample = parse_metrics(text, peers=MODEL_PODS)
        assert sample.peers is not None and set(sample.peers.inflight) == {DECODE_IP, OTHER_DECODE_IP}
        assert sample.peers.outcomes[DECODE_IP][c.OUTCOME_SUCCESS] == 1
        with pytest.raises(ParseError, match="is not a pod of this model"):
            parse_metrics(text, peers=MODEL_PODS - {OTHER_DECODE_IP})
    finally:
        alive.set()


def test_the_contract_names_every_thread_kind_the_runtime_watches() -> None:
    assert set(THREAD_KINDS.values()) == set(c.RUNTIME_THREAD_KINDS)


def test_peer_addresses_are_the_pods_ips_and_the_gone_ones() -> None:
    pods: list[dict[str, Any]] = [
        {"status": {"podIP": "198.18.0.10", "podIPs": [{"ip": "198.18.0.10"}, {"ip": "fd00::10"}]}},
        {"status": {"podIP": ""}},
        {"status": {}},
    ]
    assert peer_addresses(pods, ["198.18.0.99", ""]) == {"198.18.0.10", "fd00::10", "198.18.0.99"}


P0 = PodView("m-prefill-0", "u-p0", c.ROLE_PREFILL, True, False, ip="198.18.0.10")
P1 = PodView("m-prefill-1", "u-p1", c.ROLE_PREFILL, True, False, ip="198.18.0.11")
D0 = PodView("m-decode-0", "u-d0", c.ROLE_DECODE, True, False, ip=DECODE_IP)
OK = Verdict(VerdictState.OK, "progressing", cleared=True)


def stalled_on(*peers: str) -> tuple[PodScrape, ...]:
    """Six scrapes in which every room with `peers` hit its deadline, none succeeded."""
    return tuple(
        PodScrape(
            100.0 + 5 * i,
            PodSample(
                1,
                1,
                float(i),
                peers=PeerFigures(
                    inflight=dict.fromkeys(peers, 1.0),
                    outcomes={p: {c.OUTCOME_DEADLINE: float(i)} for p in peers},
                ),
            ),
        )
        for i in range(6)
    )


def blamed(pods: list[PodView], *peers: str) -> list[str]:
    observations = {P0.uid: stalled_on(*peers), P1.uid: stalled_on(*peers)}
    result = attribute(
        pods=pods, observations=observations, verdicts={p.uid: OK for p in pods}, stuck_after=20.0
    )
    return [b.pod for b in result.blames]


def test_blame_counts_only_peers_that_are_pods_of_the_model() -> None:
    # both prefills fail with d0 and with an address the model has no pod at: only d0 counts,
    # so they do not "point at every peer" (which would make themselves the suspects)
    assert blamed([P0, P1, D0], DECODE_IP, "203.0.113.7") == [D0.name]
    # a peer of the prefills' own role is no peer of theirs either
    assert blamed([P0, P1, D0], DECODE_IP, P1.ip) == [D0.name]
    # with both peers real pods of the model, pointing at every one of them is suspect
    d1 = PodView("m-decode-1", "u-d1", c.ROLE_DECODE, True, False, ip=OTHER_DECODE_IP)
    assert blamed([P0, P1, D0, d1], DECODE_IP, OTHER_DECODE_IP) == []


def test_the_limits_are_above_what_a_runtime_writes() -> None:
    # 33 peers (32 + other) x (inflight, 4 outcomes, 2 held), the thread gauges, the rest:
    # the limit holds that twice over
    assert 2 * (33 * 7 + 2 * len(c.RUNTIME_THREAD_KINDS) + 16) <= parse.MAX_SERIES
    assert parse.MAX_LABEL_VALUE_CHARS >= 45  # the longest IPv6 address

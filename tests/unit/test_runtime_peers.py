"""Per-peer transfer figures: binding rooms to peers, conclusions, the cap and forgetting,
and their exposition through the runtime's metrics."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

import pdwarden_contract as c
from pdwarden_runtime.kvpoll import KVPoll
from pdwarden_runtime.peers import PeerCounters, peer_of_address
from tests.support.runtime_metrics import FakeClock, runtime

pytestmark = pytest.mark.unit


def test_a_bound_room_is_inflight_for_its_peer_until_it_concludes() -> None:
    peers = PeerCounters()
    peers.bind(1, ["198.18.0.5"])
    peers.bind(2, ["198.18.0.5"])
    peers.bind(3, ["198.18.0.6"])
    assert peers.snapshot().inflight == {"198.18.0.5": 2, "198.18.0.6": 1}
    peers.concluded(1, c.OUTCOME_SUCCESS)
    peers.concluded(3, c.OUTCOME_DEADLINE)
    peers.concluded(99, c.OUTCOME_FAILED)  # never bound: not counted anywhere
    snap = peers.snapshot()
    assert snap.inflight == {"198.18.0.5": 1, "198.18.0.6": 0}
    assert snap.outcomes["198.18.0.5"][c.OUTCOME_SUCCESS] == 1
    assert snap.outcomes["198.18.0.6"][c.OUTCOME_DEADLINE] == 1
    assert sum(snap.outcomes["198.18.0.6"].values()) == 1


def test_binding_twice_or_to_nothing_counts_once_or_not_at_all() -> None:
    peers = PeerCounters()
    peers.bind(1, ["198.18.0.5", "198.18.0.5"])
    peers.bind(1, ["198.18.0.7"])
    peers.bind(2, ["", None])  # type: ignore[list-item]
    assert peers.snapshot().inflight == {"198.18.0.5": 1}


def test_peers_beyond_the_cap_share_the_other_bucket() -> None:
    peers = PeerCounters(max_peers=2)
    for room, ip in enumerate(["198.18.0.1", "198.18.0.2", "198.18.0.3", "198.18.0.4"]):
        peers.bind(room, [ip])
    assert peers.snapshot().inflight == {"198.18.0.1": 1, "198.18.0.2": 1, c.PEER_OTHER: 2}


def test_an_idle_peer_is_forgotten_after_a_while_and_a_busy_one_never() -> None:
    clock = FakeClock()
    peers = PeerCounters(forget_after=60.0, clock=clock)
    peers.bind(1, ["198.18.0.1"])
    peers.bind(2, ["198.18.0.2"])
    peers.concluded(1, c.OUTCOME_SUCCESS)
    clock.now += 61
    assert set(peers.snapshot().inflight) == {"198.18.0.2"}


@given(
    st.lists(
        st.tuples(
            st.integers(0, 30),
            st.sampled_from(["198.18.0.1", "198.18.0.2", "198.18.0.3"]),
            st.booleans(),
            st.sampled_from(c.OUTCOMES),
        ),
        max_size=80,
    )
)
def test_inflight_is_bound_minus_concluded_and_conclusions_add_up(
    ops: list[tuple[int, str, bool, str]],
) -> None:
    peers = PeerCounters(max_peers=2)
    live: dict[int, str] = {}
    concluded = 0
    for room, ip, bind, outcome in ops:
        if bind:
            peers.bind(room, [ip])
            live.setdefault(room, ip)
        elif room in live:
            peers.concluded(room, outcome)
            del live[room]
            concluded += 1
    snap = peers.snapshot()
    assert sum(snap.inflight.values()) == len(live)
    assert sum(sum(o.values()) for o in snap.outcomes.values()) == concluded
    assert len(snap.inflight) <= 3  # two peers and `other`


@pytest.mark.parametrize(
    ("address", "peer"),
    [("198.18.0.5:8998", "198.18.0.5"), ("[fd00::1]:8998", "fd00::1"), ("pod-a", "pod-a")],
)
def test_peer_of_address_is_the_host(address: str, peer: str) -> None:
    assert peer_of_address(address) == peer


def test_the_runtime_exports_per_peer_series_bound_to_rooms_of_the_table() -> None:
    _clock, table, _tracker, metrics = runtime(c.ROLE_PREFILL)
    table.open(7, KVPoll.Bootstrapping)
    metrics.peers.bind(7, ["198.18.0.9"])
    table.open(8, KVPoll.Bootstrapping)
    metrics.peers.bind(8, ["198.18.0.9"])
    table.update(7, KVPoll.Failed, outcome=c.OUTCOME_DEADLINE)
    body, _ = metrics.exposition()
    got = {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(body.decode())
        for s in f.samples
    }
    peer = {"role": c.ROLE_PREFILL, "peer": "198.18.0.9"}
    assert got[(c.METRIC_KV_PEER_INFLIGHT, frozenset(peer.items()))] == 1
    deadline = {**peer, "outcome": c.OUTCOME_DEADLINE}
    assert got[(c.METRIC_KV_PEER_TRANSFERS_TOTAL, frozenset(deadline.items()))] == 1
    success = {**peer, "outcome": c.OUTCOME_SUCCESS}
    assert got[(c.METRIC_KV_PEER_TRANSFERS_TOTAL, frozenset(success.items()))] == 0

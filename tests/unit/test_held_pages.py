"""Decode pages held for their writer, and what the metrics say of them."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

import pdwarden_contract as c
from pdwarden_runtime.hardening.held_pages import HeldPages
from pdwarden_runtime.hardening.writer_watch import (
    CLOCK_SKEW_S,
    FREED_DRAINED,
    GONE_NEW_INCARNATION,
    GONE_POD_DELETED,
    GonePod,
    WriterIdentity,
    WriterWatch,
    read_gone_pods,
)
from pdwarden_runtime.inflight import InflightTracker
from pdwarden_runtime.metrics import RuntimeMetrics
from pdwarden_runtime.status import RoomStatusTable
from tests.support.runtime_metrics import FakeClock

pytestmark = pytest.mark.unit


def test_a_room_is_held_only_once_its_request_ended_after_publication() -> None:
    clock = FakeClock()
    held = HeldPages(clock)
    held.hold(1)  # never published: nothing can write it
    assert held.rooms() == 0
    held.published(1, "198.18.0.5", "198.18.0.5:8998", 8)
    held.published(2, "198.18.0.5", "198.18.0.5:8998", 3)
    held.published(3, "198.18.0.6", "198.18.0.6:8998", 4)
    assert held.rooms() == 0  # published, request alive: in use, not held
    held.hold(1)
    clock.now += 5
    held.hold(3)
    clock.now += 5
    assert held.rooms() == 2 and held.is_held(1) and not held.is_held(2)
    assert held.pages_by_peer() == {"198.18.0.5": 8, "198.18.0.6": 4}
    assert held.pages_by_peer(older_than=7) == {"198.18.0.5": 8}
    held.release(1)
    held.release(2)  # concluded normally
    assert held.rooms() == 1 and held.pages_by_peer() == {"198.18.0.6": 4}


def test_a_second_hold_keeps_the_first_time() -> None:
    clock = FakeClock()
    held = HeldPages(clock)
    held.published(7, "198.18.0.5", "198.18.0.5:8998", 2)
    held.hold(7)
    clock.now += 30
    held.hold(7)
    assert [h.seconds for h in held.held()] == [30]


def _samples(metrics: RuntimeMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = metrics.exposition()[0].decode()
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def test_decode_metrics_export_abandoned_rooms_and_pages_held_per_writer() -> None:
    clock = FakeClock()
    held = HeldPages(clock)
    table = RoomStatusTable("sticky")
    tracker = InflightTracker(table, clock=clock)
    metrics = RuntimeMetrics(
        c.ROLE_DECODE,
        table,
        tracker,
        engine="synthetic",
        transfer_backend="nixl",
        abandoned=held.rooms,
        held_pages=held,
    )
    assert _samples(metrics, c.METRIC_KV_ROOMS_ABANDONED) == {(("role", "decode"),): 0}
    assert _samples(metrics, c.METRIC_KV_PAGES_HELD) == {}
    for room, peer in ((1, "198.18.0.5"), (2, "198.18.0.5"), (3, "198.18.0.9")):
        held.published(room, peer, f"{peer}:8998", 4)
        held.hold(room)
        clock.now += 10
    assert _samples(metrics, c.METRIC_KV_ROOMS_ABANDONED) == {(("role", "decode"),): 3}
    assert _samples(metrics, c.METRIC_KV_PAGES_HELD) == {
        (("peer", "198.18.0.5"), ("role", "decode")): 8,
        (("peer", "198.18.0.9"), ("role", "decode")): 4,
    }
    assert _samples(metrics, c.METRIC_KV_PAGES_HELD_SECONDS) == {
        (("peer", "198.18.0.5"), ("role", "decode")): 30,
        (("peer", "198.18.0.9"), ("role", "decode")): 10,
    }


def test_held_page_series_are_bounded_per_writer() -> None:
    held = HeldPages(FakeClock())
    table = RoomStatusTable("sticky")
    metrics = RuntimeMetrics(
        c.ROLE_DECODE,
        table,
        InflightTracker(table),
        engine="synthetic",
        transfer_backend="nixl",
        held_pages=held,
    )
    for i in range(100):
        held.published(i, f"198.18.1.{i}", f"198.18.1.{i}:8998", 1)
        held.hold(i)
    series = _samples(metrics, c.METRIC_KV_PAGES_HELD)
    assert len(series) == 33  # 32 writers and "other"
    assert series[(("peer", c.PEER_OTHER), ("role", "decode"))] == 68


ADDR = "198.18.0.5:8998"
OLD, NEW = WriterIdentity("aaa", "uid-old"), WriterIdentity("bbb", "uid-new")


WALL = 1_800_000_000.0


def _held_room(clock: FakeClock, to: WriterIdentity | None = OLD) -> HeldPages:
    """Room 1, its metadata sent at WALL to the pod that answered at ADDR (``to``), then held."""
    held = HeldPages(clock, wall=lambda: WALL)
    held.published(1, "198.18.0.5", ADDR, 8, to)
    clock.now += 1
    held.hold(1)
    return held


def test_no_answer_a_timeout_or_the_same_writer_is_never_a_proof() -> None:
    clock = FakeClock()
    held = _held_room(clock)
    clock.now += 3600  # an hour of holding proves nothing
    assert held.proof(1) is None
    held.observe(ADDR, OLD, asked_at=clock.now)  # identified
    held.observe(ADDR, OLD, asked_at=clock.now + 2)  # the same process, still there
    assert held.proof(1) is None


def test_a_new_incarnation_at_the_writers_address_proves_the_old_one_gone() -> None:
    clock = FakeClock()
    held = _held_room(clock)
    held.observe(ADDR, OLD, asked_at=clock.now)
    held.observe("198.18.0.9:8998", NEW, asked_at=clock.now)  # another address: nothing
    assert held.proof(1) is None
    held.observe(ADDR, NEW, asked_at=clock.now + 2)
    assert held.proof(1) == GONE_NEW_INCARNATION
    held.release(1)
    assert [(f.room, f.how) for f in held.freed()] == [(1, GONE_NEW_INCARNATION)]


def test_an_answer_asked_before_the_hold_never_identifies_the_writer() -> None:
    # asked before the room was held (so maybe before its metadata reached a new process):
    # taking it as the writer could make the real, newer writer look like a new incarnation
    clock = FakeClock()
    held = HeldPages(clock)
    held.published(1, "198.18.0.5", ADDR, 8)
    asked = clock.now
    clock.now += 1
    held.hold(1)
    held.observe(ADDR, OLD, asked_at=asked)
    held.observe(ADDR, NEW, asked_at=clock.now)  # this one is the writer
    assert held.proof(1) is None
    held.observe(ADDR, NEW, asked_at=clock.now + 2)
    assert held.proof(1) is None


def test_the_operator_listing_the_writers_pod_deleted_after_publication_is_a_proof() -> None:
    clock = FakeClock()
    held = _held_room(clock)
    held.observe_gone_pods([GonePod("uid-other", WALL + 60)])
    assert held.proof(1) is None
    # last seen alive before the metadata went out (or within the clock margin): the address
    # may have had another owner by then, who is the writer
    held.observe_gone_pods([GonePod("uid-old", WALL - 30), GonePod("uid-old", WALL + CLOCK_SKEW_S)])
    assert held.proof(1) is None
    held.observe_gone_pods([GonePod("uid-old", WALL + CLOCK_SKEW_S + 10)])
    assert held.proof(1) == GONE_POD_DELETED


def test_a_room_published_before_any_answer_has_no_pod_deleted_proof() -> None:
    held = _held_room(FakeClock(), to=None)
    held.observe_gone_pods([GonePod("uid-old", WALL + 600)])
    assert held.proof(1) is None


def test_a_drained_room_is_recorded_as_drained() -> None:
    clock = FakeClock()
    held = _held_room(clock)
    clock.now += 4
    held.release(1)
    assert [(f.how, f.held_seconds) for f in held.freed()] == [(FREED_DRAINED, 4)]


def test_the_watch_asks_the_prefills_and_reads_the_pod_list_only_while_pages_are_held(tmp_path) -> None:
    clock = FakeClock()
    held = HeldPages(clock, wall=lambda: WALL)
    asked: list[str] = []
    answers = {ADDR: OLD, "198.18.0.6:8998": NEW}

    def fetch(addr: str) -> WriterIdentity | None:
        asked.append(addr)
        return answers.get(addr)

    gone = tmp_path / "gone-pods.json"
    gone.write_text(json.dumps({"gone": [{"uid": "uid-old", "lastSeen": WALL + 60}]}))
    watch = WriterWatch(
        held, prefills=lambda: [ADDR, "198.18.0.6:8998"], fetch=fetch, gone_pods_file=str(gone)
    )
    watch.probe_once()
    assert sorted(asked) == sorted([ADDR, "198.18.0.6:8998"]) and watch.identity(ADDR) == OLD  # side by side
    # rooms go to the identity learned before their metadata went out
    held.published(1, "198.18.0.5", ADDR, 8, watch.identity(ADDR))
    held.hold(1)
    watch.probe_once()
    assert held.proof(1) == GONE_POD_DELETED


def test_a_prefill_found_to_be_a_new_process_is_reported_once() -> None:
    """What the decode knew of the old process (its ranks' addresses) is stale: the manager
    forgets it when told, as SGLang does for a prefill lost to missed heartbeats."""
    answers = [OLD, OLD, NEW, NEW]
    restarted: list[str] = []
    watch = WriterWatch(
        HeldPages(FakeClock(), wall=lambda: WALL),
        prefills=lambda: [ADDR],
        fetch=lambda _addr: answers.pop(0),
        restarted=restarted.append,
    )
    try:
        for _ in range(4):
            watch.probe_once()
    finally:
        watch.stop()
    assert restarted == [ADDR] and watch.identity(ADDR) == NEW


@pytest.mark.parametrize("text", ["", "not json", "[]", '{"gone": 3}', '{"gone": [3, {"uid": 4}]}'])
def test_a_missing_or_garbled_pod_list_proves_nothing(tmp_path, text: str) -> None:
    path = tmp_path / "gone-pods.json"
    path.write_text(text)
    assert read_gone_pods(str(path)) == []
    assert read_gone_pods(str(tmp_path / "absent.json")) == []


def test_the_runtime_reads_the_list_the_operator_writes(tmp_path) -> None:
    from pdwarden_operator.watchdog.gone_pods import GonePod as OperatorGonePod
    from pdwarden_operator.watchdog.gone_pods import to_json

    path = tmp_path / "gone-pods.json"
    written = [OperatorGonePod("uid-1", "m-prefill-x", "198.18.0.5", WALL + 70, WALL + 60)]
    path.write_text(to_json(written))
    assert read_gone_pods(str(path)) == [GonePod("uid-1", WALL + 60)]


def test_a_room_cleared_before_its_hold_is_still_held_when_the_hold_follows() -> None:
    # SGLang clears a failed receiver, then arms the drain wait (ensure_abort_notified)
    clock = FakeClock()
    held = HeldPages(clock)
    held.published(5, "198.18.0.5", ADDR, 6)
    held.concluded(5)
    assert held.rooms() == 0
    held.hold(5)
    assert held.is_held(5) and held.pages_by_peer() == {"198.18.0.5": 6}
    held.concluded(5)  # a second clear does not free a held room
    assert held.is_held(5)
    held.release(5)
    assert held.rooms() == 0 and [f.room for f in held.freed()] == [5]


def test_a_room_cleared_and_never_held_is_free() -> None:
    held = HeldPages(FakeClock())
    held.published(6, "198.18.0.5", ADDR, 6)
    held.concluded(6)
    held.release(6)
    assert held.rooms() == 0 and held.freed() == []

"""Decode pages held for their writer, and what the metrics say of them."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdwarden_runtime import contract as c
from pdwarden_runtime.hardening.held_pages import HeldPages
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
    held.published(1, "198.18.0.5", 8)
    held.published(2, "198.18.0.5", 3)
    held.published(3, "198.18.0.6", 4)
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
    held.published(7, "198.18.0.5", 2)
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
        held.published(room, peer, 4)
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
        held.published(i, f"198.18.1.{i}", 1)
        held.hold(i)
    series = _samples(metrics, c.METRIC_KV_PAGES_HELD)
    assert len(series) == 33  # 32 writers and "other"
    assert series[(("peer", c.PEER_OTHER), ("role", "decode"))] == 68

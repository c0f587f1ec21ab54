"""Property tests: random operation sequences and random thread interleavings.

Sticky mode must never change a terminal status before clear() (except the named
Success -> Failed row), never create a room from a non-opening write, and count exactly
the writes it refused. Legacy mode must equal the old SGLang rule on any sequence.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdwarden_runtime.kvpoll import OPENING, TERMINAL, KVPoll
from pdwarden_runtime.status import RoomStatusTable

pytestmark = pytest.mark.unit

F, S = KVPoll.Failed, KVPoll.Success
ROOMS = st.integers(min_value=0, max_value=3)
Op = tuple[str, int, KVPoll]

ops = st.one_of(
    st.tuples(st.just("open"), ROOMS, st.sampled_from(sorted(OPENING))),
    st.tuples(st.just("update"), ROOMS, st.sampled_from(list(KVPoll))),
    st.tuples(st.just("abort"), ROOMS, st.just(F)),  # ABORT-style Failed write
    st.tuples(st.just("clear"), ROOMS, st.just(F)),
)


def apply(table: RoomStatusTable, op: Op) -> bool | None:
    kind, room, status = op
    if kind == "open":
        return table.open(room, status)
    if kind == "update":
        return table.update(room, status)
    if kind == "abort":
        return table.update(room, F, outcome="aborted")
    table.clear(room)
    return None


class AuditedRooms(dict):  # type: ignore[type-arg]
    """Stands in for the table's room dict and checks every real mutation, in the order
    the table made them (all under its lock), for the sticky invariants."""

    def __init__(self) -> None:
        super().__init__()
        self.violations: list[str] = []
        self.overrides = 0

    def __setitem__(self, room: int, new: KVPoll) -> None:
        old = self.get(room)
        if old is None and new not in OPENING:
            self.violations.append(f"room {room} created by a non-opening write {new.name}")
        if old in TERMINAL and new != old:
            if (old, new) == (S, F):
                self.overrides += 1
            else:
                self.violations.append(f"room {room} left terminal {old.name} for {new.name}")
        super().__setitem__(room, new)


def audited_sticky_table() -> tuple[RoomStatusTable, AuditedRooms]:
    table = RoomStatusTable("sticky")
    rooms = AuditedRooms()
    table._rooms = rooms  # the audit sees exactly what the table stores
    return table, rooms


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, max_size=60))
def test_sticky_sequence_invariants(sequence: list[Op]) -> None:
    table, audit = audited_sticky_table()
    refusals = 0
    for op in sequence:
        kind, room, status = op
        before = table.get(room)
        result = apply(table, op)
        after = table.get(room)
        if result is False:
            refusals += 1
        if kind in ("update", "abort"):
            if before is None:
                assert result is False and after is None  # never created by a write
            elif before in TERMINAL and not (before == S and status == F):
                assert after == before  # sticky
        if kind == "open" and before is None:
            assert after == status and result is True
        if kind == "clear":
            assert after is None
    assert audit.violations == []
    assert sum(table.refused().values()) == refusals
    assert table.overrides() == audit.overrides


def old_sglang_update_status(request_status: dict[int, int], room: int, status: int) -> bool:
    if room not in request_status:
        request_status[room] = status
    elif status == 0:
        request_status[room] = 0
    else:
        request_status[room] = max(request_status[room], status)
    return request_status[room] == status


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, max_size=60))
def test_legacy_equals_old_sglang_on_any_sequence(sequence: list[Op]) -> None:
    table = RoomStatusTable("legacy")
    reference: dict[int, int] = {}
    for kind, room, status in sequence:
        if kind == "clear":
            table.clear(room)
            reference.pop(room, None)
            continue
        result = apply(table, (kind, room, status))
        expected = old_sglang_update_status(reference, room, status)
        assert result is expected
    assert {room: int(s) for room, s in table.snapshot().items()} == reference
    assert table.refused() == {}


@pytest.fixture
def tiny_switch_interval() -> Iterator[None]:
    """Make the interpreter switch threads as often as it can, so the interleavings vary."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(previous)


def run_threads(table: RoomStatusTable, programs: list[list[Op]]) -> list[Any]:
    barrier = threading.Barrier(len(programs))
    results: list[Any] = [None] * len(programs)
    errors: list[BaseException] = []

    def worker(index: int, program: list[Op]) -> None:
        try:
            barrier.wait(timeout=10)
            results[index] = [apply(table, op) for op in program]
        except BaseException as exc:  # reported below, never swallowed
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i, p)) for i, p in enumerate(programs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    assert errors == []
    return results


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(ops, min_size=1, max_size=200), min_size=2, max_size=6))
def test_sticky_invariants_hold_under_thread_interleavings(
    tiny_switch_interval: None, programs: list[list[Op]]
) -> None:
    table, audit = audited_sticky_table()
    results = run_threads(table, programs)
    refusals = sum(1 for per_thread in results for r in per_thread if r is False)
    assert audit.violations == []
    assert sum(table.refused().values()) == refusals
    assert table.overrides() == audit.overrides
    for status in table.snapshot().values():
        assert isinstance(status, KVPoll)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(min_value=2, max_value=8), st.integers(min_value=0, max_value=2**32))
def test_abort_storm_against_chunk_writers_never_resurrects(
    tiny_switch_interval: None, writers: int, room_base: int
) -> None:
    """The race itself, many times over: writers keep writing Transferring (every chunk)
    while an aborter fails each room; every aborted room must end Failed."""
    table, audit = audited_sticky_table()
    rooms = [room_base + i for i in range(32)]
    for room in rooms:
        table.open(room, KVPoll.Bootstrapping)
        table.update(room, KVPoll.Transferring)
    chunk_writes: list[Op] = [("update", room, KVPoll.Transferring) for room in rooms] * 4
    aborts: list[Op] = [("abort", room, F) for room in rooms]
    run_threads(table, [chunk_writes] * writers + [aborts])
    assert audit.violations == []
    assert all(table.get(room) == F for room in rooms)
    late = table.refused().get((F, KVPoll.Transferring), 0)
    assert 0 <= late <= len(chunk_writes) * writers

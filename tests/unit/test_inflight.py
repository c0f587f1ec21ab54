"""The inflight tracker: count, oldest age, outcomes, and the deadline that fails stuck rooms."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdwarden_runtime.inflight import InflightTracker
from pdwarden_runtime.kvpoll import TERMINAL, KVPoll
from pdwarden_runtime.status import RoomStatusTable

pytestmark = pytest.mark.unit

F, B, W, T, S = (
    KVPoll.Failed,
    KVPoll.Bootstrapping,
    KVPoll.WaitingForInput,
    KVPoll.Transferring,
    KVPoll.Success,
)


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make(
    mode: str = "sticky", deadline: float | None = None
) -> tuple[FakeClock, RoomStatusTable, InflightTracker]:
    clock = FakeClock()
    table = RoomStatusTable(mode)  # type: ignore[arg-type]
    tracker = InflightTracker(table, deadline=deadline, clock=clock)
    return clock, table, tracker


def test_count_and_oldest_age_follow_the_lifecycle() -> None:
    clock, table, tracker = make()
    assert tracker.count() == 0 and tracker.oldest_age() == 0.0
    table.open(1, B)
    clock.now += 5
    table.open(2, B)
    clock.now += 2
    assert tracker.count() == 2
    assert tracker.oldest_age() == pytest.approx(7.0)
    table.update(1, T)  # a write that does not conclude changes nothing
    assert tracker.count() == 2
    table.update(1, S)
    assert tracker.count() == 1
    assert tracker.oldest_age() == pytest.approx(2.0)  # room 2 is now the oldest
    table.update(2, F, outcome="aborted")
    assert tracker.count() == 0 and tracker.oldest_age() == 0.0
    assert tracker.outcomes() == {"success": 1, "failed": 0, "aborted": 1, "deadline": 0}


def test_clear_of_a_live_room_counts_aborted_and_of_a_concluded_room_nothing() -> None:
    _, table, tracker = make()
    table.open(1, B)
    table.open(2, B)
    table.update(2, S)
    table.clear(1)  # abandoned before concluding
    table.clear(2)  # normal: cleared after Success
    assert tracker.count() == 0
    assert tracker.outcomes() == {"success": 1, "failed": 0, "aborted": 1, "deadline": 0}


def test_a_refused_write_and_the_override_do_not_conclude_twice() -> None:
    _, table, tracker = make()
    table.open(1, B)
    table.update(1, S)
    table.update(1, T)  # refused
    table.update(1, F)  # FAILURE_OVERRIDES_SUCCESS: applied, but the room concluded already
    assert tracker.outcomes()["success"] == 1
    assert sum(tracker.outcomes().values()) == 1


def test_legacy_resurrection_shows_up_as_inflight_again() -> None:
    clock, table, tracker = make("legacy")
    table.open(1, B)
    table.update(1, T)
    table.update(1, F, outcome="aborted")
    assert tracker.count() == 0
    table.update(1, T)  # the emulated port's race: max(0, 3)
    clock.now += 60
    assert tracker.count() == 1  # the wedge, made visible
    assert tracker.oldest_age() == pytest.approx(60.0)


def test_deadline_fails_exactly_the_rooms_older_than_it() -> None:
    failed_batches: list[list[int]] = []
    clock, table, tracker = make(deadline=10.0)
    tracker.on_deadline = failed_batches.append
    table.open(1, B)
    table.update(1, T)
    clock.now += 4
    table.open(2, B)
    table.update(2, W)
    table.open(3, B)
    table.update(3, S)  # terminal: never touched
    clock.now += 6.5  # room 1 is 10.5 s old, room 2 is 6.5 s old
    assert tracker.maybe_expire() == [1]
    assert table.get(1) == F and table.get(2) == W and table.get(3) == S
    assert failed_batches == [[1]]
    assert tracker.outcomes()["deadline"] == 1
    clock.now += 3.5  # room 2 is exactly 10 s old: not older than the deadline
    assert tracker.expire() == []
    clock.now += 0.01
    assert tracker.expire() == [2]
    assert tracker.outcomes() == {"success": 1, "failed": 0, "aborted": 0, "deadline": 2}


def test_deadline_counts_from_leaving_bootstrapping_not_from_open() -> None:
    clock, table, tracker = make(deadline=10.0)
    table.open(1, B)
    clock.now += 60  # queueing for bootstrap: busy, not stuck
    assert tracker.expire() == [] and table.get(1) == B
    table.update(1, W)
    clock.now += 9
    assert tracker.expire() == []
    table.update(1, T)  # moving on keeps the clock that started at WaitingForInput
    clock.now += 1.5
    assert tracker.expire() == [1]


def test_oldest_in_state_ages_from_entering_each_state() -> None:
    table = RoomStatusTable("sticky")
    table.open(1, B)
    table.open(2, B)
    table.update(2, T)
    ages = table.oldest_in_state()
    assert set(ages) == {B, T} and all(age >= 0 for age in ages.values())
    table.update(2, S)
    assert set(table.oldest_in_state()) == {B}


def test_deadline_is_off_by_default_and_validated() -> None:
    clock, table, tracker = make()
    table.open(1, W)
    clock.now += 1e6
    assert tracker.expire() == [] and tracker.maybe_expire() == []
    assert table.get(1) == W
    with pytest.raises(ValueError, match="deadline must be > 0"):
        tracker.deadline = 0
    tracker.deadline = 5
    assert tracker.expire() == [1]


def test_maybe_expire_does_nothing_while_the_oldest_is_young() -> None:
    clock, table, tracker = make(deadline=10.0)
    for room in range(100):
        table.open(room, W)
    clock.now += 9
    assert tracker.maybe_expire() == []
    assert tracker.count() == 100


def test_reaper_enforces_the_deadline_without_any_write() -> None:
    clock, table, tracker = make(deadline=1.0)
    table.open(1, B)
    table.update(1, T)
    clock.now += 2
    done = threading.Event()
    tracker.on_deadline = lambda rooms: done.set()
    reaper = tracker.start_reaper(0.01)
    try:
        assert done.wait(timeout=10), "the reaper never failed the stuck room"
    finally:
        reaper.stop()
    assert table.get(1) == F
    with pytest.raises(ValueError, match="interval must be > 0"):
        tracker.start_reaper(0)


def test_a_table_takes_one_observer() -> None:
    table = RoomStatusTable("sticky")
    InflightTracker(table)
    with pytest.raises(ValueError, match="already has a lifecycle observer"):
        InflightTracker(table)


def test_conclude_listener_gets_outcome_and_duration() -> None:
    clock, table, tracker = make()
    seen: list[tuple[int, str, float]] = []
    tracker.add_conclude_listener(lambda room, outcome, seconds: seen.append((room, outcome, seconds)))
    table.open(1, B)
    clock.now += 2.5
    table.update(1, S)
    assert seen == [(1, "success", pytest.approx(2.5))]


steps = st.lists(
    st.tuples(
        st.sampled_from(["open", "advance", "succeed", "fail", "clear", "tick"]),
        st.integers(min_value=0, max_value=7),
        st.floats(min_value=0.0, max_value=5.0, allow_nan=False),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(steps, st.floats(min_value=0.5, max_value=20.0, allow_nan=False))
def test_deadline_property(plan: list[tuple[str, int, float]], deadline: float) -> None:
    clock, table, tracker = make(deadline=deadline)
    started: dict[int, float] = {}  # independent model of when each live room left Bootstrapping
    opened: set[int] = set()
    for action, room, dt in plan:
        if action == "tick":
            clock.now += dt
        elif action == "open" and table.get(room) is None:
            table.open(room, B)
            opened.add(room)
        elif action == "advance":
            if table.get(room) is B:
                started[room] = clock.now
            table.update(room, T)
        elif action in ("succeed", "fail"):
            table.update(room, S if action == "succeed" else F)
        elif action == "clear":
            table.clear(room)
        status = table.get(room)
        if status is None or status in TERMINAL:
            started.pop(room, None)
            opened.discard(room)
    before = table.snapshot()
    expected = sorted(r for r, t0 in started.items() if clock.now - t0 > deadline)
    failed = tracker.expire()
    assert sorted(failed) == expected  # exactly the rooms older than the deadline
    after = table.snapshot()
    for room, status in before.items():
        if status in TERMINAL:
            assert after[room] == status  # never a terminal one
        elif room in expected:
            assert after[room] == F
        else:
            assert after[room] == status
    assert tracker.count() == len(opened) - len(expected)

"""The hardened NIXL manager's collaborators, alone: the handle wait with its transfer
deadline (a fake clock and a fake NIXL state reader), the stalled-peer marks, room owners,
early ABORTs and the port-race fault's hand-off."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from pdwarden_runtime.hardening.early_aborts import EarlyAborts
from pdwarden_runtime.hardening.faults.port_race import PortRace
from pdwarden_runtime.hardening.handle_wait import (
    REASON_SIBLING_RUNNING,
    HandleWait,
    WaitLimits,
    await_handles,
)
from pdwarden_runtime.hardening.room_owners import RoomOwners
from pdwarden_runtime.hardening.stalled_peers import StalledPeers

pytestmark = pytest.mark.unit

DEADLINE = 10.0
LIMITS = WaitLimits(transfer_deadline=DEADLINE, settle_timeout=2.0, settle_poll=0.5)


class FakeTime:
    """A clock that moves only when the wait sleeps (a zero sleep still moves it a little,
    so a spin can end)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps = 0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += max(seconds, 0.001)


def _wait(
    states: Iterator[dict[str, str]], limits: WaitLimits = LIMITS, **kw: bool
) -> tuple[HandleWait, FakeTime]:
    fake = FakeTime()
    current: dict[str, str] = {}

    def read(handle: str) -> str:
        return current[handle]

    def sleep(seconds: float) -> None:
        current.update(next(states, current))
        fake.sleep(seconds)

    current.update(next(states))
    waited = await_handles(["a", "b"], read, limits, clock=fake.clock, sleep=sleep, **kw)
    return waited, fake


def test_a_batch_that_ends_is_settled_and_failed_only_if_a_handle_erred() -> None:
    done, _ = _wait(iter([{"a": "PROC", "b": "PROC"}, {"a": "DONE", "b": "DONE"}]), failure_seen=False)
    assert done == HandleWait(settled=True, failed=False)
    erred, _ = _wait(iter([{"a": "DONE", "b": "ERR"}]), failure_seen=False)
    assert erred == HandleWait(settled=True, failed=True)


def test_a_handle_in_progress_past_the_deadline_is_quarantined_never_settled() -> None:
    waited, fake = _wait(iter([{"a": "DONE", "b": "PROC"}]), failure_seen=False)
    assert not waited.settled and waited.failed and waited.past_deadline
    assert waited.quarantine is not None and "transfer deadline" in waited.quarantine
    assert fake.now >= 100.0 + DEADLINE


def test_without_a_deadline_only_a_failed_sibling_bounds_the_wait() -> None:
    no_deadline = WaitLimits(transfer_deadline=None, settle_timeout=2.0, settle_poll=0.5)
    waited, fake = _wait(iter([{"a": "ERR", "b": "PROC"}]), no_deadline, failure_seen=False)
    assert waited == HandleWait(settled=False, failed=True, quarantine=REASON_SIBLING_RUNNING)
    assert fake.now - 100.0 < DEADLINE  # the settle bound, not a deadline


def test_the_stall_fault_never_settles_even_finished_handles() -> None:
    waited, _ = _wait(iter([{"a": "DONE", "b": "DONE"}]), failure_seen=False, never_settle=True)
    assert not waited.settled and waited.past_deadline


def test_an_unreadable_state_quarantines_the_batch_at_once() -> None:
    def read(handle: str) -> str:
        raise RuntimeError("agent gone")

    waited = await_handles(["a"], read, LIMITS, failure_seen=False)
    assert not waited.settled and waited.failed and not waited.past_deadline
    assert waited.quarantine is not None and "agent gone" in waited.quarantine


def test_no_handles_is_settled_with_the_failure_already_seen() -> None:
    assert await_handles([], str, LIMITS, failure_seen=True) == HandleWait(settled=True, failed=True)


def test_a_peer_stays_stalled_until_every_batch_naming_it_settled() -> None:
    peers = StalledPeers()
    peers.quarantined(1, ["d0", "d1"])
    peers.quarantined(1, ["d1"])
    peers.quarantined(2, ["d1"])
    assert peers.stalled_among(["d0", "d1", "d2"]) == ["d0", "d1"]
    peers.settled(1)  # room 1's first batch: d0 and one of d1's marks
    assert peers.stalled_among(["d0", "d1"]) == ["d1"]
    peers.settled(1)
    peers.settled(2)
    assert peers.stalled_among(["d0", "d1"]) == []
    peers.settled(3)  # a room with no batch: nothing to lift, no error
    assert peers.stalled_among(["d1"]) == []


def test_a_room_opened_by_metadata_is_ownerless_until_a_sender_owns_it() -> None:
    owners = RoomOwners()
    owners.opened_by_metadata(7)
    assert owners.ownerless(7)
    owners.sender_created(7)
    assert not owners.ownerless(7)
    owners.sender_created(8)
    owners.opened_by_metadata(8)  # the sender came first: owned
    assert not owners.ownerless(8)
    owners.cleared(7)
    owners.opened_by_metadata(7)  # reopened after its clear, no sender now
    assert owners.ownerless(7)


def test_early_aborts_are_taken_once_and_bounded_oldest_first() -> None:
    aborts = EarlyAborts(keep=3)
    for room in (1, 2, 3):
        aborts.remember(room)
    aborts.remember(1)  # remembered again: now the newest
    aborts.remember(4)
    assert len(aborts) == 3
    assert not aborts.take(2)  # the oldest, forgotten
    assert aborts.take(1) and not aborts.take(1)
    assert aborts.take(3) and aborts.take(4)


def test_the_port_race_writes_as_soon_as_the_abort_was_handled() -> None:
    race = PortRace()
    written: list[str] = []
    worker = threading.Thread(target=race.hold_status_write, args=(5, 30.0, lambda: written.append("late")))
    worker.start()
    try:
        while not written:  # until the worker parked: then it returns once the write is done
            race.abort_handled(5)
        assert written == ["late"]
    finally:
        worker.join(10)
    assert not worker.is_alive()
    race.abort_handled(6)  # nothing parked: returns at once


def test_the_port_race_writes_at_the_end_of_its_window_without_an_abort() -> None:
    race = PortRace()
    written: list[int] = []
    race.hold_status_write(9, 0.01, lambda: written.append(9))
    assert written == [9]

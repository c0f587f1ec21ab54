"""The status table: the emulated port's race replayed, the sticky policy row by row, legacy max()."""

from __future__ import annotations

import pytest

from pdwarden_runtime.kvpoll import OPENING, TERMINAL, KVPoll, coerce
from pdwarden_runtime.status import (
    STICKY_TRANSITIONS,
    ClosedRoom,
    IllegalTransition,
    RoomStatusTable,
    Rule,
    check,
)

pytestmark = pytest.mark.unit

F, B, W, T, S = (
    KVPoll.Failed,
    KVPoll.Bootstrapping,
    KVPoll.WaitingForInput,
    KVPoll.Transferring,
    KVPoll.Success,
)
ROOM = 0x5EED


def replay_seed_race(mode: str) -> tuple[RoomStatusTable, dict[str, object]]:
    """The five steps from the design notes, on the table and a transfer-info dict that
    stands in for the NIXL manager's ``transfer_infos`` (what the ABORT pops)."""
    table = RoomStatusTable(mode)  # type: ignore[arg-type]
    transfer_infos = {ROOM: "decode endpoint + dst indices"}
    table.open(ROOM, B)
    table.update(ROOM, W)  # decode's metadata arrived
    # 1. a transfer worker is mid-RDMA on a non-last chunk and has written Transferring
    table.update(ROOM, T)
    # 2. ABORT from decode: the control thread writes Failed and pops the transfer info
    table.update(ROOM, F, outcome="aborted")
    transfer_infos.pop(ROOM)
    # 3. the worker finishes the chunk and writes Transferring again
    late_write_applied = table.update(ROOM, T)
    # 4. the last chunk: the worker's skip guards (room missing, Failed, no transfer info)
    status = table.get(ROOM)
    skipped = status is None or status == F or ROOM not in transfer_infos
    if not skipped:  # pragma: no cover - both modes skip; the difference is the status left
        table.update(ROOM, S)
    # 5. what the poller sees from now on
    return table, {"late_write_applied": late_write_applied, "skipped": skipped}


def test_seed_race_legacy_leaves_room_transferring_forever() -> None:
    table, steps = replay_seed_race("legacy")
    assert steps["late_write_applied"] is True  # max(Failed=0, Transferring=3) == 3
    assert steps["skipped"] is True  # no transfer info: the last chunk is silently skipped
    assert table.get(ROOM) == T  # resurrected, and nothing will ever conclude it
    assert table.get(ROOM) not in TERMINAL
    assert table.refused() == {}  # and nothing counted it: the bug is invisible


def test_seed_race_sticky_ends_failed_with_one_refusal_counted() -> None:
    table, steps = replay_seed_race("sticky")
    assert steps["late_write_applied"] is False
    assert steps["skipped"] is True  # the guard now sees Failed, which is the truth
    assert table.get(ROOM) == F
    assert table.refused() == {(F, T): 1}


def test_policy_table_covers_every_pair_and_reads_as_documented() -> None:
    assert set(STICKY_TRANSITIONS) == {(a, b) for a in KVPoll for b in KVPoll}
    for (src, dst), rule in STICKY_TRANSITIONS.items():
        if src == dst:
            assert rule is Rule.REPEAT
        elif src == F:
            assert rule is Rule.REFUSE_TERMINAL  # Failed is terminal, no exception
        elif src == S:
            expected = Rule.FAILURE_OVERRIDES_SUCCESS if dst == F else Rule.REFUSE_TERMINAL
            assert rule is expected
        elif dst == F:
            assert rule is Rule.FAIL  # any live room may fail
        elif dst > src:
            assert rule is Rule.ADVANCE  # forward moves, including into Success
        else:
            assert rule is Rule.REFUSE_REGRESSION
    # the only exception to terminal stickiness is a named row
    exceptions = [
        pair
        for pair, rule in STICKY_TRANSITIONS.items()
        if pair[0] in TERMINAL and pair[0] != pair[1] and rule.applies
    ]
    assert exceptions == [(S, F)]


@pytest.mark.parametrize(("src", "dst"), sorted(STICKY_TRANSITIONS))
def test_every_row_behaves_as_the_table_says(src: KVPoll, dst: KVPoll) -> None:
    table = RoomStatusTable("sticky")
    table.open(1, B)
    if src != B:
        # reach src through allowed moves
        assert table.update(1, src)
    rule = STICKY_TRANSITIONS[(src, dst)]
    applied = table.update(1, dst)
    assert applied is rule.applies
    assert table.get(1) == (dst if rule.applies else src)
    assert table.refused() == ({} if rule.applies else {(src, dst): 1})
    if rule.applies:
        assert check(src, dst) is rule
    else:
        with pytest.raises(IllegalTransition, match=f"{src.name} -> {dst.name}"):
            check(src, dst)


def test_failure_overrides_success_is_applied_and_counted_as_override() -> None:
    table = RoomStatusTable("sticky")
    table.open(9, B)
    table.update(9, T)
    assert table.update(9, S)
    assert table.update(9, F)  # a failure recorded after Success wins (named row)
    assert table.get(9) == F
    assert table.overrides() == 1
    assert table.refused() == {}
    assert not table.update(9, S)  # and Failed stays terminal: no flip back
    assert table.refused() == {(F, S): 1}


def test_open_only_with_an_opening_status() -> None:
    table = RoomStatusTable("sticky")
    for status in (T, S, F):
        with pytest.raises(IllegalTransition, match="only Bootstrapping or WaitingForInput"):
            table.open(1, status)
    assert table.get(1) is None
    assert table.open(1, W)  # a dummy rank starts at WaitingForInput
    assert table.get(1) == W


def test_update_never_creates_a_room_in_sticky_mode() -> None:
    table = RoomStatusTable("sticky")
    for status in KVPoll:
        assert not table.update(5, status)
    assert table.get(5) is None
    assert len(table) == 0
    assert table.refused() == {(ClosedRoom.UNKNOWN, s): 1 for s in KVPoll}


def test_clear_ends_the_lifecycle_and_late_writes_are_refused_as_cleared() -> None:
    table = RoomStatusTable("sticky")
    table.open(3, B)
    table.update(3, T)
    table.clear(3)
    assert table.is_cleared(3)
    assert not table.update(3, T)  # the worker's late chunk write
    assert not table.update(3, W)  # late decode metadata: no orphan room (wedge mode 8)
    assert table.get(3) is None
    assert table.refused() == {(ClosedRoom.CLEARED, T): 1, (ClosedRoom.CLEARED, W): 1}
    # a new request reusing the room id starts a fresh lifecycle
    assert table.open(3, B)
    assert table.get(3) == B
    assert not table.is_cleared(3)


def test_tombstones_are_bounded_lru() -> None:
    table = RoomStatusTable("sticky", tombstones=3)
    for room in range(5):
        table.open(room, B)
        table.clear(room)
    assert [table.is_cleared(r) for r in range(5)] == [False, False, True, True, True]
    # an evicted tombstone still refuses, only classified "unknown"
    assert not table.update(0, T)
    assert table.refused() == {(ClosedRoom.UNKNOWN, T): 1}
    no_memory = RoomStatusTable("sticky", tombstones=0)
    no_memory.open(1, B)
    no_memory.clear(1)
    assert not no_memory.is_cleared(1)
    assert not no_memory.update(1, T)


def test_open_on_a_live_room_goes_through_the_table() -> None:
    table = RoomStatusTable("sticky")
    table.open(1, B)
    table.update(1, F)
    assert not table.open(1, B)  # a failed room is not reopened until cleared
    assert table.get(1) == F
    assert table.refused() == {(F, B): 1}


def test_strict_raises_and_still_counts() -> None:
    table = RoomStatusTable("sticky")
    table.open(1, B)
    table.update(1, F)
    with pytest.raises(IllegalTransition, match="Failed -> Transferring") as info:
        table.strict(1, T)
    assert info.value.room == 1 and info.value.origin == F and info.value.target == T
    with pytest.raises(IllegalTransition, match=r"CLEARED -> Success"):
        table.clear(1)
        table.strict(1, S)
    assert table.refused() == {(F, T): 1, (ClosedRoom.CLEARED, S): 1}


def test_on_refused_callback_gets_room_origin_target() -> None:
    seen: list[tuple[int, object, KVPoll]] = []
    table = RoomStatusTable("sticky", on_refused=lambda r, o, t: seen.append((r, o, t)))
    table.open(1, B)
    table.update(1, F)
    table.update(1, T)
    table.update(2, T)
    assert seen == [(1, F, T), (2, ClosedRoom.UNKNOWN, T)]


def test_sglang_int_statuses_interoperate() -> None:
    table = RoomStatusTable("sticky")
    assert table.open(1, 1)
    assert table.update(1, 3)
    assert table.get(1) == 3 and table.get(1) is T
    assert coerce(4) is S
    assert {int(k) for k in KVPoll} == {0, 1, 2, 3, 4}
    assert {B, W} == OPENING


@pytest.mark.parametrize("bad", [5, -1, 3.5, "3", None, [3]])
def test_bad_status_is_a_clear_error(bad: object) -> None:
    table = RoomStatusTable("sticky")
    table.open(1, B)
    with pytest.raises(ValueError, match="not a KV status"):
        table.update(1, bad)  # type: ignore[arg-type]
    assert table.get(1) == B


def test_bad_outcome_is_recorded_as_failed_not_raised() -> None:
    class Recorder:
        def __init__(self) -> None:
            self.outcomes: list[str] = []

        def opened(self, room: int) -> None:
            pass

        def concluded(self, room: int, status: KVPoll, outcome: str) -> None:
            self.outcomes.append(outcome)

        def abandoned(self, room: int) -> None:
            pass

        def entered(self, room: int, status: KVPoll) -> None:
            pass

    recorder = Recorder()
    table = RoomStatusTable("sticky", observer=recorder)
    table.open(1, B)
    assert table.update(1, F, outcome="no-such-outcome")
    assert recorder.outcomes == ["failed"]


def test_unknown_mode_and_bad_tombstones_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown status table mode 'strict'"):
        RoomStatusTable("strict")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tombstones must be >= 0"):
        RoomStatusTable("sticky", tombstones=-1)


def test_snapshot_and_counts() -> None:
    table = RoomStatusTable("sticky")
    table.open(1, B)
    table.open(2, B)
    table.update(2, T)
    snap = table.snapshot()
    assert snap == {1: B, 2: T}
    snap[3] = S  # a copy, not the table
    assert table.get(3) is None
    assert table.counts() == {F: 0, B: 1, W: 0, T: 1, S: 0}
    assert table[2] == T and 2 in table and 3 not in table
    assert sorted(table) == [1, 2] and len(table) == 2
    with pytest.raises(KeyError):
        table[3]


# --- legacy is the old SGLang rule exactly -----------------------------------------------
def old_sglang_update_status(request_status: dict[int, int], room: int, status: int) -> None:
    """The pre-fix update_status, as described in the research notes: any write creates
    the room, Failed always overwrites, everything else keeps max()."""
    if room not in request_status:
        request_status[room] = status
    elif status == 0:
        request_status[room] = 0
    else:
        request_status[room] = max(request_status[room], status)


def test_legacy_matches_old_sglang_on_every_pair_and_creation() -> None:
    for initial in [None, *KVPoll]:
        for status in KVPoll:
            table = RoomStatusTable("legacy")
            reference: dict[int, int] = {}
            if initial is not None:
                table.update(1, initial)
                old_sglang_update_status(reference, 1, initial)
            applied = table.update(1, status)
            old_sglang_update_status(reference, 1, status)
            assert table.get(1) == reference[1]
            assert applied is (reference[1] == status)
            assert table.refused() == {}


def test_legacy_clear_then_late_write_recreates_the_room() -> None:
    table = RoomStatusTable("legacy")
    table.open(1, B)
    table.clear(1)
    assert table.update(1, T)  # the orphan: nobody will ever end this room
    assert table.get(1) == T
    assert not table.is_cleared(1)

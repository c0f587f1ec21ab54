"""The hardened manager's status-write table (``STATUS_WRITES``) and the fault hooks' null
object, alone: every write a role can make has one rule, an unnamed one raises, and with no
fault on every hook leaves the message, state and ABORT path as they are."""

from __future__ import annotations

from typing import Any

import pytest

from pdwarden_contract import (
    FAULT_DROP_ABORT,
    FAULT_EMULATED_PORT_RACE,
    FAULT_NONE,
    FAULT_STALL,
    FAULT_STALL_KV_RECEIVE,
    FAULTS,
    ROLE_DECODE,
    ROLE_PREFILL,
    RUNTIME_ROLES,
)
from pdwarden_runtime.hardening.config import HardeningConfig
from pdwarden_runtime.hardening.faults.drop_abort import DropAbort
from pdwarden_runtime.hardening.faults.fault_set import FaultSet
from pdwarden_runtime.hardening.faults.hooks import NO_FAULTS, AbortPaths, Faults
from pdwarden_runtime.hardening.faults.stall_transfers import StallTransfers
from pdwarden_runtime.hardening.faults.stalled_agent import StallKvReceiveFault
from pdwarden_runtime.hardening.status_writes import (
    STATUS_WRITES,
    IllegalStatusWrite,
    Write,
    outcome_for,
    write_for,
)
from pdwarden_runtime.kvpoll import OPENING, TERMINAL, KVPoll
from pdwarden_runtime.status import ClosedRoom

pytestmark = pytest.mark.unit

ORIGINS: tuple[Any, ...] = (*ClosedRoom, *KVPoll)


def test_the_table_names_one_write_for_every_role_origin_and_target() -> None:
    assert len(STATUS_WRITES) == len(RUNTIME_ROLES) * len(ORIGINS) * len(KVPoll)
    for role in RUNTIME_ROLES:
        for origin in ORIGINS:
            for target in KVPoll:
                assert write_for(role, origin, target) is STATUS_WRITES[(role, origin, target)]


def test_a_write_the_table_does_not_name_raises_naming_it() -> None:
    with pytest.raises(IllegalStatusWrite, match=r"role=router.*Transferring.*target Failed") as err:
        write_for("router", KVPoll.Transferring, KVPoll.Failed)
    assert (err.value.role, err.value.origin, err.value.target) == (
        "router",
        KVPoll.Transferring,
        KVPoll.Failed,
    )


@pytest.mark.parametrize("role", RUNTIME_ROLES)
def test_only_opening_statuses_open_and_only_a_room_without_lifecycle(role: str) -> None:
    opening = {Write.OPEN, Write.OPEN_UNLESS_ABORTED, Write.OPEN_BY_METADATA}
    for (row_role, origin, target), write in STATUS_WRITES.items():
        if row_role != role or write not in opening:
            continue
        assert target in OPENING and isinstance(origin, ClosedRoom), (origin, target)
    for closed in ClosedRoom:
        for target in set(KVPoll) - OPENING:
            assert write_for(role, closed, target) is Write.ORPHAN


@pytest.mark.parametrize("role", RUNTIME_ROLES)
def test_every_failure_of_a_live_room_is_a_failure_write(role: str) -> None:
    expected = Write.FAIL_AND_TELL if role == ROLE_PREFILL else Write.FAIL
    for origin in KVPoll:
        assert write_for(role, origin, KVPoll.Failed) is expected


def test_the_prefill_reads_decode_metadata_and_its_late_arrival() -> None:
    assert write_for(ROLE_PREFILL, ClosedRoom.CLEARED, KVPoll.WaitingForInput) is Write.METADATA_AFTER_END
    assert write_for(ROLE_PREFILL, ClosedRoom.UNKNOWN, KVPoll.WaitingForInput) is Write.OPEN_BY_METADATA
    assert write_for(ROLE_DECODE, ClosedRoom.CLEARED, KVPoll.WaitingForInput) is Write.OPEN
    for live in KVPoll:
        assert write_for(ROLE_PREFILL, live, KVPoll.WaitingForInput) is Write.METADATA
        assert write_for(ROLE_DECODE, live, KVPoll.WaitingForInput) is Write.MOVE


@pytest.mark.parametrize("role", RUNTIME_ROLES)
def test_a_late_bootstrapping_is_its_own_write_except_a_repeat(role: str) -> None:
    assert write_for(role, KVPoll.Bootstrapping, KVPoll.Bootstrapping) is Write.MOVE
    for origin in set(KVPoll) - {KVPoll.Bootstrapping}:
        assert write_for(role, origin, KVPoll.Bootstrapping) is Write.LATE_BOOTSTRAP
    for origin in TERMINAL:
        assert write_for(role, origin, KVPoll.Success) is Write.MOVE  # the status table refuses


def test_outcome_for_reads_the_failure_reason() -> None:
    assert outcome_for("inflight deadline: room not concluded within 1.0s") == "deadline"
    assert outcome_for("Request timed out") == "deadline"
    assert outcome_for("Aborted by decode") == "aborted"
    assert outcome_for(None) == "failed"


# --- the fault hooks ---------------------------------------------------------------------
class _Paths:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.paths = AbortPaths(
            remember_early=lambda: self.calls.append("remember"),
            handle=self._handle,
            drop_transfer_info=lambda room: self.calls.append(f"drop {room}"),
        )

    def _handle(self) -> bool:
        self.calls.append("handle")
        return True


def test_no_fault_passes_everything_through() -> None:
    paths = _Paths()
    assert NO_FAULTS.abort_message([b"x"], paths.paths) is True
    assert paths.calls == ["remember", "handle"]
    message = [b"0", b"1", b"2", b"3", b"name", b"meta"]
    assert NO_FAULTS.registration_message(list(message)) == message
    assert NO_FAULTS.metadata_message(list(message)) == message
    assert NO_FAULTS.handle_state("h", lambda handle: f"DONE {handle}") == "DONE h"
    with NO_FAULTS.status_read():
        pass
    assert not (NO_FAULTS.takes_handle_wait or NO_FAULTS.never_settle or NO_FAULTS.names_stalled_agent)


def test_stall_transfers_keeps_every_handle_in_progress() -> None:
    fault = StallTransfers()
    assert fault.never_settle and fault.takes_handle_wait
    assert fault.handle_state("h", lambda handle: "DONE") == "PROC"


def test_drop_abort_drops_an_abort_unkept_and_passes_the_rest() -> None:
    from sglang.srt.disaggregation.common.conn import ABORT_TAG

    paths = _Paths()
    assert DropAbort().abort_message([ABORT_TAG, b"7"], paths.paths) is True
    assert paths.calls == []
    assert DropAbort().abort_message([b"other"], paths.paths) is True
    assert paths.calls == ["handle"]


def test_the_fault_set_follows_the_switch_and_its_role() -> None:
    config = HardeningConfig()
    forgotten: list[str] = []
    decode = FaultSet(config, ROLE_DECODE, object(), lambda: forgotten.append("decode"))
    prefill = FaultSet(config, ROLE_PREFILL, object(), lambda: forgotten.append("prefill"))
    assert set(FAULTS) == {
        FAULT_NONE,
        FAULT_STALL,
        FAULT_DROP_ABORT,
        FAULT_EMULATED_PORT_RACE,
        FAULT_STALL_KV_RECEIVE,
    }
    assert decode.active() is NO_FAULTS
    decode.receiver_starting()
    assert forgotten == []
    for name in FAULTS:
        config.fault.set(name)
        assert isinstance(decode.active(), Faults) and isinstance(prefill.active(), Faults)
        assert decode.active().takes_handle_wait is (name != FAULT_NONE)
    config.fault.set(FAULT_STALL_KV_RECEIVE)
    assert isinstance(decode.active(), StallKvReceiveFault)
    assert not prefill.active().names_stalled_agent  # a prefill names no agent of its own
    decode.receiver_starting()  # switched on: the registrations are forgotten once
    decode.receiver_starting()
    config.fault.set(FAULT_NONE)
    decode.receiver_starting()  # and again when switched off
    assert forgotten == ["decode", "decode"]

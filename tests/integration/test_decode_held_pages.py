"""Decode never frees pages on a clock while their writer may still write them: for real, a
synthetic prefill and decode as processes.

The prefill's ``stall-transfers`` fault keeps its handles looking in progress (quarantined
at its transfer deadline); the decode fails the room at its inflight deadline, aborts it and
holds the pages. They stay held past SGLang's 30 s "release anyway" timeout (the synthetic
engine freed them then before), and are freed once the writer drains (the fault cleared: the
quarantine sees the handles end, prefill sends its drain ACK) or once the writer is a new
process at the same address (a restart in place).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

import pdwarden_contract as c
from pdwarden_bench.pdclient import Endpoint, new_session, pd_request
from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.runtime_procs import Fleet, Runtime, http_post_json, serve_flags, wait_healthy

pytestmark = pytest.mark.integration

INFLIGHT_DEADLINE = 4.0
FLAGS = serve_flags(allow_fault_injection=True, transfer_deadline=1.5, inflight_deadline=INFLIGHT_DEADLINE)
# SGLang's SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT default (the old clock).
OLD_RELEASE_TIMEOUT_S = 30.0


class Pair:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.prefill = fleet.runtime("prefill", extra=FLAGS)
        self.decode = fleet.runtime("decode", extra=FLAGS)
        wait_healthy([self.prefill, self.decode], timeout=300)

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.prefill.url, self.decode.url, self.prefill.host, self.prefill.bootstrap_port)

    def restart_prefill_in_place(self) -> None:
        """The prefill's process dies and a new one serves the same bootstrap address."""
        old = self.prefill
        old.proc.signal(9)
        old.proc.popen.wait(10)
        self.prefill = self.fleet.runtime("prefill", extra=FLAGS, bootstrap_port=old.bootstrap_port)
        wait_healthy([self.prefill], timeout=300)


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with Fleet() as fleet:
        yield Pair(fleet)


def set_fault(rt: Runtime, fault: str) -> None:
    status, body = http_post_json(f"{rt.url}{c.FAULT_PATH}", {"fault": fault})
    assert status == 200 and body == {"fault": fault}, (status, body)


def hold_one_room(pair: Pair, room: int) -> dict[str, Any]:
    """A request whose transfer stalls: decode fails it at its deadline and holds its pages."""
    set_fault(pair.prefill, c.FAULT_STALL)

    async def one() -> str:
        async with new_session() as session:
            outcome, _ = await pd_request(session, pair.endpoint, room, prompt_tokens=96, timeout=30)
            return outcome

    asyncio.run(one())
    return wait_for(
        lambda: (s := pair.decode.state())["held_rooms"] and s,
        INFLIGHT_DEADLINE + 15,
        f"decode to hold room {room}'s pages",
        0.2,
    )


def freed(pair: Pair, room: int) -> dict[str, Any] | None:
    state = pair.decode.state()
    return next((f for f in state["freed_held_rooms"] if f["room"] == room), None)


def test_pages_stay_held_past_the_old_release_timeout_and_go_when_the_writer_drains(pair: Pair) -> None:
    room = 8_424_001
    state = hold_one_room(pair, room)
    held_at = time.monotonic()
    assert [h["room"] for h in state["held_rooms"]] == [room]
    assert state["free_pages"] < state["total_pages"]
    # past SGLang's timeout the pages are still held, and the writer still has the handles
    while time.monotonic() - held_at < OLD_RELEASE_TIMEOUT_S + 5:
        state = pair.decode.state()
        assert [h["room"] for h in state["held_rooms"]] == [room], state["freed_held_rooms"]
        assert pair.prefill.state()["quarantined_handles"] >= 1
        time.sleep(1.0)
    set_fault(pair.prefill, "none")  # the writes end: the quarantine sees it, prefill acks
    gone = wait_for(lambda: freed(pair, room), 15, f"room {room}'s pages freed", 0.2)
    assert gone["how"] == "drained"
    state = pair.decode.state()
    assert state["held_rooms"] == [] and state["free_pages"] == state["total_pages"]


def test_pages_go_when_the_writer_is_a_new_process_at_the_same_address(pair: Pair) -> None:
    room = 8_424_101
    hold_one_room(pair, room)
    time.sleep(5.0)  # the writer watch has identified the writer meanwhile
    assert freed(pair, room) is None
    pair.restart_prefill_in_place()
    gone = wait_for(lambda: freed(pair, room), 20, f"room {room}'s pages freed", 0.2)
    assert gone["how"] == "new-incarnation"
    state = pair.decode.state()
    assert state["held_rooms"] == [] and state["free_pages"] == state["total_pages"]

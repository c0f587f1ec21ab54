"""Decode never frees pages on a clock while their writer may still write them: for real, a
synthetic prefill and decode as processes.

The prefill's ``stall-transfers`` fault keeps its handles looking in progress (quarantined
at its transfer deadline); the decode fails the room at its inflight deadline, aborts it and
holds the pages. They stay held past SGLang's 30 s "release anyway" timeout (the synthetic
engine freed them then before), and are freed once the writer drains (the fault cleared: the
quarantine sees the handles end, prefill sends its drain ACK) or once the writer is a new
process at the same address (a restart in place). A room that fails for a reason decode did
not start (its heartbeat to a prefill that is alive but unreachable failed) holds its pages
the same way. Pages held for one writer over its bound (a quarter of the pool) make the decode
refuse that writer's new requests before publishing anything, until it drains.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import pdwarden_contract as c
from pdwarden_bench.pdclient import COMPLETED, Endpoint, new_session, pd_request, request_body
from pdwarden_localcluster.waits import WaitTimeout, wait_for
from pdwarden_runtime.hardening.config import DEFAULT_HELD_PAGES_PER_WRITER
from pdwarden_testkit.promtext import metric_sum, samples
from pdwarden_testkit.runtime_procs import (
    SMALL_KV,
    Fleet,
    Runtime,
    http_post_json,
    serve_flags,
    wait_healthy,
)

pytestmark = pytest.mark.integration

# Decode gives a room up this long after it began: long enough that the prefill of a loaded
# machine has posted the room's writes (and quarantined them) by then.
INFLIGHT_DEADLINE = 8.0
FLAGS = serve_flags(allow_fault_injection=True, transfer_deadline=1.5, inflight_deadline=INFLIGHT_DEADLINE)
# SGLang's SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT default (the old clock).
OLD_RELEASE_TIMEOUT_S = 30.0


# A decode that gives a prefill up after one missed heartbeat (SGLang's floor: every 2 s),
# long before its inflight deadline.
UNREACHABLE_FLAGS = serve_flags(allow_fault_injection=True, transfer_deadline=1.5, inflight_deadline=120)
FAST_HEARTBEAT = {
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "2",
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "1",
}


class Pair:
    def __init__(
        self, fleet: Fleet, flags: list[str] = FLAGS, decode_env: dict[str, str] | None = None
    ) -> None:
        self.fleet = fleet
        self.flags = flags
        self.prefill = fleet.runtime("prefill", extra=flags)
        self.decode = fleet.runtime("decode", extra=flags, env=decode_env)
        wait_healthy([self.prefill, self.decode], timeout=300)

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.prefill.url, self.decode.url, self.prefill.host, self.prefill.bootstrap_port)

    def restart_prefill_in_place(self) -> None:
        """The prefill's process dies and a new one serves the same bootstrap address."""
        old = self.prefill
        old.proc.signal(9)
        old.proc.popen.wait(10)
        self.prefill = self.fleet.runtime("prefill", extra=self.flags, bootstrap_port=old.bootstrap_port)
        wait_healthy([self.prefill], timeout=300)


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with Fleet() as fleet:
        yield Pair(fleet)


@pytest.fixture(scope="module")
def unreachable_pair() -> Iterator[Pair]:
    with Fleet() as fleet:
        yield Pair(fleet, UNREACHABLE_FLAGS, FAST_HEARTBEAT)


def set_fault(rt: Runtime, fault: str) -> None:
    status, body = http_post_json(f"{rt.url}{c.FAULT_PATH}", {"fault": fault})
    assert status == 200 and body == {"fault": fault}, (status, body)


def hold_one_room(pair: Pair, room: int, prompt_tokens: int = 96) -> dict[str, Any]:
    """A request whose transfer stalls: decode fails it at its deadline and holds its pages."""
    set_fault(pair.prefill, c.FAULT_STALL)

    async def one() -> str:
        async with new_session() as session:
            outcome, _ = await pd_request(
                session, pair.endpoint, room, prompt_tokens=prompt_tokens, timeout=30
            )
            return outcome

    asyncio.run(one())
    # the writer has the room's handles: posted, stalled, quarantined at its transfer deadline
    wait_for(
        lambda: room in pair.prefill.state()["quarantined_rooms"],
        15,
        f"the prefill to quarantine room {room}'s writes",
        0.2,
    )
    return wait_for(
        lambda: (s := pair.decode.state())["held_rooms"] and s,
        INFLIGHT_DEADLINE + 15,
        f"decode to hold room {room}'s pages",
        0.2,
    )


def freed(pair: Pair, room: int) -> dict[str, Any] | None:
    state = pair.decode.state()
    return next((f for f in state["freed_held_rooms"] if f["room"] == room), None)


def wait_freed(pair: Pair, room: int, timeout: float) -> dict[str, Any]:
    """The room's freed entry, once the decode freed its pages; else a failure that shows
    both sides' state and logs (what held the drain ACK back)."""
    try:
        return wait_for(lambda: freed(pair, room), timeout, f"room {room}'s pages freed", 0.2)
    except WaitTimeout:
        raise AssertionError(
            f"room {room}'s pages not freed in {timeout:g} s\n"
            f"prefill state: {pair.prefill.state()}\ndecode state: {pair.decode.state()}\n"
            f"prefill log:\n{pair.prefill.proc.log_tail(80)}\ndecode log:\n{pair.decode.proc.log_tail(80)}"
        ) from None


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
        assert room in pair.prefill.state()["quarantined_rooms"]
        time.sleep(1.0)
    set_fault(pair.prefill, "none")  # the writes end: the quarantine sees it, prefill acks
    gone = wait_freed(pair, room, 30)
    assert gone["how"] == "drained"
    state = pair.decode.state()
    assert state["held_rooms"] == [] and state["free_pages"] == state["total_pages"]


def test_pages_go_when_the_writer_is_a_new_process_at_the_same_address(pair: Pair) -> None:
    room = 8_424_101
    hold_one_room(pair, room)
    time.sleep(5.0)  # the writer watch has identified the writer meanwhile
    assert freed(pair, room) is None
    pair.restart_prefill_in_place()
    gone = wait_freed(pair, room, 30)
    assert gone["how"] == "new-incarnation"
    state = pair.decode.state()
    assert state["held_rooms"] == [] and state["free_pages"] == state["total_pages"]
    # The decode keeps SGLang's connection to the old process's rank until its heartbeat gives
    # that up (about 10 s): the pair serves again only then, and the module's other scenarios
    # (in any order) start from a pair that serves.
    rooms = itertools.count(8_424_102)  # a room number is used once
    wait_for(lambda: _completes(pair, next(rooms)), 60, "a request through the restarted pair", 0.5)


def _completes(pair: Pair, room: int) -> bool:
    async def one() -> str:
        async with new_session() as session:
            outcome, _ = await pd_request(session, pair.endpoint, room, prompt_tokens=16, timeout=30)
            return outcome

    return asyncio.run(one()) == COMPLETED


def test_a_room_failed_by_a_lost_heartbeat_holds_its_pages_until_the_writer_drains(
    unreachable_pair: Pair,
) -> None:
    """The prefill stops answering while its handles for the room may still write (stopped
    with SIGSTOP: alive, unreachable, as behind a partition). Decode's heartbeat gives it up
    and fails the room: a failure decode did not start, so it sends the ABORT and holds the
    pages, through the prefill's return, until the prefill drains."""
    pair = unreachable_pair
    room = 8_424_201
    set_fault(pair.prefill, c.FAULT_STALL)
    failed_before = pair.decode.state()["outcomes"].get(c.OUTCOME_FAILED, 0)

    def one() -> None:
        async def request() -> None:
            async with new_session() as session:
                await pd_request(session, pair.endpoint, room, prompt_tokens=96, timeout=60)

        asyncio.run(request())

    client = threading.Thread(target=one, daemon=True)
    client.start()
    try:
        # the prefill posted the room's writes (the decode published its pages) and they stall
        wait_for(
            lambda: room in pair.prefill.state()["quarantined_rooms"],
            30,
            f"the prefill to quarantine room {room}'s writes",
            0.2,
        )
        pair.prefill.proc.signal(signal.SIGSTOP)
        wait_for(
            lambda: pair.decode.state()["outcomes"].get(c.OUTCOME_FAILED, 0) > failed_before,
            30,
            f"decode to fail room {room} on the lost heartbeat",
            0.2,
        )
        state = pair.decode.state()
        assert [h["room"] for h in state["held_rooms"]] == [room], state
        assert state["free_pages"] < state["total_pages"]
    finally:
        pair.prefill.proc.signal(signal.SIGCONT)
    client.join(90)
    time.sleep(5.0)  # the prefill has read the ABORT; its handles still stall
    state = pair.decode.state()
    assert [h["room"] for h in state["held_rooms"]] == [room], state["freed_held_rooms"]
    set_fault(pair.prefill, c.FAULT_NONE)  # the writes end: prefill drains and acks
    gone = wait_freed(pair, room, 30)
    assert gone["how"] == "drained"
    state = pair.decode.state()
    assert state["held_rooms"] == [] and state["free_pages"] == state["total_pages"]


def test_a_writer_over_its_held_pages_bound_is_refused_new_requests_until_it_drains(pair: Pair) -> None:
    room, refused_room = 8_424_301, 8_424_302
    bound = int(int(str(SMALL_KV["pool_pages"])) * DEFAULT_HELD_PAGES_PER_WRITER)
    page_tokens = int(str(SMALL_KV["page_size"]))
    state = hold_one_room(pair, room, prompt_tokens=(bound + 5) * page_tokens)
    assert [(h["room"], h["pages"]) for h in state["held_rooms"]] == [(room, bound + 5)]
    # a new request for that writer: refused by the decode before it publishes anything
    body = request_body(refused_room, 96, 2, pair.endpoint)
    status, answer = http_post_json(f"{pair.decode.url}{c.GENERATE_PATH}", body, timeout=30)
    assert status == 500 and "over this decode's bound" in str(answer), (status, answer)
    state = pair.decode.state()
    assert [h["room"] for h in state["held_rooms"]] == [room]  # the refusal frees nothing held
    assert state["writer_refusals"][c.WRITER_REFUSED_HELD_PAGES] == 1
    assert str(refused_room) not in pair.prefill.state()["room_list"]  # no metadata reached it
    found = samples(pair.decode.metrics())
    assert (
        metric_sum(
            found,
            c.METRIC_KV_WRITER_REFUSED_TOTAL,
            peer=pair.prefill.host,
            reason=c.WRITER_REFUSED_HELD_PAGES,
        )
        == 1
    )
    set_fault(pair.prefill, c.FAULT_NONE)  # the writer drains: under its bound again
    gone = wait_freed(pair, room, 30)
    assert gone["how"] == "drained"

    async def one() -> str:
        async with new_session() as session:
            outcome, _ = await pd_request(session, pair.endpoint, 8_424_303, prompt_tokens=96, timeout=30)
            return outcome

    assert asyncio.run(one()) == COMPLETED

"""A real stalled peer, end to end: synthetic prefill and decode processes under load, the
decode frozen (SIGSTOP) past the transfer deadline, then resumed (SIGCONT).

Hardened: prefill's rooms that wait for or move KV drain while the decode is frozen, the
stalled handles are quarantined (not released: a released WRITE still lands) and decode
hears of the failure only after they ended; nothing is left non-terminal, no handle stays
quarantined, and decode's page verification finds 0 corrupted pages over every later
request. Stock SGLang 0.5.23 (``--hardening off``): the transfer worker stays in
``_await_handles`` while the peer is frozen (proof the test can fail).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from pdwarden_bench.pdclient import COMPLETED
from pdwarden_bench.stalled_peer import LATER_REQUESTS, run_pair, start_pair
from pdwarden_testkit.runtime_procs import Fleet, Runtime, wait_healthy

# exclusive: freezes and deadlines of a second or two, judged on a machine no other test loads
pytestmark = [pytest.mark.integration, pytest.mark.exclusive]

DEADLINE = 1.5
FREEZE = 2 * DEADLINE + 1.0


@pytest.fixture(scope="module")
def pairs() -> Iterator[dict[str, tuple[Runtime, Runtime]]]:
    with Fleet() as fleet:
        started = {"stock": start_pair(fleet, "off", DEADLINE), "hardened": start_pair(fleet, "on", DEADLINE)}
        wait_healthy([rt for pair in started.values() for rt in pair], timeout=300)
        yield started


def test_hardened_drains_within_the_deadline_and_corrupts_nothing(pairs: dict) -> None:
    prefill, decode = pairs["hardened"]
    run = asyncio.run(run_pair(prefill, decode, freeze=FREEZE, concurrency=6, room_base=7_100_000))
    assert run.drained_after_s is not None, "prefill's rooms never drained while decode was frozen"
    assert run.stuck_at_resume == 0
    assert run.deadline_failures >= 1
    assert run.max_quarantined >= 1  # the stalled handles were kept, not released
    assert run.quarantined_left == 0
    assert run.leftover_rooms == {}
    assert run.later == [COMPLETED] * LATER_REQUESTS
    assert run.corrupted_pages == 0
    assert decode.state()["rooms"] == {}


def test_stock_sglang_worker_stays_stuck_while_the_peer_is_frozen(pairs: dict) -> None:
    prefill, decode = pairs["stock"]
    run = asyncio.run(run_pair(prefill, decode, freeze=FREEZE, concurrency=6, room_base=7_200_000))
    assert run.drained_after_s is None
    assert run.stuck_at_resume >= 1
    assert run.oldest_transferring_s >= DEADLINE
    assert run.deadline_failures == 0
    # after SIGCONT the stalled write completes and stock recovers by itself
    assert run.later == [COMPLETED] * LATER_REQUESTS

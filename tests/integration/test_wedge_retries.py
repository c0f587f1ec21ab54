"""A wedge no client sees: requests caught in a wedged pair are answered by another pair.

Two synthetic prefill/decode pairs behind SGLang's router (smg) with the retries and circuit
breaker the operator renders, behind the router pod's gate as the operator runs it. One
prefill's transfers stall (the ``stall-transfers`` fault): its rooms fail at the runtime's
deadlines with 503, smg retries them on a new pair and a new bootstrap_room, and its breaker
keeps the retry off the wedged pair. Every request answers 200; those caught in the wedge
within the inflight deadline and a generous slack.

A burst of failures can open the breaker of every worker of a role at once (smg counts a PD
attempt's failure against both of its workers); smg then answers 503 ``no_available_workers``
without sending the request anywhere, and the gate sends it again once a breaker lets one
through.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import aiohttp
import pytest

import pdwarden_contract as c
from pdwarden_testkit.runtime_procs import (
    Fleet,
    Router,
    Runtime,
    http_post_json,
    serve_flags,
    wait_healthy,
    wait_router,
)

pytestmark = pytest.mark.integration

INFLIGHT_DEADLINE_S = 6
TRANSFER_DEADLINE_S = 4
FLAGS = serve_flags(
    allow_fault_injection=True, inflight_deadline=INFLIGHT_DEADLINE_S, transfer_deadline=TRANSFER_DEADLINE_S
)
ENV = {"UCX_TLS": "tcp,self"}  # UCX over TCP, as between pods on different nodes
CLIENTS = 6
TRAFFIC_S = 20.0
# A healthy answer takes well under a second here; slower ones were caught in the wedge.
CAUGHT_AFTER_S = 2.0
# The feature's bound: the deadline, the retry's backoff and an answer from another pair, with
# room for a loaded machine (the goal is the deadline plus 2 s).
CAUGHT_BOUND_S = INFLIGHT_DEADLINE_S + 5.0
# Requests sent at once into one stalled pair: their failures open both of its workers' breakers.
BURST = 4
NO_WORKERS = "no_available_workers"


@dataclass(frozen=True)
class Answer:
    sent: float  # seconds after the fault
    seconds: float
    status: int | str
    body: str


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with Fleet() as f:
        yield f


@pytest.fixture(scope="module")
def pairs(fleet: Fleet) -> tuple[list[Runtime], list[Runtime]]:
    prefills = [fleet.runtime("prefill", extra=FLAGS, env=ENV) for _ in range(2)]
    decodes = [fleet.runtime("decode", extra=FLAGS, env=ENV) for _ in range(2)]
    wait_healthy([*prefills, *decodes], timeout=300)
    return prefills, decodes


@pytest.fixture(scope="module")
def router(fleet: Fleet, pairs: tuple[list[Runtime], list[Runtime]]) -> Router:
    r = fleet.router(*pairs, gated=True)
    wait_router(r, timeout=240)
    return r


@pytest.fixture(scope="module")
def one_pair(fleet: Fleet, pairs: tuple[list[Runtime], list[Runtime]]) -> tuple[Runtime, Router, Router]:
    """The second pair alone behind smg twice: bare, and behind the gate; its prefill."""
    prefills, decodes = pairs
    bare = fleet.router([prefills[1]], [decodes[1]], gated=False)
    gated = fleet.router([prefills[1]], [decodes[1]], gated=True)
    wait_router(bare, timeout=240)
    wait_router(gated, timeout=240)
    return prefills[1], bare, gated


async def _post(
    session: aiohttp.ClientSession, router: Router, body: Mapping[str, object], since: float
) -> Answer:
    """One /generate through `router` and what it answered (a connection error as its name)."""
    t = time.monotonic()
    try:
        async with session.post(f"{router.url}/generate", json=body) as resp:
            status: int | str = resp.status
            text = await resp.text()
    except aiohttp.ClientError as err:
        status, text = type(err).__name__, str(err)
    return Answer(round(t - since, 2), time.monotonic() - t, status, text[:200])


async def _traffic(router: Router, since: float) -> list[Answer]:
    """CLIENTS clients, each sending its own prompt (so smg's cache-aware policy pins some of
    them to the wedged pair) one request after the other for TRAFFIC_S."""
    answers: list[Answer] = []
    end = time.monotonic() + TRAFFIC_S

    async def client(session: aiohttp.ClientSession, k: int) -> None:
        body = {
            "text": f"client {k}: " + "a wedge no client sees " * 4,
            "sampling_params": {"max_new_tokens": 4},
        }
        while time.monotonic() < end:
            answers.append(await _post(session, router, body, since))
            await asyncio.sleep(0.05)

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(client(session, k) for k in range(CLIENTS)))
    return answers


def test_requests_caught_in_a_wedged_pair_are_answered_by_another(
    router: Router, pairs: tuple[list[Runtime], list[Runtime]]
) -> None:
    prefills, _ = pairs
    wedged = prefills[0]
    status, answer = http_post_json(f"{wedged.url}{c.FAULT_PATH}", {"fault": c.FAULT_STALL})
    assert status == 200 and answer == {"fault": c.FAULT_STALL}, (status, answer)
    try:
        answers = asyncio.run(_traffic(router, time.monotonic()))
    finally:
        http_post_json(f"{wedged.url}{c.FAULT_PATH}", {"fault": c.FAULT_NONE})
    failed = [a for a in answers if a.status != 200]
    assert not failed, failed[:5]
    caught = [a for a in answers if a.seconds > CAUGHT_AFTER_S]
    # the wedge did catch requests: the stalled prefill failed their rooms at its deadline
    assert caught, f"no request was caught in the wedge among {len(answers)}"
    assert wedged.state()["failed"] >= len(caught) > 0
    late = [a for a in caught if a.seconds > CAUGHT_BOUND_S]
    assert not late, late


async def _burst_into_a_stall(router: Router, prefill: Runtime) -> list[Answer]:
    """BURST requests at once through `router` while `prefill`'s transfers stall; the stall ends
    as soon as the prefill fails its first room (the others are caught already): what each
    client got."""
    failed_before = prefill.state()["failed"]
    status, answer = http_post_json(f"{prefill.url}{c.FAULT_PATH}", {"fault": c.FAULT_STALL})
    assert status == 200 and answer == {"fault": c.FAULT_STALL}, (status, answer)
    since = time.monotonic()

    def body(k: int) -> dict[str, object]:
        return {"text": f"burst {k}: " + "every breaker open " * 4, "sampling_params": {"max_new_tokens": 4}}

    async def end_the_stall() -> None:
        while (await asyncio.to_thread(prefill.state))["failed"] <= failed_before:
            await asyncio.sleep(0.05)
        await asyncio.to_thread(http_post_json, f"{prefill.url}{c.FAULT_PATH}", {"fault": c.FAULT_NONE})

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            ending = asyncio.create_task(end_the_stall())
            answers = await asyncio.gather(*(_post(session, router, body(k), since) for k in range(BURST)))
            await asyncio.wait_for(ending, 30)
    finally:
        http_post_json(f"{prefill.url}{c.FAULT_PATH}", {"fault": c.FAULT_NONE})
    return answers


def test_a_request_smg_has_no_worker_for_is_sent_again_by_the_gate(
    one_pair: tuple[Runtime, Router, Router],
) -> None:
    prefill, bare, gated = one_pair
    # smg alone: the burst's failures open both workers' breakers, and the retries that find
    # them open are answered 503 no_available_workers, sent nowhere.
    control = asyncio.run(_burst_into_a_stall(bare, prefill))
    refused = [a for a in control if a.status == 503 and NO_WORKERS in a.body]
    assert refused, f"smg alone answered every request of the burst: {control}"
    # Behind the gate: the same burst, every request answered once a breaker lets one through.
    answers = asyncio.run(_burst_into_a_stall(gated, prefill))
    assert [a.status for a in answers] == [200] * BURST, answers
    late = [a for a in answers if a.seconds > 2 * INFLIGHT_DEADLINE_S + 5.0]
    assert not late, late

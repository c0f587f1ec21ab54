"""The whole PD path for real: SGLang's router (smg) -> synthetic prefill -> NIXL -> synthetic decode.

A hardened prefill/decode pair runs as separate processes for the module, behind the real
SGLang's router. Faults are switched on at run time through ``POST /debug/fault``. The
stalled peer (stock SGLang beside the hardened runtime) is in test_stalled_peer.py; the
emulated-port race control in test_transfer_hardening.py and test_sglang_nixl_race.py.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

import pdwarden_contract as c
from pdwarden_bench.pdclient import Endpoint, new_session, request_body
from pdwarden_localcluster.waits import WaitTimeout, wait_for
from pdwarden_testkit.promtext import metric_sum, samples
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

# The runtime's own transfer deadline: no test here stalls a peer (test_stalled_peer.py
# does), and a short one quarantines a decode peer whose WRITEs are merely slow on a
# loaded machine, failing every later request to it.
FLAGS = serve_flags(allow_fault_injection=True, race_window=20, inflight_deadline=120)
# UCX over TCP, as between pods on different nodes (UCX's cma transport, its default on
# one host, copies through the peer's memory directly).
ENV = {"UCX_TLS": "tcp,self"}
LONG_PROMPT = 160  # tokens: 10 pages, 5 chunks


class Pair:
    def __init__(self, prefill: Runtime, decode: Runtime) -> None:
        self.prefill, self.decode = prefill, decode
        self.endpoint = Endpoint(prefill.url, decode.url, prefill.host, prefill.bootstrap_port)

    def set_fault(self, fault: str) -> None:
        status, body = http_post_json(f"{self.prefill.url}{c.FAULT_PATH}", {"fault": fault})
        assert status == 200 and body == {"fault": fault}, (status, body)


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with Fleet() as f:
        yield f


@pytest.fixture(scope="module")
def pairs(fleet: Fleet) -> dict[str, Pair]:
    started = {
        "hardened": (
            fleet.runtime("prefill", extra=FLAGS, env=ENV),
            fleet.runtime("decode", extra=FLAGS, env=ENV),
        ),
    }
    wait_healthy([rt for pair in started.values() for rt in pair], timeout=300)
    return {name: Pair(*rts) for name, rts in started.items()}


@pytest.fixture(scope="module")
def router(fleet: Fleet, pairs: dict[str, Pair]) -> Router:
    hardened = pairs["hardened"]
    r = fleet.router([hardened.prefill], [hardened.decode])
    wait_router(r, timeout=240)
    return r


def settled(rt: Runtime, timeout: float = 45.0) -> dict[str, Any]:
    """The runtime's state once it holds no request, room, page or per-room entry (or its last
    state at the timeout: the caller's assertions then name what is left)."""

    def clean() -> dict[str, Any] | None:
        state = rt.state()
        ok = (
            state["pending_requests"] == 0
            and not state["rooms"]
            and state["background_tasks"] == 0
            and state["free_pages"] == state["total_pages"]
            and state["free_aux"] == state["total_aux"]
            and state["failure_records"] == 0
        )
        if rt.role == c.ROLE_PREFILL:
            ok = ok and state["transfer_infos"] == 0 and state["staging_outstanding"] == 0
        else:
            ok = ok and state["prefill_response_tracker"] == 0 and state["deferred_abort_acks"] == 0
        return state if ok else None

    try:
        return wait_for(clean, timeout, f"{rt.role} to settle", 0.5)
    except WaitTimeout:
        return rt.state()


async def _through_router(router: Router, n: int, abort_ratio: float, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    counts = {"completed": 0, "aborted": 0, "failed": 0, "unverified": 0}
    sem = asyncio.Semaphore(12)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def one(i: int) -> None:
            body = {
                "input_ids": [rng.randrange(32000) for _ in range(rng.randint(8, 120))],
                "sampling_params": {"max_new_tokens": 4},
            }
            abort_after = rng.uniform(0.0, 0.15) if rng.random() < abort_ratio else None
            async with sem:
                task = asyncio.ensure_future(session.post(f"{router.url}/generate", json=body))
                done, _ = await asyncio.wait([task], timeout=abort_after)
                if abort_after is not None and not done:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    counts["aborted"] += 1
                    return
                resp = await task
                async with resp:
                    answer = await resp.json(content_type=None) if resp.status == 200 else None
                if answer is None:
                    counts["failed"] += 1
                elif answer.get("meta_info", {}).get("kv_verified") is True:
                    counts["completed"] += 1
                else:
                    counts["unverified"] += 1

        await asyncio.gather(*(one(i) for i in range(n)))
    return counts


def test_router_routes_200_requests_each_verified(router: Router, pairs: dict[str, Pair]) -> None:
    hardened = pairs["hardened"]
    before = hardened.decode.state()["completed"]
    counts = asyncio.run(_through_router(router, 200, abort_ratio=0.0, seed=1))
    assert counts == {"completed": 200, "aborted": 0, "failed": 0, "unverified": 0}
    decode = hardened.decode.state()
    assert decode["completed"] - before == 200  # every page and aux byte compared on decode
    assert decode["verify_failures"] == 0


def test_disconnecting_clients_leave_nothing_behind(router: Router, pairs: dict[str, Pair]) -> None:
    hardened = pairs["hardened"]
    counts = asyncio.run(_through_router(router, 90, abort_ratio=0.3, seed=2))
    assert counts["failed"] == 0 and counts["unverified"] == 0
    assert counts["completed"] + counts["aborted"] == 90
    assert counts["aborted"] > 0
    for rt in (hardened.prefill, hardened.decode):
        state = settled(rt)
        assert state["pending_requests"] == 0, state
        assert state["rooms"] == {}, f"{rt.role} kept rooms: {state['room_list']}"
        assert state["free_pages"] == state["total_pages"], state
        assert state["free_aux"] == state["total_aux"], state
        assert state["failure_records"] == 0, state
        if rt.role == c.ROLE_PREFILL:
            assert state["transfer_infos"] == 0 and state["staging_outstanding"] == 0, state
            assert state["ledger"]["targets"] == 0 and state["ledger"]["queued_rooms"] == 0, state
        else:
            assert state["prefill_response_tracker"] == 0 and state["deferred_abort_acks"] == 0, state
        assert state["verify_failures"] == 0


def test_metrics_of_both_roles_carry_the_contract_and_move(router: Router, pairs: dict[str, Pair]) -> None:
    hardened = pairs["hardened"]
    before = {rt.role: samples(rt.metrics()) for rt in (hardened.prefill, hardened.decode)}
    counts = asyncio.run(_through_router(router, 20, abort_ratio=0.0, seed=3))
    assert counts["completed"] == 20
    for rt in (hardened.prefill, hardened.decode):
        text = rt.metrics()
        for name in (
            c.METRIC_INFLIGHT_REQUESTS,
            c.METRIC_INFLIGHT_OLDEST_AGE,
            c.METRIC_KV_ROOMS,
            c.METRIC_KV_TRANSFERS_TOTAL,
            c.METRIC_KV_TRANSFER_BYTES_TOTAL,
            c.METRIC_KV_TRANSFER_SECONDS,
            c.METRIC_STATUS_WRITES_REFUSED_TOTAL,
            c.METRIC_RUNTIME_INFO,
        ):
            assert f"\n{name}" in text, f"{rt.role} /metrics lacks {name}"
        after = samples(text)
        grew = metric_sum(after, c.METRIC_KV_TRANSFERS_TOTAL, outcome="success") - metric_sum(
            before[rt.role], c.METRIC_KV_TRANSFERS_TOTAL, outcome="success"
        )
        assert grew >= 20, f"{rt.role}: success transfers grew by {grew}"
        assert metric_sum(after, c.METRIC_KV_TRANSFER_BYTES_TOTAL) > metric_sum(
            before[rt.role], c.METRIC_KV_TRANSFER_BYTES_TOTAL
        )
        assert metric_sum(after, c.METRIC_RUNTIME_INFO, role=rt.role, engine="synthetic") == 1
        # Per-peer figures name the other side of the pair by its IP (what the operator
        # maps to a pod), and its successes moved with the total.
        other = hardened.decode if rt.role == c.ROLE_PREFILL else hardened.prefill
        peer_grew = metric_sum(
            after, c.METRIC_KV_PEER_TRANSFERS_TOTAL, peer=other.host, outcome="success"
        ) - metric_sum(before[rt.role], c.METRIC_KV_PEER_TRANSFERS_TOTAL, peer=other.host, outcome="success")
        assert peer_grew >= 20, f"{rt.role}: per-peer successes for {other.host} grew by {peer_grew}"
        peers = {s.labels["peer"] for s in after_samples(text, c.METRIC_KV_PEER_INFLIGHT)}
        assert peers == {other.host}, peers
        # the HTTP port serves the same registry
        assert c.METRIC_KV_TRANSFERS_TOTAL in rt_http_metrics(rt)


def after_samples(text: str, name: str) -> list[Any]:
    from prometheus_client.parser import text_string_to_metric_families

    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def rt_http_metrics(rt: Runtime) -> str:
    from pdwarden_testkit.runtime_procs import http_get

    status, text = http_get(f"{rt.url}{c.METRICS_PATH}")
    assert status == 200
    return text


def room_state(rt: Runtime, room: int) -> Any:
    return rt.state()["room_list"].get(str(room))


def wait_room(rt: Runtime, room: int, wanted: str, timeout: float = 30.0) -> bool:
    """Whether `room` reached state `wanted` within `timeout`."""
    try:
        wait_for(lambda: room_state(rt, room) == wanted, timeout, f"room {room} {wanted}", 0.05)
    except WaitTimeout:
        return False
    return True


def _legs(
    session: aiohttp.ClientSession, pair: Pair, room: int, extra: dict[str, Any] | None = None
) -> tuple[asyncio.Future[Any], asyncio.Future[Any]]:
    """The two legs of one request, as the router sends them."""
    body = {**request_body(room, LONG_PROMPT, 4, pair.endpoint), **(extra or {})}

    return (
        asyncio.ensure_future(_post_status(session, pair.prefill.url, body)),
        asyncio.ensure_future(_post_status(session, pair.decode.url, body)),
    )


async def _post_status(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> int:
    async with session.post(f"{url}/generate", json=body) as resp:
        await resp.read()
        return resp.status


async def _cancel(*tasks: asyncio.Future[Any]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _decode_aborts_mid_transfer(pair: Pair, room: int, hold: float) -> dict[str, Any]:
    """Send both legs; once prefill's room is Transferring (its first chunk landed and,
    under the race fault, its status write waits), only decode's leg disconnects (decode
    aborts; prefill hears of it through SGLang's ABORT alone). Report what prefill does
    in the next ``hold`` seconds."""
    async with new_session() as session:
        prefill_leg, decode_leg = _legs(session, pair, room)
        loop = asyncio.get_running_loop()
        reached = await loop.run_in_executor(None, wait_room, pair.prefill, room, "transferring")
        await asyncio.sleep(0.5)
        await _cancel(decode_leg)
        t0 = time.monotonic()
        await asyncio.wait([prefill_leg], timeout=hold)
        result = {
            "reached_transferring": reached,
            "prefill_returned": prefill_leg.done(),
            "seconds": time.monotonic() - t0,
            "room_after": await loop.run_in_executor(None, room_state, pair.prefill, room),
        }
        await _cancel(prefill_leg)  # cleanup: the client walks away from a wedged request
        return result


def _refused_failed_to_transferring(rt: Runtime) -> float:
    return metric_sum(
        samples(rt.metrics()),
        c.METRIC_STATUS_WRITES_REFUSED_TOTAL,
        from_state="failed",
        to_state="transferring",
    )


def test_emulated_port_race_concludes_failed_with_hardening(pairs: dict[str, Pair]) -> None:
    hardened = pairs["hardened"]
    refused_before = _refused_failed_to_transferring(hardened.prefill)
    hardened.set_fault(c.FAULT_EMULATED_PORT_RACE)
    try:
        result = asyncio.run(_decode_aborts_mid_transfer(hardened, room=777002, hold=30.0))
    finally:
        hardened.set_fault("none")
    assert result["reached_transferring"]
    assert result["prefill_returned"] is True
    assert result["room_after"] is None  # concluded Failed and cleared
    assert _refused_failed_to_transferring(hardened.prefill) == refused_before + 1
    assert settled(hardened.prefill)["rooms"] == {}


def test_a_prefill_leg_cancelled_while_bootstrapping_ends_its_room_at_once(pairs: dict[str, Pair]) -> None:
    """The router closes the prefill leg of a request whose client left before decode sent
    its metadata: the prefill's HTTP handler is cancelled and the Bootstrapping room ends."""
    hardened = pairs["hardened"]
    room = 779001

    async def scenario() -> tuple[bool, bool]:
        async with new_session() as session:
            body = request_body(room, LONG_PROMPT, 4, hardened.endpoint)
            leg = asyncio.ensure_future(_post_status(session, hardened.prefill.url, body))
            loop = asyncio.get_running_loop()
            opened = await loop.run_in_executor(None, wait_room, hardened.prefill, room, "bootstrapping")
            await _cancel(leg)
            try:
                await loop.run_in_executor(
                    None, wait_for, lambda: room_state(hardened.prefill, room) is None, 5.0, "room gone", 0.05
                )
            except WaitTimeout:
                return opened, False
            return opened, True

    opened, gone = asyncio.run(scenario())
    assert opened and gone
    assert settled(hardened.prefill)["pending_requests"] == 0


def test_a_decode_leg_that_ends_before_its_metadata_fails_the_prefill_room_at_once(
    pairs: dict[str, Pair],
) -> None:
    """Decode waits for KV pages (another request holds most of its pool) when its client
    leaves: decode never sent its metadata, but its ABORT still reaches the prefill, whose
    room fails at once instead of waiting out its bootstrap timeout."""
    hardened = pairs["hardened"]
    big, room = 779101, 779102
    pool = hardened.decode.state()["total_pages"]

    async def scenario() -> dict[str, Any]:
        async with new_session() as session:
            # `big` holds most of decode's pages while prefill sends it slowly (compute per chunk)
            big_body = {
                **request_body(big, (pool - 40) * 16, 4, hardened.endpoint),
                "synthetic_compute_ms": 40,
            }
            big_legs = [
                asyncio.ensure_future(_post_status(session, url, big_body))
                for url in (hardened.prefill.url, hardened.decode.url)
            ]
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, wait_room, hardened.prefill, big, "transferring")
            prefill_leg, decode_leg = _legs(session, hardened, room, {"input_ids": list(range(100 * 16))})
            await loop.run_in_executor(None, wait_room, hardened.prefill, room, "bootstrapping")
            await asyncio.sleep(0.5)
            waiting_for_pages = hardened.decode.state()["admission_waiting"]
            await _cancel(decode_leg)  # the client leaves; the router closes the decode leg first
            t0 = time.monotonic()
            await asyncio.wait([prefill_leg], timeout=10)
            ended_s = time.monotonic() - t0
            status = prefill_leg.result() if prefill_leg.done() else None
            if not prefill_leg.done():
                await _cancel(prefill_leg)
            big_status = [await leg for leg in big_legs]
            return {"waiting": waiting_for_pages, "status": status, "seconds": ended_s, "big": big_status}

    result = asyncio.run(scenario())
    assert result["waiting"] == 1, result  # decode's request waited for pages, metadata unsent
    assert result["status"] == 500 and result["seconds"] < 5.0, result
    assert result["big"] == [200, 200], result
    for rt in (hardened.prefill, hardened.decode):
        state = settled(rt)
        assert state["rooms"] == {} and state["free_pages"] == state["total_pages"], state


def test_a_decode_leg_whose_prefill_leg_never_came_leaves_no_room_on_the_prefill(
    pairs: dict[str, Pair],
) -> None:
    """The client leaves before the router's prefill leg reached the prefill: decode's
    metadata alone opened the prefill's room, and no request there will ever end it. The
    decode leg's end (its ABORT) fails that room and the prefill lets it go at once; a
    prefill leg that comes after all is refused, never left waiting."""
    hardened = pairs["hardened"]
    room = 779301

    async def scenario() -> tuple[bool, bool, int]:
        async with new_session() as session:
            body = request_body(room, LONG_PROMPT, 4, hardened.endpoint)
            decode_leg = asyncio.ensure_future(_post_status(session, hardened.decode.url, body))
            loop = asyncio.get_running_loop()
            opened = await loop.run_in_executor(
                None, wait_room, hardened.prefill, room, c.KV_STATE_WAITING_FOR_INPUT
            )
            await _cancel(decode_leg)
            try:
                await loop.run_in_executor(
                    None, wait_for, lambda: room_state(hardened.prefill, room) is None, 5.0, "room gone", 0.05
                )
            except WaitTimeout:
                return opened, False, 0
            return opened, True, await _post_status(session, hardened.prefill.url, body)

    opened, gone, late = asyncio.run(scenario())
    assert opened and gone
    assert late in (409, 500), late  # the late prefill leg fails at once
    for rt in (hardened.prefill, hardened.decode):
        state = settled(rt)
        assert state["rooms"] == {} and state["free_pages"] == state["total_pages"], state


def test_a_room_number_is_used_once(pairs: dict[str, Pair]) -> None:
    """A resend of a request that already ran (a router's retry of the same body) is refused
    on both roles: its room's pages are never written twice."""
    hardened = pairs["hardened"]
    room = 779201

    async def twice() -> list[list[int]]:
        async with new_session() as session:
            statuses = []
            for _ in range(2):
                legs = _legs(session, hardened, room)
                statuses.append([await leg for leg in legs])
            return statuses

    first, second = asyncio.run(twice())
    assert first == [200, 200] and second == [409, 409]

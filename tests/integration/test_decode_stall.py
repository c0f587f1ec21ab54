"""The decode-side transfer stall fault (``stall-kv-receive``) for real: two synthetic
prefills and one decode as processes, real NIXL over UCX's TCP transport.

With the fault on, the decode still answers HTTP, but the rooms it opens name a NIXL agent
of its own that never progresses: both prefills' WRITEs into it stay in progress until
their transfer deadline, and their per-peer figures name the decode (deadline outcomes, no
success). Switched off, new rooms move through the decode's own agent again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

import pdwarden_contract as c
from pdwarden_bench.pdclient import COMPLETED, Endpoint, new_session, pd_request
from pdwarden_testkit.promtext import metric_sum, samples
from pdwarden_testkit.runtime_procs import Fleet, Runtime, http_get, http_post_json, serve_flags, wait_healthy

# exclusive: freezes and deadlines of a second or two, judged on a machine no other test loads
pytestmark = [pytest.mark.integration, pytest.mark.exclusive]

FLAGS = serve_flags(allow_fault_injection=True, transfer_deadline=1.5, inflight_deadline=6)
ENV = {"UCX_TLS": "tcp,self"}


@pytest.fixture(scope="module")
def trio() -> Iterator[tuple[Runtime, Runtime, Runtime]]:
    with Fleet() as fleet:
        rts = (
            fleet.runtime("prefill", extra=FLAGS, env=ENV),
            fleet.runtime("prefill", extra=FLAGS, env=ENV),
            fleet.runtime("decode", extra=FLAGS, env=ENV),
        )
        wait_healthy(list(rts), timeout=300)
        yield rts


def endpoint(prefill: Runtime, decode: Runtime) -> Endpoint:
    return Endpoint(prefill.url, decode.url, prefill.host, prefill.bootstrap_port)


async def _requests(pairs: list[tuple[Endpoint, int]]) -> list[str]:
    async with new_session() as session:
        results = await asyncio.gather(
            *(pd_request(session, ep, room, prompt_tokens=96, timeout=60) for ep, room in pairs)
        )
    return [outcome for outcome, _ in results]


def set_fault(rt: Runtime, fault: str) -> None:
    status, body = http_post_json(f"{rt.url}{c.FAULT_PATH}", {"fault": fault})
    assert status == 200 and body == {"fault": fault}, (status, body)


def peer_count(rt: Runtime, peer: str, outcome: str) -> float:
    return metric_sum(samples(rt.metrics()), c.METRIC_KV_PEER_TRANSFERS_TOTAL, peer=peer, outcome=outcome)


def test_a_stalled_decode_stalls_every_prefill_sending_to_it_and_recovers_when_cleared(
    trio: tuple[Runtime, Runtime, Runtime],
) -> None:
    p0, p1, decode = trio
    assert asyncio.run(_requests([(endpoint(p0, decode), 8_100_001), (endpoint(p1, decode), 8_100_002)])) == [
        COMPLETED,
        COMPLETED,
    ]
    before = {p.url: peer_count(p, decode.host, c.OUTCOME_DEADLINE) for p in (p0, p1)}
    set_fault(decode, c.FAULT_STALL_KV_RECEIVE)
    try:
        outcomes = asyncio.run(
            _requests([(endpoint(p, decode), 8_100_010 + i) for i, p in enumerate((p0, p1, p0, p1))])
        )
        assert COMPLETED not in outcomes, outcomes
        status, _ = http_get(f"{decode.url}{c.HEALTH_PATH}")
        assert status == 200  # the decode stays up and answers HTTP
        for p in (p0, p1):
            assert peer_count(p, decode.host, c.OUTCOME_DEADLINE) > before[p.url], p.url
            assert p.state()["handle_deadlines"] >= 1  # the WRITEs really stalled in NIXL
    finally:
        set_fault(decode, c.FAULT_NONE)
    assert asyncio.run(_requests([(endpoint(p0, decode), 8_100_101), (endpoint(p1, decode), 8_100_102)])) == [
        COMPLETED,
        COMPLETED,
    ]

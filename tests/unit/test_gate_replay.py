"""What the router's gate sends again (pure): only smg's "no available workers" answer, and only
a body it kept whole."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

import pdwarden_contract as c
from pdwarden_runtime.gate_replay import (
    NO_WORKERS_RETRY_DELAYS_S,
    Replay,
    is_no_workers_answer,
    may_be_no_workers_answer,
)

pytestmark = pytest.mark.unit

# smg 1.13.0's answer while every decode's breaker is open.
SMG_NO_WORKERS = json.dumps(
    {
        "error": {
            "type": "server_error",
            "code": "no_available_workers",
            "message": "No available servers: No available decode workers (all circuits open or unhealthy)",
            "param": None,
        }
    }
).encode()


async def _chunks(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def _through(replay: Replay, chunks: list[bytes], take: int | None = None) -> list[bytes]:
    async def run() -> list[bytes]:
        out: list[bytes] = []
        async for chunk in replay.tee(_chunks(chunks)):
            out.append(chunk)
            if take is not None and len(out) == take:
                break
        return out

    return asyncio.run(run())


@given(st.lists(st.binary(max_size=64), max_size=20))
def test_a_body_within_the_limit_passes_unchanged_and_is_kept_whole(chunks: list[bytes]) -> None:
    replay = Replay(limit=20 * 64)
    assert _through(replay, chunks) == chunks
    assert replay.body() == b"".join(chunks)


@given(st.lists(st.binary(min_size=1, max_size=64), min_size=1, max_size=20))
def test_a_body_over_the_limit_passes_unchanged_and_is_not_kept(chunks: list[bytes]) -> None:
    size = sum(map(len, chunks))
    replay = Replay(limit=size - 1)
    assert _through(replay, chunks) == chunks
    assert replay.body() is None


def test_a_body_not_all_sent_is_not_kept() -> None:
    replay = Replay()
    assert _through(replay, [b'{"text":', b'"hi"}'], take=1) == [b'{"text":']
    assert replay.body() is None


def test_a_request_without_a_body_is_sent_again_without_one() -> None:
    assert Replay.empty().body() == b""


def test_only_smgs_no_available_workers_answer_is_sent_again() -> None:
    assert is_no_workers_answer(SMG_NO_WORKERS)
    other_503 = {"error": {"type": "server_error", "code": "kv_transfer_failed", "message": "room failed"}}
    for body in (
        json.dumps(other_503).encode(),
        b'{"error": "no_available_workers"}',
        b'["no_available_workers"]',
        b"no_available_workers",
        b"",
        b"\xff\xfe",
    ):
        assert not is_no_workers_answer(body), body


def test_only_a_small_sized_503_is_read_to_see_its_code() -> None:
    sized = {"Content-Length": str(len(SMG_NO_WORKERS))}
    assert may_be_no_workers_answer(503, sized)
    assert not may_be_no_workers_answer(500, sized)
    assert not may_be_no_workers_answer(200, sized)
    assert not may_be_no_workers_answer(503, {})  # a stream: read as it comes, never held
    assert not may_be_no_workers_answer(503, {"Content-Length": "1048576"})
    assert not may_be_no_workers_answer(503, {"Content-Length": "-1"})


def test_the_waits_outlast_a_breaker_opened_twice() -> None:
    assert sum(NO_WORKERS_RETRY_DELAYS_S) > 2 * c.ROUTER_BREAKER_OPEN_S
    assert list(NO_WORKERS_RETRY_DELAYS_S) == sorted(NO_WORKERS_RETRY_DELAYS_S)

"""A PD client that does what the router (smg) does for one request, and can walk away.

The same body goes to prefill and decode with ``bootstrap_host``/``bootstrap_port``/
``bootstrap_room``; the answer is decode's. ``abort_after`` closes both connections at
that point (a client that disconnects through the router: both sides abort): after so
many seconds, or once a given future is done (a client acting on what it observed).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

COMPLETED = "completed"
ABORTED = "aborted"
FAILED = "failed"


@dataclass(frozen=True)
class Endpoint:
    prefill_url: str
    decode_url: str
    bootstrap_host: str
    bootstrap_port: int


def request_body(room: int, prompt_tokens: int, max_new_tokens: int, endpoint: Endpoint) -> dict[str, Any]:
    rng = random.Random(room)
    return {
        "input_ids": [rng.randrange(32000) for _ in range(prompt_tokens)],
        "sampling_params": {"max_new_tokens": max_new_tokens},
        "bootstrap_host": endpoint.bootstrap_host,
        "bootstrap_port": endpoint.bootstrap_port,
        "bootstrap_room": room,
    }


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with session.post(url, json=body) as resp:
        try:
            payload = await resp.json(content_type=None)
        except (aiohttp.ContentTypeError, ValueError):
            payload = await resp.text()
        return resp.status, payload


async def _wait_legs(
    legs: Sequence[asyncio.Future[Any]], abort_after: float | asyncio.Future[Any] | None, timeout: float
) -> None:
    """Until every leg is done, or the abort point (seconds, or a future's completion)."""
    if not isinstance(abort_after, asyncio.Future):
        await asyncio.wait(legs, timeout=abort_after)
        return
    all_done = asyncio.ensure_future(asyncio.wait(legs))
    try:
        await asyncio.wait([all_done, abort_after], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        all_done.cancel()  # cancelling asyncio.wait leaves the legs running


async def pd_request(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    room: int,
    *,
    prompt_tokens: int,
    max_new_tokens: int = 4,
    abort_after: float | asyncio.Future[Any] | None = None,
    timeout: float = 60.0,
    decode_only_abort: bool = False,
    detached: list[asyncio.Future[Any]] | None = None,
    extra: dict[str, Any] | None = None,
) -> tuple[str, Any]:
    """One request through both legs; (outcome, decode's answer or the error).

    ``decode_only_abort``: at ``abort_after`` only the decode leg disconnects (decode
    aborts the request; prefill learns of it through SGLang's ABORT alone, as in the
    emulated port's race); the prefill leg is left running and appended to ``detached``."""
    body = {**request_body(room, prompt_tokens, max_new_tokens, endpoint), **(extra or {})}
    t0 = time.perf_counter()
    prefill_done_at: list[float] = []  # when prefill answered (its room concluded)
    prefill = asyncio.ensure_future(_post(session, f"{endpoint.prefill_url}/generate", body))
    prefill.add_done_callback(lambda _leg: prefill_done_at.append(time.perf_counter()))
    decode = asyncio.ensure_future(_post(session, f"{endpoint.decode_url}/generate", body))
    legs = [prefill, decode]
    try:
        if decode_only_abort and abort_after is not None and detached is not None:
            await _wait_legs(legs, abort_after, timeout)
            if not all(leg.done() for leg in legs):
                if not prefill.done():
                    detached.append(prefill)
                    legs = [decode]
                return ABORTED, None
        await _wait_legs(legs, abort_after if abort_after is not None else timeout, timeout)
        if abort_after is not None and not all(leg.done() for leg in legs):
            return ABORTED, None
        if abort_after is None and not all(leg.done() for leg in legs):
            return FAILED, f"no answer within {timeout}s"
        if abort_after is not None:
            await asyncio.gather(*legs, return_exceptions=True)
        if decode.exception() is not None:
            return FAILED, repr(decode.exception())
        status, answer = decode.result()
        if status == 200 and isinstance(answer, dict) and answer.get("meta_info", {}).get("kv_verified"):
            if prefill.done() and not prefill.cancelled() and prefill.exception() is None:
                prefill_answer = prefill.result()[1]
                if isinstance(prefill_answer, dict):
                    answer["prefill_meta_info"] = prefill_answer.get("meta_info")
                if prefill_done_at:
                    answer["prefill_done_s"] = prefill_done_at[0] - t0
            return COMPLETED, answer
        return FAILED, answer
    finally:
        for leg in legs:
            if not leg.done():
                leg.cancel()
        for leg in legs:
            with contextlib.suppress(BaseException):
                await leg


def new_session(limit: int = 256) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, force_close=False),
        timeout=aiohttp.ClientTimeout(total=None),
    )

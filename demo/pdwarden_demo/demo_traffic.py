"""Steady client traffic through the router: `POST /generate`, some clients cancelling.

Each client loops: send a request, wait for the answer (or give up after `timeout_s`).
A fraction of requests is cancelled by its client shortly after it was sent (the
disconnect that makes SGLang abort the request on both sides: the race's trigger).
Every finished request is recorded with its time and outcome, so any time window can be
judged afterwards (before the fault, during the wedge, after the restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp

import pdwarden_contract as contract

OK, FAILED, CANCELLED = "ok", "failed", "cancelled"


@dataclass
class TrafficLog:
    events: list[tuple[float, str]] = field(default_factory=list)  # (wall time at the end, outcome)
    # (wall time at the start, seconds it took, outcome) of every request
    requests: list[tuple[float, float, str]] = field(default_factory=list)

    def record(self, outcome: str, started: float | None = None) -> None:
        now = time.time()
        self.events.append((now, outcome))
        if started is not None:
            self.requests.append((started, now - started, outcome))

    def counts(self, since: float = 0.0, until: float = float("inf")) -> Counter[str]:
        return Counter(outcome for at, outcome in self.events if since <= at < until)

    def slow(self, since: float, slower_than: float) -> list[float]:
        """How long each answered request (ok or failed, not cancelled) that ended after
        ``since`` and took longer than ``slower_than`` seconds took: the requests a wedge caught."""
        return [
            took
            for started, took, outcome in self.requests
            if outcome != CANCELLED and started + took >= since and took > slower_than
        ]


def p99(values: list[float]) -> float | None:
    """The 99th percentile (nearest rank) of ``values``; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


@dataclass(frozen=True)
class TrafficConfig:
    steady_clients: int = 3  # short prompts (one KV chunk), never cancel
    impatient_clients: int = 1  # long prompts (several KV chunks), give up after cancel_after_s
    # Long enough for the first chunk to land (and, with the race fault, park its status
    # write), short enough to give up inside the fault's 5 s race window.
    cancel_after_s: float = 2.0
    # Longer than the demo's inflight deadline and smg's retries: a request caught in the wedge
    # is answered (by another pair) at the deadline, and a client that gave up first would count
    # a wedge as a failure that no client would see.
    timeout_s: float = 60.0
    max_new_tokens: int = 4
    pause_s: float = 0.05  # between a client's requests: steady, not a flood


SHORT_PROMPT = "pdwarden demo: the quick brown fox"
# Several KV pages, so several chunks: the race lives between a non-last chunk's transfer and
# its status write, so only a multi-chunk request can meet it.
LONG_PROMPT = "pdwarden demo, a long prompt. " * 14


def request_body(model: str, prompt: str, max_new_tokens: int) -> dict[str, object]:
    """A `/generate` body for the model's router: the router routes by `model` (the model's
    served name, its name unless `spec.model.servedName` says otherwise)."""
    return {
        "model": model,
        "text": prompt,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0},
    }


async def run_traffic(
    router_ip: str, model: str, cfg: TrafficConfig, log: TrafficLog, stop: asyncio.Event
) -> None:
    url = f"http://{router_ip}:{contract.ROUTER_HTTP_PORT}{contract.GENERATE_PATH}"

    async def client(session: aiohttp.ClientSession, impatient: bool) -> None:
        body = request_body(model, LONG_PROMPT if impatient else SHORT_PROMPT, cfg.max_new_tokens)
        cancel_after = cfg.cancel_after_s if impatient else None
        while not stop.is_set():
            started = time.time()
            log.record(await one_request(session, url, body, cfg.timeout_s, cancel_after), started)
            await asyncio.sleep(cfg.pause_s)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(
            *(client(session, False) for _ in range(cfg.steady_clients)),
            *(client(session, True) for _ in range(cfg.impatient_clients)),
        )


async def one_request(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, object],
    timeout_s: float,
    cancel_after: float | None,
) -> str:
    async def send() -> str:
        try:
            async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                await resp.read()
                return OK if resp.status == 200 else FAILED
        except (aiohttp.ClientError, TimeoutError):
            return FAILED

    if cancel_after is None:
        return await send()
    task = asyncio.ensure_future(send())
    done, _ = await asyncio.wait({task}, timeout=cancel_after)
    if done:
        return task.result()
    task.cancel()  # the client walks away: the connection closes mid-request
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return CANCELLED


async def probe(router_ip: str, model: str, timeout_s: float = 10.0) -> bool:
    """One request through the router, answered 200?"""
    url = f"http://{router_ip}:{contract.ROUTER_HTTP_PORT}{contract.GENERATE_PATH}"
    async with aiohttp.ClientSession() as session:
        return await one_request(session, url, request_body(model, SHORT_PROMPT, 2), timeout_s, None) == OK

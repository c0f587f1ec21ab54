"""`pdwarden bench router-gate`: what the router pod's gate costs a request.

One synthetic prefill and one decode that require the model's worker key, and two routers in
front of them: smg with the key as its own ``--api-key``, its clients presenting it
(``direct``), and smg behind ``pdwarden runtime router``'s gate as the operator runs it, its
clients presenting nothing (``gated``). The same seeded workload of short requests goes through
each arm in turn, ABAB, for ``--rounds`` pairs; the figures are each arm's latency percentiles
and rate over all its rounds, and the median of the per-pair rate ratios with its spread.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import click

import pdwarden_contract as c
from pdwarden_runtime.worker_key import auth_headers
from pdwarden_testkit.runtime_procs import (
    Fleet,
    Router,
    exit_on_sigterm,
    serve_flags,
    wait_healthy,
    wait_router,
)


def short_requests(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` seeded short requests (8 to 64 prompt tokens, 2 new): each costs little compute,
    so a round's figures are mostly the per-request path (also `pdwarden bench serving`'s)."""
    rng = random.Random(seed)
    return [
        {
            "input_ids": [rng.randrange(32000) for _ in range(rng.randint(8, 64))],
            "sampling_params": {"max_new_tokens": 2},
        }
        for _ in range(n)
    ]


async def send_round(
    url: str,
    bodies: list[dict[str, Any]],
    concurrency: int,
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> tuple[list[float], int, float]:
    """(latencies in s of the answered requests, failures, wall seconds): ``concurrency``
    clients send ``bodies``; a non-200 answer, an error or no answer within ``timeout`` s
    is a failure (counted, so one bad request does not end the benchmark)."""
    latencies: list[float] = []
    failed = 0
    queue = list(bodies)
    limit = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(timeout=limit, headers=headers or {}) as session:

        async def client() -> None:
            nonlocal failed
            while queue:
                body = queue.pop()
                t0 = time.perf_counter()
                try:
                    async with session.post(url, json=body) as resp:
                        await resp.read()
                        ok = resp.status == 200
                except (aiohttp.ClientError, TimeoutError, OSError):
                    ok = False
                if ok:
                    latencies.append(time.perf_counter() - t0)
                else:
                    failed += 1

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return latencies, failed, time.perf_counter() - start


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile, nearest rank at or above ``q`` of the sorted values (NaN if none)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run(rounds: int, requests: int, concurrency: int, seed: int) -> dict[str, Any]:
    key = secrets.token_urlsafe(32)
    key_file = Path(tempfile.mkdtemp(prefix="pdwarden-gate-")) / c.WORKER_KEY_SECRET_KEY
    key_file.write_text(key)
    flags = serve_flags(inflight_deadline=60)
    with Fleet() as fleet:
        prefill = fleet.runtime(c.ROLE_PREFILL, extra=flags, worker_key_file=key_file)
        decode = fleet.runtime(c.ROLE_DECODE, extra=flags, worker_key_file=key_file)
        wait_healthy([prefill, decode], timeout=300)
        arms: dict[str, tuple[Router, dict[str, str]]] = {
            "direct": (fleet.router([prefill], [decode], api_key=key), auth_headers(key)),
            "gated": (fleet.router([prefill], [decode], worker_key_file=key_file), {}),
        }
        for router, headers in arms.values():
            wait_router(router, timeout=240, headers=headers)
        bodies = short_requests(requests, seed)
        figures: dict[str, dict[str, Any]] = {
            arm: {"latencies": [], "failed": 0, "seconds": 0.0, "rps": []} for arm in arms
        }
        for _ in range(rounds):
            for arm, (router, headers) in arms.items():
                lat, failed, seconds = asyncio.run(
                    send_round(f"{router.url}{c.GENERATE_PATH}", bodies, concurrency, headers)
                )
                f = figures[arm]
                f["latencies"] += lat
                f["failed"] += failed
                f["seconds"] += seconds
                f["rps"].append(len(lat) / seconds)
    ratios = [g / d for g, d in zip(figures["gated"]["rps"], figures["direct"]["rps"], strict=True)]
    result: dict[str, Any] = {
        "benchmark": "router-gate",
        "rounds": rounds,
        "requests_per_round": requests,
        "concurrency": concurrency,
    }
    for arm, f in figures.items():
        result[arm] = {
            "latency_p50_ms": round(1000 * percentile(f["latencies"], 0.5), 2),
            "latency_p99_ms": round(1000 * percentile(f["latencies"], 0.99), 2),
            "requests_per_second": round(len(f["latencies"]) / f["seconds"], 1),
            "requests_failed": f["failed"],
        }
    result["gated_over_direct_rps"] = round(statistics.median(ratios), 3)
    result["gated_over_direct_rps_min"] = round(min(ratios), 3)
    result["gated_over_direct_rps_max"] = round(max(ratios), 3)
    result["gate_added_p50_ms"] = round(
        result["gated"]["latency_p50_ms"] - result["direct"]["latency_p50_ms"], 2
    )
    return result


@click.command("router-gate")
@click.option("--rounds", type=click.IntRange(min=1), default=4, show_default=True, help="ABAB pairs.")
@click.option(
    "--requests", type=click.IntRange(min=1), default=300, show_default=True, help="Per round and arm."
)
@click.option("--concurrency", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--seed", type=int, default=20261202, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line on stdout.")
def router_gate(rounds: int, requests: int, concurrency: int, seed: int, as_json: bool) -> None:
    """The gate's cost per request: smg with clients holding the key vs smg behind the gate."""
    exit_on_sigterm()
    result = run(rounds, requests, concurrency, seed)
    if not as_json:
        for arm in ("direct", "gated"):
            click.echo(f"{arm:7} {result[arm]}", err=True)
    click.echo(json.dumps(result))

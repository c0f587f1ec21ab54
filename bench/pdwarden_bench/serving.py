"""`pdwarden bench serving`: what the hardening costs a request, through the project's router.

Three synthetic prefill/decode pairs run at once, each behind its own router (smg with the
operator's retry and breaker settings): hardened (``--hardening on``), stock (SGLang
0.5.23's NIXL classes untouched, ``--hardening off``) and stock_prompt_wake (stock whose
requests learn of a finished transfer at once, as hardened ones do, where stock's learn of
it at the status mirror's next copy, every 20 ms: ``--hardening bench-stock-prompt-wake``,
as in ``bench transfer``). hardened against stock is what a user switching gets; hardened
against stock_prompt_wake is what the hardening's own bookkeeping costs. Every process is up
before the first request. Each round sends the same seeded workload of short requests
(``--requests`` of 8 to 64 prompt tokens and 2 new tokens, ``--concurrency`` clients; the
``bench router-gate`` workload) through each arm's router in turn, the order reversed every
other round (ABC, CBA, ...) so no arm always goes first; a warm-up round of every arm comes
first and is not counted. A request fails on a non-200 answer, an error, or no answer within
its time limit; every wait has one too.

One JSON line: benchmark ("serving"), pairs, requests_per_round, concurrency, seed; per arm
(``hardened``, ``stock``, ``stock_prompt_wake``): latency_p50_ms and latency_p99_ms (over all
its answered requests), requests_per_second (the median of its rounds), requests_failed,
requests; hardened_over_stock_rps and hardened_over_stock_prompt_wake_rps (the medians of
the per-round ratios) each with _min and _max (their spread), seconds (the whole run). Exit
1 when a request failed (the line still printed).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import click

import pdwarden_contract as c
from pdwarden_bench.arms import (
    ARM_MODES,
    HARDENED,
    PROMPT_WAKE,
    STOCK,
    paired_ratios,
    ratio_summary,
    round_order,
)
from pdwarden_bench.gate_cost import percentile, send_round, short_requests
from pdwarden_localcluster.waits import WaitTimeout
from pdwarden_testkit.runtime_procs import (
    Fleet,
    Router,
    exit_on_sigterm,
    serve_flags,
    wait_healthy,
    wait_router,
)

# The arms, in their order in even rounds: name in the JSON -> the runtime's --hardening mode.
ARMS: Final = {arm: ARM_MODES[arm] for arm in (HARDENED, STOCK, PROMPT_WAKE)}
RATIO: Final = "hardened_over_stock_rps"
# Each paired ratio: key -> (numerator arm, denominator arm).
RATIOS: Final = {
    RATIO: (HARDENED, STOCK),
    "hardened_over_stock_prompt_wake_rps": (HARDENED, PROMPT_WAKE),
}
DEFAULT_PAIRS: Final = 8
DEFAULT_REQUESTS: Final = 400
DEFAULT_CONCURRENCY: Final = 8
DEFAULT_SEED: Final = 20261203
START_TIMEOUT_S: Final = 300.0
ROUTER_TIMEOUT_S: Final = 240.0
REQUEST_TIMEOUT_S: Final = 60.0


class BenchError(RuntimeError):
    """A part of the benchmark failed or ran out of time; the message names the part."""


@dataclass(frozen=True)
class RoundFigures:
    """One arm's round: its answered requests' latencies (s), failures and wall seconds."""

    latencies: tuple[float, ...]
    failed: int
    seconds: float

    @property
    def requests_per_second(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds > 0 else 0.0


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 2)


def arm_summary(rounds: Sequence[RoundFigures]) -> dict[str, Any]:
    """One arm's figures over its rounds (latency percentiles None when nothing answered)."""
    latencies = [lat for r in rounds for lat in r.latencies]
    return {
        "latency_p50_ms": _ms(percentile(latencies, 0.5) if latencies else None),
        "latency_p99_ms": _ms(percentile(latencies, 0.99) if latencies else None),
        "requests_per_second": round(statistics.median(r.requests_per_second for r in rounds), 1),
        "requests_failed": sum(r.failed for r in rounds),
        "requests": sum(len(r.latencies) + r.failed for r in rounds),
    }


def summarize(figures: dict[str, list[RoundFigures]]) -> dict[str, Any]:
    """Each arm's figures and the paired rate ratios' medians and spreads (figures[arm][i]:
    round i); a ratio is None when a round of its denominator answered nothing."""
    result: dict[str, Any] = {arm: arm_summary(figures[arm]) for arm in ARMS}
    for key, (top, bottom) in RATIOS.items():
        numerator = [r.requests_per_second for r in figures[top]]
        denominator = [r.requests_per_second for r in figures[bottom]]
        if denominator and all(rate > 0 for rate in denominator):
            result |= ratio_summary(key, paired_ratios(numerator, denominator))
        else:
            result |= {key: None, f"{key}_min": None, f"{key}_max": None}
    return result


def _progress(msg: str) -> None:
    print(f"serving: {msg}", file=sys.stderr, flush=True)


def _key_file(fleet: Fleet) -> Path:
    """A model's worker key, as the operator's Secret mounts it."""
    path = fleet.log_dir / "worker-key"
    path.write_text(secrets.token_urlsafe(32))
    path.chmod(0o400)
    return path


def _start(fleet: Fleet, front_door: bool) -> dict[str, Router]:
    """Every arm's pair and router, all up and routing before any is measured; with
    `front_door`, as the operator deploys a model by default: workers that require the model's
    worker key (and sign their side channel with it, where hardened), smg behind the gate."""
    key = _key_file(fleet) if front_door else None
    pairs = {
        arm: (
            fleet.runtime(
                c.ROLE_PREFILL, extra=serve_flags(hardening=mode, inflight_deadline=60), worker_key_file=key
            ),
            fleet.runtime(
                c.ROLE_DECODE, extra=serve_flags(hardening=mode, inflight_deadline=60), worker_key_file=key
            ),
        )
        for arm, mode in ARMS.items()
    }
    try:
        wait_healthy([rt for pair in pairs.values() for rt in pair], timeout=START_TIMEOUT_S)
    except (WaitTimeout, RuntimeError) as err:
        raise BenchError(f"runtimes: {err}") from None
    routers = {
        arm: fleet.router([prefill], [decode], worker_key_file=key)
        for arm, (prefill, decode) in pairs.items()
    }
    for arm, router in routers.items():
        try:
            wait_router(router, timeout=ROUTER_TIMEOUT_S)
        except (WaitTimeout, RuntimeError) as err:
            raise BenchError(f"{arm} router: {err}") from None
    return routers


def schedule(pairs: int) -> list[tuple[int, str]]:
    """(round, arm) in the order they run: round 0 warms the connections and every router's
    path up (not counted), then ``pairs`` rounds of every arm, ABC, CBA, ABC, ..."""
    return [(i, arm) for i in range(pairs + 1) for arm in round_order(list(ARMS), i)]


async def _rounds(
    routers: dict[str, Router], bodies: list[dict[str, Any]], pairs: int, concurrency: int
) -> dict[str, list[RoundFigures]]:
    figures: dict[str, list[RoundFigures]] = {arm: [] for arm in ARMS}
    for i, arm in schedule(pairs):
        url = f"{routers[arm].url}{c.GENERATE_PATH}"
        lat, failed, seconds = await send_round(url, bodies, concurrency, timeout=REQUEST_TIMEOUT_S)
        figure = RoundFigures(tuple(lat), failed, seconds)
        _progress(
            f"round {i}/{pairs}{' (warm-up)' if not i else ''} {arm}: "
            f"{figure.requests_per_second:.1f} req/s, {failed} failed"
        )
        if i:
            figures[arm].append(figure)
    return figures


def run(pairs: int, requests: int, concurrency: int, seed: int, front_door: bool = False) -> dict[str, Any]:
    """The benchmark's figures (the JSON line but seconds); BenchError names a failed part."""
    with Fleet() as fleet:
        t0 = time.perf_counter()
        try:
            routers = _start(fleet, front_door)
            _progress(f"{len(fleet.procs)} processes up in {time.perf_counter() - t0:.1f}s")
            figures = asyncio.run(_rounds(routers, short_requests(requests, seed), pairs, concurrency))
        finally:
            # A runtime serves on for a drain period after SIGTERM: signal all at once, so the
            # Fleet's one-by-one stop waits out one drain, not one per process.
            for proc in fleet.procs:
                proc.signal(signal.SIGTERM)
    return {
        "benchmark": "serving",
        "pairs": pairs,
        "requests_per_round": requests,
        "concurrency": concurrency,
        "seed": seed,
        "front_door": front_door,
        **summarize(figures),
    }


@click.command("serving")
@click.option(
    "--pairs",
    type=click.IntRange(min=1),
    default=DEFAULT_PAIRS,
    show_default=True,
    help="Rounds of the workload through each arm (ABC, CBA, ...), after a warm-up round.",
)
@click.option(
    "--requests",
    type=click.IntRange(min=1),
    default=DEFAULT_REQUESTS,
    show_default=True,
    help="Per round and arm.",
)
@click.option("--concurrency", type=click.IntRange(min=1), default=DEFAULT_CONCURRENCY, show_default=True)
@click.option("--seed", type=int, default=DEFAULT_SEED, show_default=True)
@click.option(
    "--front-door",
    is_flag=True,
    help="Every arm as a model runs by default: the worker key on the workers (the hardened arm "
    "signs its side channel with it) and smg behind the router gate.",
)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line on stdout.")
def serving(pairs: int, requests: int, concurrency: int, seed: int, front_door: bool, as_json: bool) -> None:
    """Short requests through the router: hardened vs stock runtimes (paired rounds, one run)."""
    exit_on_sigterm()
    t0 = time.perf_counter()
    _progress(f"{', '.join(ARMS)}: {requests} requests x {pairs} rounds each, {concurrency} clients")
    try:
        result = run(pairs, requests, concurrency, seed, front_door)
    except BenchError as err:
        raise click.ClickException(str(err)) from None
    result["seconds"] = round(time.perf_counter() - t0, 1)
    if not as_json:
        for arm in ARMS:
            _progress(f"{arm:8} {result[arm]}")
    print(json.dumps(result, sort_keys=True), flush=True)
    if any(result[arm]["requests_failed"] for arm in ARMS):
        sys.exit(1)

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

Each arm's round is followed by its streamed round, through the same router: ``--stream-requests``
streamed chats (OpenAI's ``/v1/chat/completions``, server-sent events; seeded prompts of 8 to 64
characters, ``--stream-tokens`` new tokens each), ``--concurrency`` clients, timed token by
token (``pdwarden_bench.streams``): time to first token (the first event carrying content) and
inter-token latency (the gaps between the next ones). Decode paces its tokens by
``--token-interval-ms`` (every arm alike; 0 by default, so the gaps are what the path adds to
tokens produced at once, and the short requests' figures stay comparable with earlier runs).
``--stream-requests 0`` leaves the streamed rounds out.

One JSON line: benchmark ("serving"), pairs, requests_per_round, concurrency, seed; per arm
(``hardened``, ``stock``, ``stock_prompt_wake``): latency_p50_ms and latency_p99_ms (over all
its answered requests), requests_per_second (the median of its rounds), requests_failed,
requests; hardened_over_stock_rps and hardened_over_stock_prompt_wake_rps (the medians of
the per-round ratios) each with _min and _max (their spread), seconds (the whole run). With
streamed rounds, also per arm: ttft_p50_ms, ttft_p99_ms, itl_p50_ms, itl_p99_ms (over all its
streams and gaps), stream_requests, stream_failed; hardened_over_stock_ttft_p50,
hardened_over_stock_ttft_p99, hardened_over_stock_itl_p50, hardened_over_stock_itl_p99 (the
medians of the per-round ratios of that percentile, hardened over stock), each with _min and
_max; and stream_requests_per_round, stream_tokens, token_interval_ms. The goals, from the
ratios: cpu_ms_per_request per arm (its prefill's and decode's CPU over its short requests'
rounds, per answered request: where an arm spends what it costs) and
hardened_over_stock_cpu_per_request; hardened_over_stock_p99 (the median of per-round p99
ratios, with its spread);
goal_met_rps (hardened_over_stock_rps >= 0.97 and its lowest round >= 0.93), goal_met_p99 (<= 1.1),
with streamed rounds goal_met_ttft_p99 (hardened_over_stock_ttft_p99 <= 1.1), and goal_met (all
of them). Exit 1 when a request or a stream failed (the line still printed).
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
import click
import psutil

import pdwarden_contract as c
from pdwarden_bench import streams
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
DEFAULT_STREAM_REQUESTS: Final = 64
DEFAULT_STREAM_TOKENS: Final = 16
# The streamed figures compared hardened over stock: key suffix -> (figure, quantile).
STREAM_FIGURES: Final = {
    "ttft_p50": ("ttft", 0.5),
    "ttft_p99": ("ttft", 0.99),
    "itl_p50": ("itl", 0.5),
    "itl_p99": ("itl", 0.99),
}
STREAM_RATIO_PREFIX: Final = "hardened_over_stock_"
# What the hardening may cost a request (issue goals, each a ratio of one run's paired rounds):
# the median rate ratio, its lowest round, the p99 latency ratio and, streamed, the p99 time to
# first token. Inter-token gaps are left out: with tokens produced at once they are microseconds
# of scheduling noise, not a cost of the path.
P99_RATIO: Final = "hardened_over_stock_p99"
CPU_RATIO: Final = "hardened_over_stock_cpu_per_request"
GOAL_RPS: Final = 0.97
GOAL_RPS_MIN: Final = 0.93
GOAL_P99: Final = 1.1
GOAL_TTFT_P99: Final = 1.1
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
    cpu_s: float | None = None  # the arm's prefill and decode processes' CPU during the round

    @property
    def requests_per_second(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class StreamFigures:
    """One arm's streamed round: each answered stream's time to first token, every gap
    between two tokens (s), the streams that failed, and how many were sent."""

    ttft: tuple[float, ...]
    itl: tuple[float, ...]
    failed: int
    requests: int

    def quantile(self, figure: str, q: float) -> float | None:
        values = list(self.ttft if figure == "ttft" else self.itl)
        return percentile(values, q) if values else None


def stream_bodies(n: int, seed: int, max_tokens: int) -> list[dict[str, Any]]:
    """``n`` seeded streamed chats: prompts of 8 to 64 characters, ``max_tokens`` new tokens."""
    rng = random.Random(seed)
    return [
        streams.chat_body("".join(rng.choice("abcdefgh ") for _ in range(rng.randint(8, 64))), max_tokens)
        for _ in range(n)
    ]


def stream_figures(answers: Sequence[streams.StreamAnswer], requests: int) -> StreamFigures:
    """A streamed round's figures from its answers (a stream counts when its [DONE] came)."""
    ttft: list[float] = []
    itl: list[float] = []
    for answer in answers:
        if answer.outcome != streams.OK:
            continue
        first, gaps = streams.first_token_and_gaps(answer.token_times)
        if first is not None:
            ttft.append(first)
        itl += gaps
    return StreamFigures(tuple(ttft), tuple(itl), sum(a.outcome != streams.OK for a in answers), requests)


async def stream_round(
    url: str, bodies: list[dict[str, Any]], concurrency: int, timeout: float = 60.0
) -> StreamFigures:
    """``concurrency`` clients stream ``bodies`` through ``url``, each read to its end."""
    queue = list(bodies)
    answers: list[streams.StreamAnswer] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client() -> None:
            while queue:
                answers.append(await streams.stream_chat(session, url, queue.pop(), timeout=timeout))

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return stream_figures(answers, len(bodies))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 2)


def cpu_ms_per_request(rounds: Sequence[RoundFigures]) -> float | None:
    """The arm's runtime CPU per answered request over its rounds (ms; None unmeasured)."""
    answered = sum(len(r.latencies) for r in rounds)
    if not answered or any(r.cpu_s is None for r in rounds):
        return None
    return round(sum(r.cpu_s or 0.0 for r in rounds) / answered * 1000, 3)


def arm_summary(rounds: Sequence[RoundFigures]) -> dict[str, Any]:
    """One arm's figures over its rounds (latency percentiles None when nothing answered)."""
    latencies = [lat for r in rounds for lat in r.latencies]
    return {
        "latency_p50_ms": _ms(percentile(latencies, 0.5) if latencies else None),
        "latency_p99_ms": _ms(percentile(latencies, 0.99) if latencies else None),
        "requests_per_second": round(statistics.median(r.requests_per_second for r in rounds), 1),
        "requests_failed": sum(r.failed for r in rounds),
        "requests": sum(len(r.latencies) + r.failed for r in rounds),
        "cpu_ms_per_request": cpu_ms_per_request(rounds),
    }


def stream_summary(rounds: Sequence[StreamFigures]) -> dict[str, Any]:
    """One arm's streamed figures over its rounds (percentiles None when nothing streamed)."""
    pooled = StreamFigures(
        tuple(v for r in rounds for v in r.ttft), tuple(v for r in rounds for v in r.itl), 0, 0
    )
    result: dict[str, Any] = {
        f"{key}_ms": _ms(pooled.quantile(figure, q)) for key, (figure, q) in STREAM_FIGURES.items()
    }
    result["stream_requests"] = sum(r.requests for r in rounds)
    result["stream_failed"] = sum(r.failed for r in rounds)
    return result


def stream_ratios(hardened: Sequence[StreamFigures], stock: Sequence[StreamFigures]) -> dict[str, Any]:
    """Each streamed percentile, hardened over stock: the median of the per-round ratios and
    its spread; None where a round of either arm lacks the figure or stock's is 0."""
    result: dict[str, Any] = {}
    for suffix, (figure, q) in STREAM_FIGURES.items():
        key = f"{STREAM_RATIO_PREFIX}{suffix}"
        tops = [value for r in hardened if (value := r.quantile(figure, q)) is not None]
        bottoms = [value for r in stock if (value := r.quantile(figure, q))]
        if hardened and len(tops) == len(hardened) == len(bottoms) == len(stock):
            result |= ratio_summary(key, paired_ratios(tops, bottoms))
        else:
            result |= {key: None, f"{key}_min": None, f"{key}_max": None}
    return result


def summarize(
    figures: dict[str, list[RoundFigures]], streamed: dict[str, list[StreamFigures]] | None = None
) -> dict[str, Any]:
    """Each arm's figures and the paired rate ratios' medians and spreads (figures[arm][i]:
    round i); a ratio is None when a round of its denominator answered nothing. ``streamed``:
    the streamed rounds, likewise (each arm's stream figures, the streamed ratios)."""
    result: dict[str, Any] = {arm: arm_summary(figures[arm]) for arm in ARMS}
    if streamed is not None:
        for arm in ARMS:
            result[arm] |= stream_summary(streamed[arm])
        result |= stream_ratios(streamed[HARDENED], streamed[STOCK])
    for key, (top, bottom) in RATIOS.items():
        numerator = [r.requests_per_second for r in figures[top]]
        denominator = [r.requests_per_second for r in figures[bottom]]
        if denominator and all(rate > 0 for rate in denominator):
            result |= ratio_summary(key, paired_ratios(numerator, denominator))
        else:
            result |= {key: None, f"{key}_min": None, f"{key}_max": None}
    result |= p99_ratio(figures[HARDENED], figures[STOCK])
    hardened_cpu, stock_cpu = (result[arm]["cpu_ms_per_request"] for arm in (HARDENED, STOCK))
    result[CPU_RATIO] = round(hardened_cpu / stock_cpu, 3) if hardened_cpu and stock_cpu else None
    return result | goals(result)


def p99_ratio(hardened: Sequence[RoundFigures], stock: Sequence[RoundFigures]) -> dict[str, Any]:
    """Hardened's p99 latency over stock's: the median of the per-round ratios and its spread
    (None where a round of either arm answered nothing)."""
    tops = [percentile(list(r.latencies), 0.99) for r in hardened if r.latencies]
    bottoms = [percentile(list(r.latencies), 0.99) for r in stock if r.latencies]
    if hardened and len(tops) == len(hardened) == len(bottoms) == len(stock) and all(bottoms):
        return ratio_summary(P99_RATIO, paired_ratios(tops, bottoms))
    return {P99_RATIO: None, f"{P99_RATIO}_min": None, f"{P99_RATIO}_max": None}


def goals(result: dict[str, Any]) -> dict[str, Any]:
    """goal_met from the ratios: hardened's rate >= GOAL_RPS of stock's (the lowest round >=
    GOAL_RPS_MIN), its p99 <= GOAL_P99 of stock's and, with streamed rounds, its p99 time to
    first token <= GOAL_TTFT_P99 of stock's; a missing ratio is a goal not met."""

    def at_least(key: str, goal: float) -> bool:
        return result.get(key) is not None and result[key] >= goal

    def at_most(key: str, goal: float) -> bool:
        return result.get(key) is not None and result[key] <= goal

    met = {
        "goal_met_rps": at_least(RATIO, GOAL_RPS) and at_least(f"{RATIO}_min", GOAL_RPS_MIN),
        "goal_met_p99": at_most(P99_RATIO, GOAL_P99),
    }
    ttft = f"{STREAM_RATIO_PREFIX}ttft_p99"
    if ttft in result:
        met["goal_met_ttft_p99"] = at_most(ttft, GOAL_TTFT_P99)
    return met | {"goal_met": all(met.values())}


def _progress(msg: str) -> None:
    print(f"serving: {msg}", file=sys.stderr, flush=True)


def _key_file(fleet: Fleet) -> Path:
    """A model's worker key, as the operator's Secret mounts it."""
    path = fleet.log_dir / "worker-key"
    path.write_text(secrets.token_urlsafe(32))
    path.chmod(0o400)
    return path


def _start(
    fleet: Fleet, front_door: bool, token_interval_ms: float = 0.0
) -> tuple[dict[str, Router], dict[str, tuple[int, ...]]]:
    """Every arm's pair and router, all up and routing before any is measured; with
    `front_door`, as the operator deploys a model by default: workers that require the model's
    worker key (and sign their side channel with it, where hardened), smg behind the gate;
    decode paced by `token_interval_ms`."""
    key = _key_file(fleet) if front_door else None
    pairs = {
        arm: (
            fleet.runtime(
                c.ROLE_PREFILL, extra=serve_flags(hardening=mode, inflight_deadline=60), worker_key_file=key
            ),
            fleet.runtime(
                c.ROLE_DECODE,
                extra=serve_flags(hardening=mode, inflight_deadline=60, token_interval_ms=token_interval_ms),
                worker_key_file=key,
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
    return routers, {arm: tuple(rt.proc.pid for rt in pair) for arm, pair in pairs.items()}


def cpu_seconds(pids: Sequence[int]) -> float | None:
    """The processes' CPU so far (user and system; None when one has ended)."""
    try:
        return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)
    except psutil.Error:
        return None


def schedule(pairs: int) -> list[tuple[int, str]]:
    """(round, arm) in the order they run: round 0 warms the connections and every router's
    path up (not counted), then ``pairs`` rounds of every arm, ABC, CBA, ABC, ..."""
    return [(i, arm) for i in range(pairs + 1) for arm in round_order(list(ARMS), i)]


async def _rounds(
    routers: dict[str, Router],
    pids: dict[str, tuple[int, ...]],
    bodies: list[dict[str, Any]],
    pairs: int,
    concurrency: int,
    streamed_bodies: list[dict[str, Any]],
) -> tuple[dict[str, list[RoundFigures]], dict[str, list[StreamFigures]]]:
    """Each arm's rounds, each followed by its streamed round (none without streamed bodies)."""
    figures: dict[str, list[RoundFigures]] = {arm: [] for arm in ARMS}
    streamed: dict[str, list[StreamFigures]] = {arm: [] for arm in ARMS}
    for i, arm in schedule(pairs):
        url = f"{routers[arm].url}{c.GENERATE_PATH}"
        cpu_before = cpu_seconds(pids[arm])
        lat, failed, seconds = await send_round(url, bodies, concurrency, timeout=REQUEST_TIMEOUT_S)
        cpu_after = cpu_seconds(pids[arm])
        cpu = cpu_after - cpu_before if cpu_before is not None and cpu_after is not None else None
        figure = RoundFigures(tuple(lat), failed, seconds, cpu)
        message = f"{figure.requests_per_second:.1f} req/s, {failed} failed"
        if streamed_bodies:
            chat_url = f"{routers[arm].url}{streams.CHAT_PATH}"
            stream = await stream_round(chat_url, streamed_bodies, concurrency, timeout=REQUEST_TIMEOUT_S)
            ttft = stream.quantile("ttft", 0.5)
            message += f"; streams: ttft p50 {_ms(ttft)} ms, {stream.failed} failed"
            if i:
                streamed[arm].append(stream)
        _progress(f"round {i}/{pairs}{' (warm-up)' if not i else ''} {arm}: {message}")
        if i:
            figures[arm].append(figure)
    return figures, streamed


def run(
    pairs: int,
    requests: int,
    concurrency: int,
    seed: int,
    front_door: bool = False,
    stream_requests: int = DEFAULT_STREAM_REQUESTS,
    stream_tokens: int = DEFAULT_STREAM_TOKENS,
    token_interval_ms: float = 0.0,
) -> dict[str, Any]:
    """The benchmark's figures (the JSON line but seconds); BenchError names a failed part."""
    streamed_bodies = stream_bodies(stream_requests, seed, stream_tokens)
    with Fleet() as fleet:
        t0 = time.perf_counter()
        try:
            routers, pids = _start(fleet, front_door, token_interval_ms)
            _progress(f"{len(fleet.procs)} processes up in {time.perf_counter() - t0:.1f}s")
            figures, streamed = asyncio.run(
                _rounds(routers, pids, short_requests(requests, seed), pairs, concurrency, streamed_bodies)
            )
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
        **summarize(figures, streamed if stream_requests else None),
        **(
            {
                "stream_requests_per_round": stream_requests,
                "stream_tokens": stream_tokens,
                "token_interval_ms": token_interval_ms,
            }
            if stream_requests
            else {}
        ),
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
@click.option(
    "--stream-requests",
    type=click.IntRange(min=0),
    default=DEFAULT_STREAM_REQUESTS,
    show_default=True,
    help="Streamed chats per round and arm, after each round (0: none).",
)
@click.option(
    "--stream-tokens",
    type=click.IntRange(min=2),
    default=DEFAULT_STREAM_TOKENS,
    show_default=True,
    help="New tokens of each streamed chat.",
)
@click.option(
    "--token-interval-ms",
    type=click.FloatRange(0, 1000),
    default=0.0,
    show_default=True,
    help="Decode's pace between two tokens, every arm alike.",
)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line on stdout.")
def serving(
    pairs: int,
    requests: int,
    concurrency: int,
    seed: int,
    front_door: bool,
    stream_requests: int,
    stream_tokens: int,
    token_interval_ms: float,
    as_json: bool,
) -> None:
    """Short requests through the router: hardened vs stock runtimes (paired rounds, one run)."""
    exit_on_sigterm()
    t0 = time.perf_counter()
    _progress(f"{', '.join(ARMS)}: {requests} requests x {pairs} rounds each, {concurrency} clients")
    try:
        result = run(
            pairs, requests, concurrency, seed, front_door, stream_requests, stream_tokens, token_interval_ms
        )
    except BenchError as err:
        raise click.ClickException(str(err)) from None
    result["seconds"] = round(time.perf_counter() - t0, 1)
    if not as_json:
        for arm in ARMS:
            _progress(f"{arm:8} {result[arm]}")
    print(json.dumps(result, sort_keys=True), flush=True)
    if any(result[arm]["requests_failed"] or result[arm].get("stream_failed") for arm in ARMS):
        sys.exit(1)

"""`pdwarden bench transfer`: what the hardening costs, and how far the path is from NIXL's best.

Three synthetic prefill/decode pairs (six processes) run at once and move the same request
(``--size`` bytes of KV in ``--chunk``-byte chunks) one after the other, so all see the same
machine load: stock (SGLang 0.5.23's NIXL classes untouched, ``--hardening off``), hardened
(``--hardening on``), and stock_prompt_wake (``--hardening bench-stock-prompt-wake``, a
bench-only mode: stock classes, but a room's status change wakes its waiting request at
once, as the hardened manager's status writes do; with off the request learns of it at the
StockMirror's next copy, every 20 ms). The figure is SGLang's own sender transfer latency
(first chunk enqueued -> the request's poll sees Success), so it includes that wake-up;
decode verifies every byte. Each pair round moves one request through every arm, the order
reversed every other round (ABC, CBA, ...); a ratio is taken within each round and the
median over rounds reported, with its min and max (the spread). raw: two bare NIXL agents
in two processes, both progressing, WRITE the same bytes as one large WRITE and as one
batched multi-descriptor WRITE; the better is NIXL's best here. Every part has a time limit
and fails with a message naming it.

One JSON line: size_bytes, chunk_bytes, pairs, raw_iters; stock_gbps, hardened_gbps,
stock_prompt_wake_gbps (each arm's median); hardened_over_stock,
stock_prompt_wake_over_stock, hardened_over_stock_prompt_wake (medians of the paired
ratios), each with _min and _max; raw_nixl_best_gbps, raw_nixl_large_gbps,
raw_nixl_batched_gbps, stock_over_raw_best (stock's median over raw best), seconds (the
whole run); raw_nixl_error instead of the raw figures (exit 1) when bare NIXL failed.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Final

import click

from pdwarden_bench.arms import (
    ARM_MODES,
    HARDENED,
    PROMPT_WAKE,
    STOCK,
    paired_ratios,
    ratio_summary,
    round_order,
)
from pdwarden_bench.pdclient import COMPLETED, Endpoint, new_session, pd_request
from pdwarden_testkit.ports import free_port
from pdwarden_testkit.runtime_procs import Fleet, Runtime, exit_on_sigterm, wait_healthy

_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
}
PAGE_TOKENS = 16
RAW_TIMEOUT_S = 120.0
START_TIMEOUT_S = 180.0
REQUEST_TIMEOUT_S = 90.0
DEFAULT_PAIRS: Final = 16
RAW_ITERS: Final = 3
# The arms, in their order in even rounds: name in the JSON -> the runtime's --hardening mode.
ARMS: Final = {arm: ARM_MODES[arm] for arm in (STOCK, HARDENED, PROMPT_WAKE)}
# Paired ratios reported: JSON key -> (numerator arm, denominator arm).
RATIOS: Final = {
    "hardened_over_stock": (HARDENED, STOCK),
    "stock_prompt_wake_over_stock": (PROMPT_WAKE, STOCK),
    "hardened_over_stock_prompt_wake": (HARDENED, PROMPT_WAKE),
}


class BenchError(RuntimeError):
    """A part of the benchmark failed or ran out of time; the message names the part."""


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise click.BadParameter(f"not a size: {text!r} (e.g. 256MiB, 4MiB)")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def summarize(rates: dict[str, list[float]]) -> dict[str, Any]:
    """Each arm's median GB/s and the paired ratios' medians and spreads (rates[arm][i]: round i)."""
    result: dict[str, Any] = {f"{arm}_gbps": round(statistics.median(rates[arm]), 3) for arm in ARMS}
    for key, (top, bottom) in RATIOS.items():
        result |= ratio_summary(key, paired_ratios(rates[top], rates[bottom]))
    return result


def raw_nixl(size: int, chunk: int, iters: int) -> dict[str, Any]:
    port = free_port()
    base = [sys.executable, "-m", "pdwarden_bench.raw_nixl"]
    limit = ["--timeout", str(RAW_TIMEOUT_S)]
    # The target outlives the initiator's limit, so it is there to confirm the bytes.
    target = subprocess.Popen(
        [*base, "target", "--port", str(port), "--size", str(size), "--timeout", str(RAW_TIMEOUT_S + 30)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        try:
            out = subprocess.run(
                [
                    *base,
                    "initiator",
                    "--port",
                    str(port),
                    "--size",
                    str(size),
                    "--chunk",
                    str(chunk),
                    "--iters",
                    str(iters),
                    *limit,
                ],
                capture_output=True,
                text=True,
                timeout=RAW_TIMEOUT_S + 30,
            )
        except subprocess.TimeoutExpired:
            raise BenchError(f"raw NIXL: no result within {RAW_TIMEOUT_S + 30:.0f}s") from None
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if not lines:
            raise BenchError(
                f"raw NIXL: the initiator printed nothing (rc={out.returncode}):\n{out.stderr[-2000:]}"
            )
        result: dict[str, Any] = json.loads(lines[-1])
        if "error" in result:
            raise BenchError(f"raw NIXL: {result['error']}")
        if not result.get("data_ok"):
            raise BenchError("raw NIXL: the target's buffer does not hold the written bytes")
        return result
    finally:
        target.kill()
        target.wait()


def _flags(size: int, chunk: int, hardening: str) -> list[str]:
    # One layer (a K and a V buffer); a chunk is one page of each: page = chunk / 2.
    pages = size // chunk
    return [
        "--hardening",
        hardening,
        "--layers",
        "1",
        "--page-bytes",
        str(chunk // 2),
        "--pool-pages",
        str(pages + 1),
        "--chunk-pages",
        "1",
        "--aux-slots",
        "4",
        "--page-size",
        str(PAGE_TOKENS),
        "--transfer-deadline",
        str(REQUEST_TIMEOUT_S),
    ]


async def _one(
    session: Any, pair: tuple[Runtime, Runtime], room: int, size: int, chunk: int, name: str
) -> float:
    prefill, decode = pair
    endpoint = Endpoint(prefill.url, decode.url, prefill.host, prefill.bootstrap_port)
    outcome, answer = await pd_request(
        session, endpoint, room, prompt_tokens=size // chunk * PAGE_TOKENS, timeout=REQUEST_TIMEOUT_S
    )
    if outcome != COMPLETED:
        raise BenchError(f"{name}: the transfer did not complete: {str(answer)[:300]}")
    meta = answer.get("prefill_meta_info") or {}
    seconds, moved = meta.get("kv_transfer_latency_s"), meta.get("kv_transfer_bytes")
    if not seconds or not moved:
        raise BenchError(f"{name}: prefill reported no transfer metric: {meta}")
    if moved < size:
        raise BenchError(f"{name}: prefill moved {moved} bytes, expected {size}")
    return float(moved / seconds / 1e9)


def runtime_paths(size: int, chunk: int, rounds: int) -> dict[str, list[float]]:
    """GB/s of each arm (ARMS) per round; every arm moves one request a round."""
    with Fleet() as fleet:
        pairs = {
            arm: (
                fleet.runtime("prefill", extra=_flags(size, chunk, flag)),
                fleet.runtime("decode", extra=_flags(size, chunk, flag)),
            )
            for arm, flag in ARMS.items()
        }
        t0 = time.perf_counter()
        try:
            wait_healthy([rt for pair in pairs.values() for rt in pair], timeout=START_TIMEOUT_S)
        except (TimeoutError, RuntimeError) as err:
            raise BenchError(f"runtimes: {err}") from None
        _progress(f"transfer: {len(pairs) * 2} runtimes healthy in {time.perf_counter() - t0:.1f}s")

        async def run() -> dict[str, list[float]]:
            rates: dict[str, list[float]] = {arm: [] for arm in pairs}
            async with new_session() as session:
                for i in range(rounds + 1):  # the first round warms the connections up
                    t1 = time.perf_counter()
                    for arm in round_order(list(pairs), i):
                        rate = await _one(session, pairs[arm], 4200 + 10 * i, size, chunk, arm)
                        if i:
                            rates[arm].append(rate)
                    _progress(
                        f"transfer: round {i}{' (warm-up)' if not i else ''} {time.perf_counter() - t1:.1f}s"
                    )
            return rates

        try:
            return asyncio.run(run())
        finally:
            # Each runtime serves on for a drain period after SIGTERM: signal all at once, so
            # the Fleet's one-by-one stop waits out one drain, not one per process.
            for proc in fleet.procs:
                proc.signal(signal.SIGTERM)


@click.command("transfer")
@click.option("--size", default="256MiB", show_default=True)
@click.option("--chunk", default="4MiB", show_default=True)
@click.option(
    "--pairs",
    "--iters",
    "pairs",
    type=click.IntRange(min=1),
    default=DEFAULT_PAIRS,
    show_default=True,
    help="Rounds of paired requests (one per arm each), after a warm-up round.",
)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line on stdout.")
def transfer(size: str, chunk: str, pairs: int, as_json: bool) -> None:
    """Stock SGLang vs hardened KV transfer (paired, same run), and bare NIXL's best."""
    exit_on_sigterm()
    total, piece = parse_size(size), parse_size(chunk)
    if piece <= 0 or total % piece or piece % 16:
        raise click.BadParameter("size must be a multiple of chunk, chunk a multiple of 16 bytes")
    t0 = time.perf_counter()
    try:
        _progress(
            f"transfer: {', '.join(ARMS)} pairs, {size} in {chunk} chunks, {pairs} rounds, order alternating"
        )
        rates = runtime_paths(total, piece, pairs)
    except BenchError as err:
        raise click.ClickException(str(err)) from None
    _progress(
        "transfer: GB/s per round: " + "; ".join(f"{arm} {[round(r, 3) for r in rates[arm]]}" for arm in ARMS)
    )
    stock = statistics.median(rates[STOCK])
    result: dict[str, Any] = {
        "size_bytes": total,
        "chunk_bytes": piece,
        "pairs": pairs,
        "raw_iters": RAW_ITERS,
        **summarize(rates),
    }
    _progress(f"transfer: raw NIXL (large and batched WRITE), {size}, x{RAW_ITERS}")
    try:
        raw = raw_nixl(total, piece, RAW_ITERS)
    except BenchError as err:  # the figures above still stand; say why this one is missing
        result |= {
            "raw_nixl_best_gbps": None,
            "stock_over_raw_best": None,
            "raw_nixl_error": str(err),
            "seconds": round(time.perf_counter() - t0, 1),
        }
        print(json.dumps(result, sort_keys=True), flush=True)
        sys.exit(1)
    raw_best = max(raw["large_gbps_median"], raw["batched_gbps_median"])
    result |= {
        "raw_nixl_best_gbps": round(raw_best, 3),
        "raw_nixl_large_gbps": round(raw["large_gbps_median"], 3),
        "raw_nixl_batched_gbps": round(raw["batched_gbps_median"], 3),
        "stock_over_raw_best": round(stock / raw_best, 3),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(result, sort_keys=True), flush=True)

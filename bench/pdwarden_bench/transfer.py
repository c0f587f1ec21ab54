"""`pdwarden bench transfer`: what the hardening costs, and how far the path is from NIXL's best.

stock vs hardened: two synthetic prefill/decode pairs (four processes) run at once, one
on SGLang 0.5.23's NIXL classes untouched (``--hardening off``), one hardened; they move
the same request (``--size`` bytes of KV in ``--chunk``-byte chunks) alternately, so both
see the same machine load. The figure is SGLang's own sender transfer latency (first chunk
enqueued -> Success); decode verifies every byte. raw: two bare NIXL agents in two
processes, both progressing, WRITE the same bytes as one large WRITE and as one batched
multi-descriptor WRITE; the better is NIXL's best here. Every part has a time limit and
fails with a message naming it. One JSON line: stock_gbps, hardened_gbps,
hardened_over_stock, raw_nixl_best_gbps, stock_over_raw_best, seconds (medians).
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import subprocess
import sys
import time
from typing import Any

import click

from pdwarden_bench.pdclient import COMPLETED, Endpoint, new_session, pd_request
from pdwarden_bench.ports import free_port
from pdwarden_bench.runtime_procs import Fleet, Runtime, exit_on_sigterm, wait_healthy

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


class BenchError(RuntimeError):
    """A part of the benchmark failed or ran out of time; the message names the part."""


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise click.BadParameter(f"not a size: {text!r} (e.g. 256MiB, 4MiB)")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def raw_nixl(size: int, chunk: int, iters: int) -> dict[str, Any]:
    port = free_port()
    base = [sys.executable, "-m", "pdwarden_runtime.transfer.raw_nixl"]
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


def runtime_paths(size: int, chunk: int, iters: int) -> dict[str, list[float]]:
    with Fleet() as fleet:
        pairs = {
            mode: (
                fleet.runtime("prefill", extra=_flags(size, chunk, flag)),
                fleet.runtime("decode", extra=_flags(size, chunk, flag)),
            )
            for mode, flag in (("stock", "off"), ("hardened", "on"))
        }
        try:
            wait_healthy([rt for pair in pairs.values() for rt in pair], timeout=START_TIMEOUT_S)
        except (TimeoutError, RuntimeError) as err:
            raise BenchError(f"runtimes: {err}") from None

        async def run() -> dict[str, list[float]]:
            rates: dict[str, list[float]] = {mode: [] for mode in pairs}
            async with new_session() as session:
                for i in range(iters + 1):  # the first round warms the connections up
                    order = list(pairs) if i % 2 == 0 else list(reversed(pairs))
                    for mode in order:
                        rate = await _one(session, pairs[mode], 4200 + 10 * i, size, chunk, mode)
                        if i:
                            rates[mode].append(rate)
            return rates

        return asyncio.run(run())


@click.command("transfer")
@click.option("--size", default="256MiB", show_default=True)
@click.option("--chunk", default="4MiB", show_default=True)
@click.option("--iters", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line on stdout.")
def transfer(size: str, chunk: str, iters: int, as_json: bool) -> None:
    """Stock SGLang vs hardened KV transfer (same run), and bare NIXL's best."""
    exit_on_sigterm()
    total, piece = parse_size(size), parse_size(chunk)
    if piece <= 0 or total % piece or piece % 16:
        raise click.BadParameter("size must be a multiple of chunk, chunk a multiple of 16 bytes")
    t0 = time.perf_counter()
    try:
        _progress(f"transfer: stock and hardened pairs, {size} in {chunk} chunks, x{iters} each, alternating")
        rates = runtime_paths(total, piece, iters)
    except BenchError as err:
        raise click.ClickException(str(err)) from None
    stock, hardened = statistics.median(rates["stock"]), statistics.median(rates["hardened"])
    result: dict[str, Any] = {
        "size_bytes": total,
        "chunk_bytes": piece,
        "iters": iters,
        "stock_gbps": round(stock, 3),
        "hardened_gbps": round(hardened, 3),
        "hardened_over_stock": round(hardened / stock, 3),
    }
    _progress(f"transfer: raw NIXL (large and batched WRITE), {size}, x{iters}")
    try:
        raw = raw_nixl(total, piece, iters)
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

"""`pdwarden bench transfer`: KV transfer throughput of the runtime vs bare NIXL.

runtime: a synthetic prefill and decode runtime (two processes, the hardened SGLang NIXL
path) move one request of ``--size`` bytes of KV in ``--chunk``-byte chunks; the figure is
SGLang's own sender transfer latency (first chunk enqueued -> Success), and decode
verifies every byte. raw: two bare NIXL agents in two processes WRITE the same bytes in
the same chunks, one after another. Both run in this invocation; one JSON line:
runtime_gbps, raw_nixl_gbps, ratio (medians of ``--iters`` runs).
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
from pdwarden_bench.runtime_procs import Fleet, exit_on_sigterm, free_port, wait_healthy

_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30,
          "kb": 10**3, "mb": 10**6, "gb": 10**9}
PAGE_TOKENS = 16


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
    target = subprocess.Popen([*base, "target", "--port", str(port), "--size", str(size)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        out = subprocess.run([*base, "initiator", "--port", str(port), "--size", str(size),
                              "--chunk", str(chunk), "--iters", str(iters)],
                             capture_output=True, text=True, timeout=300)
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if not lines:
            raise RuntimeError(f"raw NIXL run failed:\n{out.stderr[-2000:]}")
        result: dict[str, Any] = json.loads(lines[-1])
        return result
    finally:
        target.kill()
        target.wait()


def runtime_path(size: int, chunk: int, iters: int) -> dict[str, Any]:
    # One layer (a K and a V buffer); a chunk is one page of each: page = chunk / 2.
    page_bytes = chunk // 2
    pages = size // chunk
    flags = ["--layers", "1", "--page-bytes", str(page_bytes), "--pool-pages", str(pages + 1),
             "--chunk-pages", "1", "--aux-slots", "4", "--page-size", str(PAGE_TOKENS),
             "--transfer-deadline", "60"]
    with Fleet() as fleet:
        prefill, decode = fleet.runtime("prefill", extra=flags), fleet.runtime("decode", extra=flags)
        wait_healthy([prefill, decode])
        endpoint = Endpoint(prefill.url, decode.url, prefill.host, prefill.bootstrap_port)

        async def run() -> list[float]:
            rates = []
            async with new_session() as session:
                for i in range(iters + 1):  # the first one warms the connection up
                    outcome, answer = await pd_request(session, endpoint, 4200 + i,
                                                       prompt_tokens=pages * PAGE_TOKENS, timeout=300)
                    if outcome != COMPLETED:
                        raise RuntimeError(f"runtime transfer failed: {answer}")
                    meta = answer.get("prefill_meta_info") or {}
                    seconds, moved = meta.get("kv_transfer_latency_s"), meta.get("kv_transfer_bytes")
                    if not seconds or not moved:
                        raise RuntimeError(f"prefill reported no transfer metric: {meta}")
                    if moved < size:
                        raise RuntimeError(f"prefill moved {moved} bytes, expected {size}")
                    if i:
                        rates.append(moved / seconds / 1e9)
            return rates

        rates = asyncio.run(run())
        return {"gbps_median": statistics.median(rates), "gbps_best": max(rates), "iters": iters}


@click.command("transfer")
@click.option("--size", default="256MiB", show_default=True)
@click.option("--chunk", default="4MiB", show_default=True)
@click.option("--iters", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line on stdout.")
def transfer(size: str, chunk: str, iters: int, as_json: bool) -> None:
    """Runtime KV transfer throughput vs two bare NIXL agents (same sizes, same run)."""
    exit_on_sigterm()
    total, piece = parse_size(size), parse_size(chunk)
    if piece <= 0 or total % piece or piece % 16:
        raise click.BadParameter("size must be a multiple of chunk, chunk a multiple of 16 bytes")
    t0 = time.perf_counter()
    _progress(f"transfer: raw NIXL, {size} in {chunk} chunks x{iters}")
    raw = raw_nixl(total, piece, iters)
    _progress(f"transfer: runtime (synthetic prefill/decode), {size} in {chunk} chunks x{iters}")
    runtime = runtime_path(total, piece, iters)
    result = {
        "size_bytes": total, "chunk_bytes": piece, "iters": iters,
        "runtime_gbps": round(runtime["gbps_median"], 3), "raw_nixl_gbps": round(raw["gbps_median"], 3),
        "ratio": round(runtime["gbps_median"] / raw["gbps_median"], 3),
        "runtime_gbps_best": round(runtime["gbps_best"], 3), "raw_nixl_gbps_best": round(raw["gbps_best"], 3),
        "raw_data_ok": raw["data_ok"], "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(result, sort_keys=True), flush=True)

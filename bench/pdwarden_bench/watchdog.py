"""`pdwarden bench watchdog`: the cost of one watchdog scrape round over N runtime endpoints.

N simulated runtime pods are N real HTTP listeners on distinct loopback addresses
(127.0.200.1 ... in 127.0.200.0/21), all served by ONE helper process, so the measured
process is only the operator side: scrape (aiohttp, bounded concurrency, timeouts) + parse
(prometheus_client's parser) + history + wedge rule. Prints progress on stderr and one JSON
line last: seconds and CPU seconds per round, the operator side's RSS, and whether the goal
(N endpoints every 10 s within 0.25 core) is met.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import time
from typing import Any

import click

from pdwarden_operator.watchdog.history import Histories, Observation
from pdwarden_operator.watchdog.rule import judge
from pdwarden_operator.watchdog.scrape import Scraper, Target

BASE_PORT = 33100
MAX_ENDPOINTS = 2000  # 127.0.200.0/21 at 250 addresses per /24
GOAL_INTERVAL_S = 10.0
GOAL_CORES = 0.25


def endpoint_address(i: int) -> str:
    return f"127.0.{200 + i // 250}.{1 + i % 250}"


def runtime_body(n: int, inflight: int, transfers: int) -> bytes:
    """A body shaped like a runtime pod's: the watchdog's gauges among histogram and process noise."""
    lines = [
        "# HELP pdwarden_inflight_requests Requests holding KV in flight",
        "# TYPE pdwarden_inflight_requests gauge",
        f'pdwarden_inflight_requests{{role="prefill"}} {inflight}.0',
        "# HELP pdwarden_inflight_oldest_age_seconds Age of the oldest non-terminal room",
        "# TYPE pdwarden_inflight_oldest_age_seconds gauge",
        f'pdwarden_inflight_oldest_age_seconds{{role="prefill"}} {0.25 if inflight else 0}',
        "# HELP pdwarden_kv_rooms Rooms per status",
        "# TYPE pdwarden_kv_rooms gauge",
        *(
            f'pdwarden_kv_rooms{{role="prefill",state="{s}"}} 1.0'
            for s in ("Bootstrapping", "WaitingForInput", "Transferring", "Success", "Failed")
        ),
        "# HELP pdwarden_kv_transfers_total Finished rooms",
        "# TYPE pdwarden_kv_transfers_total counter",
        *(
            f'pdwarden_kv_transfers_total{{outcome="{o}",role="prefill"}} '
            f"{transfers if o == 'success' else 0}.0"
            for o in ("success", "failed", "aborted", "deadline")
        ),
        "# HELP pdwarden_kv_transfer_bytes_total Bytes moved",
        "# TYPE pdwarden_kv_transfer_bytes_total counter",
        f'pdwarden_kv_transfer_bytes_total{{role="prefill"}} {transfers * 1048576}.0',
        "# HELP pdwarden_kv_transfer_seconds Room start to terminal",
        "# TYPE pdwarden_kv_transfer_seconds histogram",
        *(
            f'pdwarden_kv_transfer_seconds_bucket{{le="{b}",role="prefill"}} {transfers}.0'
            for b in (
                "0.005",
                "0.01",
                "0.025",
                "0.05",
                "0.1",
                "0.25",
                "0.5",
                "1.0",
                "2.5",
                "5.0",
                "10.0",
                "+Inf",
            )
        ),
        f'pdwarden_kv_transfer_seconds_count{{role="prefill"}} {transfers}.0',
        f'pdwarden_kv_transfer_seconds_sum{{role="prefill"}} {transfers * 0.01:.3f}',
        "# HELP pdwarden_kv_status_writes_refused_total Writes the terminal-sticky rule refused",
        "# TYPE pdwarden_kv_status_writes_refused_total counter",
        'pdwarden_kv_status_writes_refused_total{from_state="Failed",role="prefill",'
        'to_state="Transferring"} 0.0',
        "# HELP pdwarden_runtime_info identity",
        "# TYPE pdwarden_runtime_info gauge",
        f'pdwarden_runtime_info{{engine="synthetic",pod="bench-{n}",transfer_backend="nixl",'
        'version="0.1.0"} 1.0',
        *(
            f"process_{k} {v}"
            for k, v in (
                ("virtual_memory_bytes", 1.2e9),
                ("resident_memory_bytes", 3.1e8),
                ("start_time_seconds", 1.79e9),
                ("cpu_seconds_total", 12.5),
                ("open_fds", 42.0),
                ("max_fds", 1048576.0),
            )
        ),
        *(f'python_gc_objects_collected_total{{generation="{g}"}} 1234.0' for g in (0, 1, 2)),
    ]
    return ("\n".join(lines) + "\n").encode()


# --- the helper process: N listeners, one event loop ----------------------------------------


async def _serve_endpoints(count: int, port: int) -> None:
    from aiohttp import web

    served = [0] * count

    def handler_for(i: int) -> Any:
        async def handle(_: web.Request) -> web.Response:
            served[i] += 1
            return web.Response(
                body=runtime_body(i, 3, 100 + 5 * served[i]), content_type="text/plain", charset="utf-8"
            )

        return handle

    runners = []
    for i in range(count):
        app = web.Application()
        app.router.add_get("/metrics", handler_for(i))
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, endpoint_address(i), port, backlog=64).start()
        runners.append(runner)
    print("READY", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for runner in runners:
        await runner.cleanup()


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def _measure(count: int, port: int, rounds: int, concurrency: int, timeout_s: float) -> dict[str, Any]:
    targets = [Target(f"pod-{i}", f"http://{endpoint_address(i)}:{port}/metrics") for i in range(count)]
    scraper = Scraper(concurrency=concurrency, timeout_seconds=timeout_s)
    histories = Histories(keep_seconds=150)
    per_round: list[tuple[float, float, int, int]] = []
    try:
        for r in range(rounds + 1):  # round 0 opens the connections; reported separately
            wall0, cpu0 = time.perf_counter(), time.process_time()
            results = await scraper.scrape(targets)
            now = time.monotonic()
            wedged = 0
            for res in results:
                history = histories.add(res.key, Observation(now, res.sample, res.error))
                wedged += judge(history.observations(), 120.0).wedged
            errors = sum(1 for res in results if res.sample is None)
            per_round.append((time.perf_counter() - wall0, time.process_time() - cpu0, errors, wedged))
            print(
                f"round {r}: {per_round[-1][0]:.3f}s wall, {per_round[-1][1]:.3f}s cpu, {errors} errors",
                file=sys.stderr,
                flush=True,
            )
    finally:
        await scraper.close()
    steady = per_round[1:]
    wall = sum(x[0] for x in steady) / len(steady)
    cpu = sum(x[1] for x in steady) / len(steady)
    return {
        "seconds_per_round": round(wall, 4),
        "cpu_seconds_per_round": round(cpu, 4),
        "first_round_seconds": round(per_round[0][0], 4),
        "first_round_cpu_seconds": round(per_round[0][1], 4),
        "errors": sum(x[2] for x in per_round),
        "wedged_verdicts": sum(x[3] for x in per_round),
        "operator_rss_mib": round(_rss_mib(), 1),
        "operator_max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "cores_at_10s_interval": round(cpu / GOAL_INTERVAL_S, 4),
    }


@click.command()
@click.option(
    "--endpoints",
    type=click.IntRange(1, MAX_ENDPOINTS),
    default=1000,
    show_default=True,
    help="simulated runtime pods (each its own loopback address)",
)
@click.option(
    "--rounds",
    type=click.IntRange(1, 100),
    default=5,
    show_default=True,
    help="measured rounds after one warm-up round",
)
@click.option("--concurrency", type=click.IntRange(1, 10000), default=100, show_default=True)
@click.option(
    "--timeout", "timeout_s", type=float, default=5.0, show_default=True, help="per-request timeout (seconds)"
)
@click.option("--port", type=click.IntRange(1024, 65535), default=BASE_PORT, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print only the JSON line on stdout")
def watchdog(
    endpoints: int, rounds: int, concurrency: int, timeout_s: float, port: int, as_json: bool
) -> None:
    """Cost of one watchdog scrape round over N endpoints (goal: 1,000 every 10 s within 0.25 core)."""
    print(f"starting {endpoints} endpoints on 127.0.200.0/21 port {port} ...", file=sys.stderr, flush=True)
    server = subprocess.Popen(
        [sys.executable, "-m", "pdwarden_bench.watchdog", "--serve-endpoints", str(endpoints), str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if line.strip() != "READY":
            raise click.ClickException(f"endpoint server failed to start (exit {server.poll()}): {line!r}")
        figures = asyncio.run(_measure(endpoints, port, rounds, concurrency, timeout_s))
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    result = {
        "benchmark": "watchdog",
        "endpoints": endpoints,
        "rounds": rounds,
        "concurrency": concurrency,
        **figures,
        "goal": f"{endpoints} endpoints every {GOAL_INTERVAL_S:g}s within {GOAL_CORES} core",
        "meets_goal": figures["cores_at_10s_interval"] <= GOAL_CORES
        and figures["seconds_per_round"] < GOAL_INTERVAL_S
        and figures["errors"] == 0,
        "cpu_count": os.cpu_count(),
    }
    if not as_json:
        for key, value in result.items():
            print(f"{key}: {value}", file=sys.stderr)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve-endpoints":
        asyncio.run(_serve_endpoints(int(sys.argv[2]), int(sys.argv[3])))
    else:
        watchdog()

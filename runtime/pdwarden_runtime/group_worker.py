"""A synthetic group's worker rank (node rank > 0): joins its leader and stays with it.

Like SGLang's non-zero ranks, a worker serves no requests and no KV: its HTTP port answers
``/health``, ``/health_generate`` and ``/ping`` (200 once it has joined its leader, 503
before), and its metrics port the contract's figures at zero (it never holds a transfer), so
the watchdog sees it as observed and idle. It exits with status 1 when its leader goes, so
that the group is started again as a whole.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

import pdwarden_contract as c
from pdwarden_runtime.group import GroupError, GroupOptions, Worker

log = logging.getLogger(__name__)


def worker_metrics(role: str, rank: int) -> bytes:
    """The contract's figures of a rank that holds no KV in flight."""
    registry = CollectorRegistry()
    labels = [c.LABEL_METRIC_ROLE]
    Gauge(c.METRIC_INFLIGHT_REQUESTS, "KV requests in flight", labels, registry=registry).labels(role).set(0)
    Gauge(c.METRIC_INFLIGHT_OLDEST_AGE, "Oldest room's age", labels, registry=registry).labels(role).set(0)
    transfers = Counter(
        c.METRIC_KV_TRANSFERS_BASE, "Finished rooms", [*labels, c.LABEL_METRIC_OUTCOME], registry=registry
    )
    for outcome in c.OUTCOMES:
        transfers.labels(role, outcome)
    info = Gauge(c.METRIC_RUNTIME_INFO, "Runtime identity", [*labels, "engine", "rank"], registry=registry)
    info.labels(role, "synthetic", str(rank)).set(1)
    return generate_latest(registry)


async def run_worker(role: str, host: str, port: int, metrics_port: int, options: GroupOptions) -> None:
    """Serve health and metrics, join the leader, and return only on SIGTERM/SIGINT; raises
    GroupError when the leader is unreachable or goes."""
    worker = Worker(options)
    body = worker_metrics(role, options.node_rank)

    async def health(request: web.Request) -> web.Response:
        if worker.joined and not worker.lost.done():
            return web.Response(text=f"rank {options.node_rank} joined")
        return web.Response(text=f"rank {options.node_rank} waiting for its leader", status=503)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    http = web.Application()
    for path in (c.HEALTH_PATH, c.HEALTH_GENERATE_PATH, "/ping"):
        http.router.add_get(path, health)
    http.router.add_get(c.METRICS_PATH, metrics)
    prom = web.Application()
    prom.router.add_get(c.METRICS_PATH, metrics)
    runners = []
    for app, bind in ((http, port), (prom, metrics_port)):
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host=host, port=bind, reuse_address=True).start()
        runners.append(runner)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        joining: asyncio.Future[Any] = asyncio.ensure_future(worker.join())
        stopped: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({joining, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if stopped in done:
            joining.cancel()
            return
        joining.result()  # raises GroupError when the leader stayed unreachable
        log.info("%s rank %d: joined %s", role, options.node_rank, options.dist_init_addr)
        lost: asyncio.Future[Any] = worker.lost
        await asyncio.wait({stopped, lost}, return_when=asyncio.FIRST_COMPLETED)
        if worker.lost.done() and not stop.is_set():
            raise GroupError(worker.lost.result())
    finally:
        await worker.close()
        for runner in runners:
            await runner.cleanup()

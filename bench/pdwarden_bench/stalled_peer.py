"""A stalled peer, end to end: stock SGLang 0.5.23 beside the hardened runtime.

Each pair is a synthetic prefill and decode (separate processes, NIXL over UCX with
``UCX_TLS=tcp,self``: a stopped target then stalls prefill's WRITEs, as a hung peer does on
RDMA). Under load, the decode process is frozen (SIGSTOP) for ``freeze`` seconds, then
resumed (SIGCONT). While it is frozen, prefill's rooms that wait for or move KV are
counted; after it resumes, the leftovers are settled and a batch of later requests is
sent, each page verified by decode.

Stock: its transfer worker stays in ``_await_handles`` while the peer is frozen (rooms
stay Transferring). Hardened: the handle deadline fails the stalled rooms, quarantines
their handles, the inflight queue drains within the deadline; decode is told only once
the quarantined writes ended, so no page a late write can reach is ever reused
(``pdwarden_kv_verify_failures_total`` stays 0). Every wait is bounded.

``--partition``: the decode stays alive and one of two prefills is cut off from the decodes'
KV instead (the local cluster, started if down; ``pdwarden_bench.partition``), once healed and
once remediated by the watchdog: pages freed while the writer still had quarantined handles
(goal 0), corrupted pages (0), pages held at most, and seconds from the writer's deletion to
the last held page freed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
import click

import pdwarden_contract as c
from pdwarden_bench.pdclient import COMPLETED, Endpoint, new_session, pd_request
from pdwarden_testkit.promtext import metric_sum, samples
from pdwarden_testkit.runtime_procs import Fleet, Runtime, exit_on_sigterm, serve_flags, wait_healthy

ENV: Final = {"UCX_TLS": "tcp,self"}
PROMPT_TOKENS: Final = 160  # 10 pages of 16 tokens: 5 chunks of 2 pages
LATER_REQUESTS: Final = 24
FREEZE_ATTEMPTS: Final = 5  # freezes tried until one catches a transfer in flight
STALL_CHECK_S: Final = 0.3  # after the SIGSTOP: is a room still moving KV?


def runtime_flags(transfer_deadline: float, hardening: str) -> list[str]:
    return serve_flags(
        hardening=hardening, pool_pages=512, transfer_deadline=transfer_deadline, inflight_deadline=120
    )


@dataclass
class PairRun:
    """What one pair did around the freeze."""

    stuck_at_resume: int = 0  # prefill rooms still waiting for / moving KV when decode resumed
    oldest_transferring_s: float = 0.0  # at resume: how long the oldest room sat in Transferring
    drained_after_s: float | None = None  # since then, no prefill room waited for/moved KV
    max_quarantined: int = 0
    deadline_failures: float = 0.0
    quarantined_left: int = 0
    corrupted_pages: float = 0.0
    later: list[str] = field(default_factory=list)
    leftover_rooms: dict[str, Any] = field(default_factory=dict)


def _moving(state: dict[str, Any]) -> int:
    rooms = state.get("rooms", {})
    return int(rooms.get("waiting_for_input", 0)) + int(rooms.get("transferring", 0))


async def _poll_state(rt: Runtime) -> dict[str, Any]:
    return await asyncio.get_running_loop().run_in_executor(None, rt.state)


async def _freeze_under_load(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    prefill: Runtime,
    decode: Runtime,
    rooms: Iterator[int],
    result: PairRun,
    *,
    freeze: float,
    concurrency: int,
    settle_timeout: float,
    last: bool,
) -> bool:
    """Freeze the decode while a room moves KV; False (and nothing recorded) when every room
    in flight had already finished at the freeze, so that there was nothing to stall: the
    kernel's socket buffers can take a whole small transfer just before the SIGSTOP lands."""
    stop_load = asyncio.Event()

    async def client() -> None:
        while not stop_load.is_set():
            await pd_request(
                session, endpoint, next(rooms), prompt_tokens=PROMPT_TOKENS, timeout=freeze + settle_timeout
            )

    load = [asyncio.ensure_future(client()) for _ in range(concurrency)]
    try:
        # under load: wait until a room is moving KV, then freeze the decode
        end = time.monotonic() + 30
        while _moving(await _poll_state(prefill)) == 0 and time.monotonic() < end:
            await asyncio.sleep(0.02)
        decode.proc.signal(signal.SIGSTOP)
        t0 = time.monotonic()
        stop_load.set()  # clients finish the requests they have in flight
        try:
            await asyncio.sleep(STALL_CHECK_S)
            state = await _poll_state(prefill)
            if not last and _moving(state) == 0 and not state.get("quarantined_handles"):
                return False
            # drained: no room waiting for or moving KV from then until the resume (a
            # first poll may fall between a room that just finished and the next one)
            drained_since: float | None = None
            while True:
                held = int(state.get("quarantined_handles", 0))
                result.max_quarantined = max(result.max_quarantined, held)
                if _moving(state) > 0:
                    drained_since = None
                elif drained_since is None:
                    drained_since = time.monotonic() - t0
                if time.monotonic() - t0 >= freeze:
                    break
                await asyncio.sleep(0.1)
                state = await _poll_state(prefill)
            state = await _poll_state(prefill)
            result.stuck_at_resume = _moving(state)
            result.drained_after_s = drained_since if result.stuck_at_resume == 0 else None
            ages = state.get("oldest_in_state", {})
            result.oldest_transferring_s = float(ages.get("transferring", 0.0))
        finally:
            decode.proc.signal(signal.SIGCONT)
        _, pending = await asyncio.wait(load, timeout=settle_timeout)
        if pending:
            raise TimeoutError(f"{len(pending)} clients still waiting {settle_timeout:.0f}s after SIGCONT")
        return True
    finally:
        stop_load.set()
        for task in load:
            task.cancel()
        await asyncio.gather(*load, return_exceptions=True)


async def run_pair(
    prefill: Runtime,
    decode: Runtime,
    *,
    freeze: float,
    concurrency: int,
    room_base: int,
    settle_timeout: float = 60.0,
) -> PairRun:
    endpoint = Endpoint(prefill.url, decode.url, prefill.host, prefill.bootstrap_port)
    result = PairRun()
    rooms = itertools.count(room_base)
    before = samples(prefill.metrics())
    async with new_session() as session:
        for attempt in range(1, FREEZE_ATTEMPTS + 1):
            if await _freeze_under_load(
                session,
                endpoint,
                prefill,
                decode,
                rooms,
                result,
                freeze=freeze,
                concurrency=concurrency,
                settle_timeout=settle_timeout,
                last=attempt == FREEZE_ATTEMPTS,
            ):
                break
        # later requests reuse the pages the stalled rooms held
        outcomes = await asyncio.gather(
            *(
                pd_request(
                    session, endpoint, next(rooms), prompt_tokens=PROMPT_TOKENS, timeout=settle_timeout
                )
                for _ in range(LATER_REQUESTS)
            )
        )
        result.later = [outcome for outcome, _ in outcomes]
    end = time.monotonic() + settle_timeout
    while True:
        state = await _poll_state(prefill)
        if (not state.get("rooms") and not state.get("quarantined_handles")) or time.monotonic() > end:
            break
        await asyncio.sleep(0.2)
    result.leftover_rooms = dict(state.get("rooms", {}))
    result.quarantined_left = int(state.get("quarantined_handles", 0))
    after = samples(prefill.metrics())
    result.deadline_failures = metric_sum(
        after, c.METRIC_KV_TRANSFERS_TOTAL, outcome="deadline"
    ) - metric_sum(before, c.METRIC_KV_TRANSFERS_TOTAL, outcome="deadline")
    result.corrupted_pages = metric_sum(samples(decode.metrics()), c.METRIC_KV_VERIFY_FAILURES_TOTAL)
    return result


def start_pair(fleet: Fleet, hardening: str, transfer_deadline: float) -> tuple[Runtime, Runtime]:
    flags = runtime_flags(transfer_deadline, hardening)
    return fleet.runtime("prefill", extra=flags, env=ENV), fleet.runtime("decode", extra=flags, env=ENV)


def _progress(message: str) -> None:
    print(f"stalled-peer: {message}", file=sys.stderr, flush=True)


@click.command("stalled-peer")
@click.option("--transfer-deadline", type=click.FloatRange(min=0.2), default=2.0, show_default=True)
@click.option("--concurrency", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option(
    "--partition",
    "partition_mode",
    is_flag=True,
    help="A prefill cut off from the decodes, decode alive (the local cluster): heal, then remediate.",
)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line on stdout.")
def stalled_peer(transfer_deadline: float, concurrency: int, partition_mode: bool, as_json: bool) -> None:
    """Freeze the decode mid-transfer for twice the transfer deadline: stock vs hardened."""
    exit_on_sigterm()
    if partition_mode:
        print(json.dumps(_partition_scenarios()))
        return
    t0 = time.monotonic()
    freeze = 2 * transfer_deadline
    with Fleet() as fleet:
        _progress("starting a stock and a hardened pair")
        stock = start_pair(fleet, "off", transfer_deadline)
        hardened = start_pair(fleet, "on", transfer_deadline)
        wait_healthy([*stock, *hardened], timeout=240)
        _progress(f"stock: freezing decode for {freeze:g}s under load")
        s = asyncio.run(run_pair(*stock, freeze=freeze, concurrency=concurrency, room_base=5_000_000))
        _progress(f"hardened: freezing decode for {freeze:g}s under load")
        h = asyncio.run(run_pair(*hardened, freeze=freeze, concurrency=concurrency, room_base=6_000_000))
    result = {
        "stock_inflight_stuck": s.stuck_at_resume,
        "stock_worker_blocked_seconds": round(s.oldest_transferring_s, 2),
        "hardened_inflight_stuck": h.stuck_at_resume,
        "hardened_rooms_failed_by_deadline": int(h.deadline_failures),
        "hardened_recovery_seconds": None if h.drained_after_s is None else round(h.drained_after_s, 2),
        "corrupted_pages": int(h.corrupted_pages + s.corrupted_pages),
        "quarantined_handles_left": h.quarantined_left,
        "hardened_max_quarantined": h.max_quarantined,
        "hardened_later_completed": h.later.count(COMPLETED),
        "later_requests": LATER_REQUESTS,
        "transfer_deadline": transfer_deadline,
        "seconds": round(time.monotonic() - t0, 1),
    }
    if not as_json:
        _progress(f"stock leftovers {s.leftover_rooms}, hardened leftovers {h.leftover_rooms}")
    print(json.dumps(result))


def _partition_scenarios() -> dict[str, Any]:
    """The partition (decode alive), healed and remediated, on the local cluster."""
    import os
    import tempfile
    import uuid
    from pathlib import Path

    from pdwarden_bench import partition
    from pdwarden_testkit.cluster_env import open_env

    t0 = time.monotonic()
    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig:
        from pdwarden_localcluster.cluster import ensure_up

        kubeconfig = str(ensure_up().kubeconfig)
    namespace = f"bench-cut-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory(prefix="pdwarden-bench-partition-") as tmp:
        envs = open_env(Path(kubeconfig), namespace, Path(tmp))
        env = next(envs)
        try:
            env.call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
            env.start_operator()
            runs = {m: partition.run(env, f"cut-{m}", m, _progress) for m in ("heal", "remediate")}
        finally:
            with contextlib.suppress(StopIteration):
                next(envs)  # stops the operator, deletes the namespace
    heal, fix = runs["heal"], runs["remediate"]
    return {
        "scenario": "partition",
        "decode_pages_freed_while_quarantined": heal.decode_pages_freed_while_quarantined
        + fix.decode_pages_freed_while_quarantined,
        "corrupted_pages": int(heal.corrupted_pages + fix.corrupted_pages),
        "held_pages_max": max(heal.held_pages_max, fix.held_pages_max),
        "pages_freed_after_remediation_seconds": fix.pages_freed_after_remediation_seconds,
        "pages_freed_after_heal_seconds": heal.pages_freed_after_heal_seconds,
        "freed_how": {"heal": heal.freed_how, "remediate": fix.freed_how},
        "requests_ok": heal.requests_ok + fix.requests_ok,
        "requests_failed": heal.requests_failed + fix.requests_failed,
        "partition_seconds": partition.PARTITION_S,
        "seconds": round(time.monotonic() - t0, 1),
    }

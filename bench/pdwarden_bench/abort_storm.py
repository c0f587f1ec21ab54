"""`pdwarden bench abort-storm`: many PD requests, a share of them abandoned mid-flight.

It starts a synthetic prefill and decode runtime (real processes, real NIXL), sends
``--requests`` requests through both legs as the router (smg) does, and disconnects
``--abort-ratio`` of them at a random point: the client (both legs, as through the
router) or, for ``--decode-abort-share`` of them, decode alone (prefill learns of it only
through SGLang's ABORT message, as in the emulated port's race). ``--transfer-abort-share`` of the
aborts happen inside the KV transfer phase (a long prompt spends much of its life there):
the client watches the prefill room (``GET /debug/room/{room}``) and disconnects once it
reads Transferring; the rest at a random point up to 1.5x the median latency.
The prefill runs the emulated port's race timing (``--fault emulated-maxstatus-port-race`` with a short
``--race-window``): a finished chunk's status write waits for an ABORT that lands in
that window. After the storm settles it counts rooms left non-terminal (wedged) and
refused status writes. ``--compare-legacy`` repeats the storm on the emulated NIXL port
(``--hardening emulated-port``: SGLang's old ``max()`` status rule) and reports its wedged rooms beside.

Prints one JSON line last: requests, completed, aborted, failed, wedged_rooms,
refused_writes, seconds [, legacy_wedged_rooms, legacy_refused_writes, legacy_seconds].
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any

import aiohttp
import click

import pdwarden_contract as contract
from pdwarden_bench.pdclient import ABORTED, COMPLETED, Endpoint, new_session, pd_request
from pdwarden_testkit.runtime_procs import Fleet, Runtime, exit_on_sigterm, wait_healthy

NON_TERMINAL = ("bootstrapping", "waiting_for_input", "transferring")
BOOTSTRAP_TIMEOUT_S = 5


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def runtime_flags(hardening: str, race_window: float | None, page_size: int, chunk_pages: int) -> list[str]:
    flags = [
        "--hardening",
        hardening,
        "--layers",
        "2",
        "--page-bytes",
        "4096",
        "--pool-pages",
        "4096",
        "--aux-slots",
        "1024",
        "--page-size",
        str(page_size),
        "--chunk-pages",
        str(chunk_pages),
        "--inflight-deadline",
        "600",
        "--transfer-deadline",
        "30",
    ]
    if race_window is not None:
        flags += ["--fault", contract.FAULT_EMULATED_PORT_RACE, "--race-window", str(race_window)]
    return flags


def wedged_rooms(prefill: Runtime, decode: Runtime) -> tuple[int, int, dict[str, Any]]:
    """(non-terminal rooms on both sides, refused writes on both sides, details)."""
    wedged, refused = 0, 0
    details: dict[str, Any] = {}
    for rt in (prefill, decode):
        state = rt.state()
        rooms = state.get("rooms", {})
        wedged += sum(rooms.get(s, 0) for s in NON_TERMINAL)
        refused += sum(state.get("refused", {}).values())
        details[rt.role] = {
            k: state.get(k)
            for k in (
                "rooms",
                "refused",
                "pending_requests",
                "free_pages",
                "transfer_infos",
                "staging_outstanding",
                "outcomes",
            )
        }
    return wedged, refused, details


TRANSFER_POLL_S = 0.002  # how often a client watching for the transfer phase looks


async def transferring(session: aiohttp.ClientSession, prefill_url: str, room: int) -> None:
    """Returns once the prefill room reads Transferring (a chunk is on its way)."""
    while True:
        async with session.get(f"{prefill_url}/debug/room/{room}") as resp:
            answer = await resp.json(content_type=None)
        if isinstance(answer, dict) and answer.get("status") == "transferring":
            return
        await asyncio.sleep(TRANSFER_POLL_S)


async def storm(
    endpoint: Endpoint,
    requests: int,
    abort_ratio: float,
    concurrency: int,
    seed: int,
    page_size: int,
    max_prompt_tokens: int,
    decode_abort_share: float,
    transfer_abort_share: float,
    settle: float,
    measure: Any,
) -> dict[str, Any]:
    rng = random.Random(seed)
    counts: dict[str, Any] = {"completed": 0, "aborted": 0, "failed": 0}
    detached: list[asyncio.Future[Any]] = []
    failures: list[Any] = []
    sem = asyncio.Semaphore(concurrency)
    latency = 0.02  # seconds; refined from the completed requests as the storm runs
    done_lat: list[float] = []

    # No connection cap (the semaphore bounds the load): prefill legs left hanging on
    # wedged rooms keep their sockets, as through a router, and must not starve new ones.
    async with new_session(limit=0) as session:

        async def one(i: int) -> None:
            nonlocal latency
            # Every draw happens here, before the first await, so both modes get the same
            # workload: rooms, sizes, which requests abort, how and how far in.
            room = rng.getrandbits(62)
            tokens = rng.randint(page_size, max_prompt_tokens)
            aborts = rng.random() < abort_ratio
            fraction = rng.random()
            decode_only = rng.random() < decode_abort_share
            in_transfer = rng.random() < transfer_abort_share
            async with sem:
                watch: asyncio.Future[Any] | None = None
                abort_after: float | asyncio.Future[Any] | None = None
                if aborts and in_transfer:
                    watch = asyncio.ensure_future(transferring(session, endpoint.prefill_url, room))
                    abort_after = watch
                elif aborts:
                    abort_after = fraction * 1.5 * latency
                t0 = time.perf_counter()
                try:
                    outcome, answer = await pd_request(
                        session,
                        endpoint,
                        room,
                        prompt_tokens=tokens,
                        abort_after=abort_after,
                        timeout=120,
                        decode_only_abort=decode_only,
                        detached=detached,
                    )
                finally:
                    if watch is not None:
                        watch.cancel()
                        await asyncio.gather(watch, return_exceptions=True)
                if outcome == COMPLETED:
                    done_lat.append(time.perf_counter() - t0)
                    if len(done_lat) % 50 == 0:
                        latency = sorted(done_lat[-200:])[len(done_lat[-200:]) // 2]
            key = "completed" if outcome == COMPLETED else "aborted" if outcome == ABORTED else "failed"
            counts[key] += 1
            if key == "failed" and len(failures) < 5:
                failures.append(answer)
            total = sum(counts.values())
            if total % max(1, requests // 10) == 0:
                _progress(f"  {total}/{requests} {counts}")

        await asyncio.gather(*(one(i) for i in range(requests)))
        # Prefill legs of decode-aborted requests end when prefill concludes the room;
        # the ones still hanging after the settle time sit on a wedged room.
        if detached:
            await asyncio.wait(detached, timeout=settle)
        counts["hung_prefill_requests"] = sum(1 for leg in detached if not leg.done())
        counts["measured"] = await asyncio.get_running_loop().run_in_executor(None, measure)
        for leg in detached:
            leg.cancel()
        await asyncio.gather(*detached, return_exceptions=True)
    if failures:
        _progress(f"  first failures: {failures}")
    return counts


def run_storm(
    hardening: str,
    requests: int,
    abort_ratio: float,
    concurrency: int,
    seed: int,
    race_window: float | None,
    settle: float,
    decode_abort_share: float,
    transfer_abort_share: float,
) -> dict[str, Any]:
    page_size, chunk_pages = 16, 2
    with Fleet() as fleet:
        flags = runtime_flags(hardening, race_window, page_size, chunk_pages)
        # A room whose decode never reached it is SGLang's bootstrap timeout's to end
        # (not a wedge); keep that timeout short so the settle time covers it.
        env = {"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": str(BOOTSTRAP_TIMEOUT_S)}
        prefill = fleet.runtime("prefill", extra=flags, env=env)
        decode = fleet.runtime("decode", extra=flags, env=env)
        _progress(f"abort-storm ({'hardened' if hardening == 'on' else 'legacy'}): starting runtimes")
        wait_healthy([prefill, decode])
        endpoint = Endpoint(prefill.url, decode.url, prefill.host, prefill.bootstrap_port)
        t0 = time.perf_counter()

        def measure() -> tuple[int, int, dict[str, Any]]:
            time.sleep(settle)  # let aborted rooms conclude (drain ACKs, last chunks)
            return wedged_rooms(prefill, decode)

        counts = asyncio.run(
            storm(
                endpoint,
                requests,
                abort_ratio,
                concurrency,
                seed,
                page_size,
                page_size * chunk_pages * 3,
                decode_abort_share,
                transfer_abort_share,
                settle,
                measure,
            )
        )
        seconds = time.perf_counter() - t0
        wedged, refused, details = counts.pop("measured")
        details["hung_prefill_requests"] = counts.pop("hung_prefill_requests")
        return {
            **counts,
            "wedged_rooms": wedged,
            "refused_writes": refused,
            "seconds": round(seconds, 2),
            "details": details,
        }


@click.command("abort-storm")
@click.option("--requests", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--abort-ratio", type=click.FloatRange(0, 1), default=0.3, show_default=True)
@click.option("--concurrency", type=click.IntRange(min=1), default=32, show_default=True)
@click.option(
    "--race-window",
    type=click.FloatRange(min=0),
    default=0.005,
    show_default=True,
    help="Seconds a finished chunk's status write waits for an ABORT (0: no race fault).",
)
@click.option(
    "--settle",
    type=click.FloatRange(min=0),
    default=8.0,
    show_default=True,
    help="Seconds to let aborted rooms conclude before counting wedged ones.",
)
@click.option("--seed", type=int, default=20261129, show_default=True)
@click.option(
    "--decode-abort-share",
    type=click.FloatRange(0, 1),
    default=0.5,
    show_default=True,
    help="Share of aborts where only decode aborts (prefill learns through SGLang's ABORT).",
)
@click.option(
    "--transfer-abort-share",
    type=click.FloatRange(0, 1),
    default=0.5,
    show_default=True,
    help="Share of aborts made once the prefill room reads Transferring (the rest: anywhere).",
)
@click.option(
    "--compare-legacy",
    is_flag=True,
    help="Also run the storm on the emulated NIXL port (max() status, no fix).",
)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line on stdout.")
def abort_storm(
    requests: int,
    abort_ratio: float,
    concurrency: int,
    race_window: float,
    settle: float,
    seed: int,
    decode_abort_share: float,
    transfer_abort_share: float,
    compare_legacy: bool,
    as_json: bool,
) -> None:
    """Abort storm against real prefill/decode runtimes; wedged rooms must stay 0."""
    exit_on_sigterm()
    window = race_window if race_window > 0 else None
    hardened = run_storm(
        "on",
        requests,
        abort_ratio,
        concurrency,
        seed,
        window,
        settle,
        decode_abort_share,
        transfer_abort_share,
    )
    result: dict[str, Any] = {
        "requests": requests,
        **{
            k: hardened[k]
            for k in ("completed", "aborted", "failed", "wedged_rooms", "refused_writes", "seconds")
        },
    }
    if compare_legacy:
        legacy = run_storm(
            "emulated-port",
            requests,
            abort_ratio,
            concurrency,
            seed,
            window,
            settle,
            decode_abort_share,
            transfer_abort_share,
        )
        result.update(
            {
                "legacy_wedged_rooms": legacy["wedged_rooms"],
                "legacy_refused_writes": legacy["refused_writes"],
                "legacy_completed": legacy["completed"],
                "legacy_aborted": legacy["aborted"],
                "legacy_failed": legacy["failed"],
                "legacy_seconds": legacy["seconds"],
            }
        )
        if not as_json:
            _progress(f"legacy details: {json.dumps(legacy['details'])}")
    if not as_json:
        _progress(f"hardened details: {json.dumps(hardened['details'])}")
    result["race_window_s"] = race_window
    print(json.dumps(result, sort_keys=True), flush=True)

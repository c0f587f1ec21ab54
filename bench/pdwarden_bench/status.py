"""`pdwarden bench status`: cost of a status write, sticky vs legacy, under thread contention.

Every thread drives its own rooms through a realistic lifecycle on ONE shared table (one
lock, as in the runtime): open(Bootstrapping), WaitingForInput, Transferring once per
chunk, Success, a straggler Transferring after Success (refused and counted in sticky
mode, absorbed by max() in legacy), clear. Every call counts as one status write.
``ns_per_update`` is wall time over all writes of all threads (aggregate cost under
contention). Prints one JSON line last.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from typing import Any

import click

from pdwarden_runtime.inflight import InflightTracker
from pdwarden_runtime.kvpoll import KVPoll
from pdwarden_runtime.status import RoomStatusTable

GOAL_NS_PER_UPDATE = 2000.0
GOAL_RATIO_TO_LEGACY = 1.5
VARIANTS = ("legacy", "sticky", "sticky+tracker")


def _writes_per_room(chunks: int) -> int:
    return 1 + 1 + chunks + 1 + 1 + 1  # open, W, T*chunks, S, straggler T, clear


def _drive(table: RoomStatusTable, base: int, rooms: int, chunks: int, barrier: threading.Barrier) -> None:
    open_, update, clear = table.open, table.update, table.clear
    B, W, T, S = KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success
    barrier.wait()
    for room in range(base, base + rooms):
        open_(room, B)
        update(room, W)
        for _ in range(chunks):
            update(room, T)
        update(room, S)
        update(room, T)  # the straggler chunk write after Success
        clear(room)


def run_round(variant: str, threads: int, rooms: int, chunks: int) -> dict[str, float]:
    table = RoomStatusTable("legacy" if variant == "legacy" else "sticky")
    if variant == "sticky+tracker":
        InflightTracker(table, deadline=300.0)
    barrier = threading.Barrier(threads + 1)
    workers = [
        threading.Thread(target=_drive, args=(table, index << 32, rooms, chunks, barrier))
        for index in range(threads)
    ]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.perf_counter_ns()
    for worker in workers:
        worker.join()
    elapsed_ns = time.perf_counter_ns() - started
    writes = threads * rooms * _writes_per_room(chunks)
    if variant != "legacy":  # sanity: the straggler writes were refused, one per room
        refused = table.refused()
        assert refused == {(KVPoll.Success, KVPoll.Transferring): threads * rooms}, refused
    return {"writes": writes, "seconds": elapsed_ns / 1e9, "ns_per_update": elapsed_ns / writes}


def measure(threads: int, rooms: int, chunks: int, rounds: int, progress: bool) -> dict[str, Any]:
    per_variant: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for index in range(rounds):
        for variant in VARIANTS:  # interleaved, so drift hits every variant alike
            per_variant[variant].append(run_round(variant, threads, rooms, chunks)["ns_per_update"])
        if progress:
            print(
                f"round {index + 1}/{rounds}: "
                + ", ".join(f"{v} {per_variant[v][-1]:.0f} ns" for v in VARIANTS),
                file=sys.stderr,
            )
    result: dict[str, Any] = {
        "benchmark": "status",
        "threads": threads,
        "rooms_per_thread": rooms,
        "chunks_per_room": chunks,
        "rounds": rounds,
        "writes_per_round": threads * rooms * _writes_per_room(chunks),
        "python": sys.version.split()[0],
    }
    for variant in VARIANTS:
        ns = statistics.median(per_variant[variant])
        key = variant.replace("+", "_")
        result[key] = {
            "ns_per_update": round(ns, 1),
            "updates_per_second": round(1e9 / ns),
            "ns_per_update_min": round(min(per_variant[variant]), 1),
            "ns_per_update_max": round(max(per_variant[variant]), 1),
        }
    sticky = result["sticky"]["ns_per_update"]
    legacy = result["legacy"]["ns_per_update"]
    result["sticky_over_legacy"] = round(sticky / legacy, 3)
    result["sticky_tracker_over_legacy"] = round(result["sticky_tracker"]["ns_per_update"] / legacy, 3)
    result["goal"] = {"ns_per_update_max": GOAL_NS_PER_UPDATE, "ratio_to_legacy_max": GOAL_RATIO_TO_LEGACY}
    result["goal_met"] = sticky <= GOAL_NS_PER_UPDATE and sticky / legacy <= GOAL_RATIO_TO_LEGACY
    return result


@click.command("status")
@click.option(
    "--threads",
    type=click.IntRange(1, 256),
    default=8,
    show_default=True,
    help="Threads writing to one shared table.",
)
@click.option(
    "--rooms",
    type=click.IntRange(1),
    default=2000,
    show_default=True,
    help="Rooms each thread drives through a lifecycle, per round.",
)
@click.option(
    "--chunks",
    type=click.IntRange(1),
    default=8,
    show_default=True,
    help="Transferring writes per room (one per KV chunk).",
)
@click.option(
    "--rounds",
    type=click.IntRange(1),
    default=5,
    show_default=True,
    help="Rounds per variant; the median is reported.",
)
@click.option("--json", "as_json", is_flag=True, help="Only the JSON line on stdout (progress on stderr).")
def status(threads: int, rooms: int, chunks: int, rounds: int, as_json: bool) -> None:
    """Status-write cost: sticky vs legacy under contention (one JSON line last)."""
    result = measure(threads, rooms, chunks, rounds, progress=True)
    if not as_json:
        for variant in ("legacy", "sticky", "sticky_tracker"):
            figures = result[variant]
            click.echo(
                f"{variant:>15}: {figures['ns_per_update']:8.1f} ns/update "
                f"({figures['updates_per_second']:,} updates/s)"
            )
        click.echo(f"sticky/legacy = {result['sticky_over_legacy']}; goal met: {result['goal_met']}")
    click.echo(json.dumps(result, sort_keys=True))

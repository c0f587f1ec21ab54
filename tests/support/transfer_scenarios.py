"""In-process transfer scenarios on SGLang's real NIXL classes (hardened, or the emulated
port), for the tests: each drives rooms of a loopback pair (``pdwarden_runtime.transfer.
loopback_pair``) through SGLang's sender/receiver API exactly as SGLang's schedulers do, and
the run prints one JSON line with what happened. Run as a subprocess from the repository root
(SGLang's threads never exit):

    python -m tests.support.transfer_scenarios roundtrip,race,stall --hardening on --port 31500
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from pdwarden_runtime.hardening import HardeningConfig
from pdwarden_runtime.hardening.config import ALL_FIXES, FAULT_EMULATED_PORT_RACE, NO_FIXES, FaultSwitch
from pdwarden_runtime.kvpoll import KVPoll
from pdwarden_runtime.transfer.loopback_pair import Pair, poll_until, terminal


def scenario_roundtrip(pair: Pair) -> dict[str, Any]:
    results = []
    for i in range(3):
        room = 1000 + i
        sender, recv, dst = pair.open_room(room, 8)
        src = pair.p_pool.take_pages(8)
        pair.p_pool.buffers[0].view(256, 4096)[src[0]] = 7 + i
        pair.p_pool.aux_view(room % 64).fill_(40 + i)
        sender.send(src[:4])
        sender.send(src[4:])
        poll_until(lambda s=sender, r=recv: bool(terminal(s.poll()) and terminal(r.poll())), 10)  # type: ignore[misc]
        ok = (
            int(pair.d_pool.buffers[0].view(256, 4096)[dst[0]][0]) == 7 + i
            and int(pair.d_pool.aux_view(room % 64)[0]) == 40 + i
        )
        results.append(
            {"prefill": KVPoll(sender.poll()).name, "decode": KVPoll(recv.poll()).name, "data_ok": ok}
        )
        sender.clear()
        recv.clear()
        pair.p_pool.give_pages(src)
        pair.d_pool.give_pages(dst)
    return {"rooms": results, **pair.rooms_summary()}


def scenario_race(pair: Pair) -> dict[str, Any]:
    """The emulated port's race: ABORT from decode lands between a chunk's completion and its
    Transferring write; then the last chunk is sent. Prefill polls only afterwards, as
    SGLang's inflight queue does."""
    pair.config.fault.set(FAULT_EMULATED_PORT_RACE)
    room = 4242
    sender, recv, _dst = pair.open_room(room, 8)
    src = pair.p_pool.take_pages(8)
    sender.send(src[:4])  # non-last chunk: the worker parks after it lands
    time.sleep(0.3)
    recv.abort()  # decode aborts: ABORT -> prefill's bootstrap thread
    sender.send(src[4:])  # the last chunk
    poll_until(lambda: terminal(sender.poll()), 3.0)
    prefill_state = KVPoll(sender.poll()).name
    decode_told = poll_until(
        lambda: pair.decode.pdwarden.table.get(room) is not None and room in pair.decode.failure_records, 1.0
    )
    return {
        "prefill_final": prefill_state,
        "decode_status": KVPoll(recv.poll()).name,
        "decode_failure_record": pair.decode.failure_records.get(room),
        "decode_told": decode_told,
        **pair.rooms_summary(),
    }


def scenario_stall(pair: Pair) -> dict[str, Any]:
    """Handles that never settle (a stalled peer): the room must fail within the
    transfer deadline and the worker must serve the next room."""
    pair.config.fault.set("stall-transfers")
    t0 = time.time()
    room = 5151
    sender, recv, _dst = pair.open_room(room, 4)
    src = pair.p_pool.take_pages(4)
    sender.send(src)
    concluded = poll_until(lambda: terminal(sender.poll()), pair.config.transfer_deadline + 5)
    stalled = {
        "prefill": KVPoll(sender.poll()).name,
        "decode": KVPoll(recv.poll()).name,
        "seconds": round(time.time() - t0, 2),
        "concluded": concluded,
    }
    # while the handle may still write (quarantined), decode must not hear its pages are free
    poll_until(lambda: terminal(recv.poll()), 1.0)
    stalled["decode_while_quarantined"] = KVPoll(recv.poll()).name
    stalled["quarantined"] = _quarantined(pair)
    pair.config.fault.set("none")  # the handle settles: now decode is told
    poll_until(lambda: terminal(recv.poll()), 5)
    stalled["decode_after"] = KVPoll(recv.poll()).name
    poll_until(lambda: _quarantined(pair) == 0, 5)
    stalled["quarantined_after"] = _quarantined(pair)
    # the next room goes to the same worker (same decode endpoint -> same queue shard)
    nxt, nrecv, _ndst = pair.open_room(room + 1, 4)
    nsrc = pair.p_pool.take_pages(4)
    nxt.send(nsrc)
    poll_until(lambda: terminal(nxt.poll()) and terminal(nrecv.poll()), 5)
    return {
        "stalled_room": stalled,
        "next_room": {"prefill": KVPoll(nxt.poll()).name, "decode": KVPoll(nrecv.poll()).name},
        **pair.rooms_summary(),
    }


def _quarantined(pair: Pair) -> int:
    return int(pair.prefill.pdwarden.quarantined_handles())


def scenario_prefill_abort(pair: Pair) -> dict[str, Any]:
    """Prefill aborts a room between chunks (AbortReq): does decode learn of it?"""
    room = 6161
    sender, recv, _dst = pair.open_room(room, 8)
    src = pair.p_pool.take_pages(8)
    sender.send(src[:4])
    poll_until(lambda: pair.prefill.pdwarden.ledger.idle(room), 2)
    time.sleep(0.1)
    sender.abort()
    told = poll_until(lambda: terminal(recv.poll()), 2.0)
    return {
        "decode_told": told,
        "decode_status": KVPoll(recv.poll()).name,
        "prefill_status": KVPoll(sender.poll()).name,
        **pair.rooms_summary(),
    }


def _roundtrip_once(pair: Pair, room: int) -> dict[str, str]:
    sender, recv, dst = pair.open_room(room, 4)
    src = pair.p_pool.take_pages(4)
    sender.send(src)
    poll_until(lambda: terminal(sender.poll()) and terminal(recv.poll()), 10)
    result = {"prefill": KVPoll(sender.poll()).name, "decode": KVPoll(recv.poll()).name}
    sender.clear()
    recv.clear()
    pair.p_pool.give_pages(src)
    pair.d_pool.give_pages(dst)
    return result


def _errors(mgr: Any) -> dict[str, float]:
    from pdwarden_contract import METRIC_RUNTIME_ERRORS_TOTAL

    found: dict[str, float] = {}
    for family in mgr.pdwarden.metrics.registry.collect():
        for sample in family.samples:
            if sample.name == METRIC_RUNTIME_ERRORS_TOTAL and sample.value:
                found[sample.labels["where"]] = sample.value
    return found


def scenario_hook_error(pair: Pair) -> dict[str, Any]:
    """pdwarden's bookkeeping raises inside a transfer worker (every hook, once each):
    the worker must live on and the room must still complete."""
    ledger = pair.prefill.pdwarden.ledger
    broken = ("dequeued", "chunk_done", "enqueued")
    originals = {name: getattr(ledger, name) for name in broken}

    def failing(name: str) -> Callable[..., Any]:
        def fail(*args: Any, **kwargs: Any) -> Any:
            setattr(ledger, name, originals[name])  # once
            raise RuntimeError(f"injected failure in RoomLedger.{name}")

        return fail

    for name in broken:
        setattr(ledger, name, failing(name))
    rooms = [_roundtrip_once(pair, 8100 + i) for i in range(3)]
    return {
        "rooms": rooms,
        "errors": _errors(pair.prefill),
        "threads_dead": {k: list(v) for k, v in pair.prefill.pdwarden.threads.dead().items()},
    }


def scenario_enqueue_popped(pair: Pair) -> dict[str, Any]:
    """A live room loses its transfer info before its chunk is enqueued: SGLang's
    add_transfer_request drops the chunk silently; the room must fail and decode be told."""
    room = 8200
    sender, recv, _dst = pair.open_room(room, 4)
    pair.prefill.transfer_infos.pop(room, None)
    src = pair.p_pool.take_pages(4)
    sender.send(src)
    concluded = poll_until(lambda: terminal(sender.poll()), 3)
    decode_told = poll_until(lambda: terminal(recv.poll()), 3)
    return {
        "concluded": concluded,
        "prefill": KVPoll(sender.poll()).name,
        "decode_told": decode_told,
        "decode": KVPoll(recv.poll()).name,
    }


class _PoisonChunk:
    """A queue item whose ``room`` raises: SGLang's worker reads it outside its try."""

    @property
    def room(self) -> int:
        raise SystemExit("injected: transfer worker ends")


def scenario_dead_worker(pair: Pair) -> dict[str, Any]:
    """One of SGLang's transfer workers dies: the thread watch must see it."""
    threads = pair.prefill.pdwarden.threads
    before = {"alive": threads.alive(), "expected": threads.expected()}
    queue = pair.prefill.transfer_queues[0]
    getattr(queue, "_inner", queue).put(_PoisonChunk())
    poll_until(lambda: "nixl_transfer_worker" in threads.dead(), 5)
    return {"before": before, "dead": {k: list(v) for k, v in threads.dead().items()}}


def scenario_prefill_vanished(pair: Pair) -> dict[str, Any]:
    """Decode published its pages; the prefill never sends (it stopped, or vanished): the
    decode room must fail by the deadline, and its poll must send the ABORT (the
    abort-and-drain release)."""
    room = 8300
    reaper = pair.prefill.pdwarden.reaper
    if reaper is not None:
        reaper.stop()  # this prefill goes silent: nothing of it will end the room
    t0 = time.time()
    _sender, recv, _dst = pair.open_room(room, 4)
    deadline = pair.config.inflight_deadline or 0.0
    concluded = poll_until(lambda: terminal(recv.poll()), deadline + 10)
    return {
        "concluded": concluded,
        "decode": KVPoll(recv.poll()).name,
        "seconds": round(time.time() - t0, 2),
        # the deadline's abort went to the prefill (its pages are held until it drains)
        "abort_notified": bool(getattr(recv, "abort_notified", False)),
        "still_marked": room in pair.decode.pdwarden.decode_deadline_rooms,
        "decode_outcomes": {k: v for k, v in pair.decode.pdwarden.tracker.outcomes().items() if v},
    }


def scenario_abort_before_metadata(pair: Pair) -> dict[str, Any]:
    """Decode gives up on a room before sending its metadata (its client left while it waited
    for KV pages): its ABORT must end the prefill room that waits for that metadata."""
    room = 8400
    recv = pair.receiver_cls(pair.decode, pair.addr, room)
    recv.init(prefill_dp_rank=0)
    sender = pair.sender_cls(pair.prefill, pair.addr, room)
    t0 = time.monotonic()
    recv.abort()
    failed = poll_until(lambda: sender.poll() == KVPoll.Failed, 3)
    return {
        "failed": failed,
        "seconds": round(time.monotonic() - t0, 2),
        "prefill": KVPoll(sender.poll()).name,
        "reason": pair.prefill.failure_records.get(room),
    }


def scenario_early_abort(pair: Pair) -> dict[str, Any]:
    """Decode's ABORT arrives before the prefill has the room at all (decode gave up before
    the prefill's request came in): the room must fail when the prefill opens it."""
    room = 8500
    recv = pair.receiver_cls(pair.decode, pair.addr, room)
    recv.init(prefill_dp_rank=0)
    recv.abort()
    time.sleep(0.3)  # the ABORT reaches the prefill's bootstrap thread first
    sender = pair.sender_cls(pair.prefill, pair.addr, room)
    failed = poll_until(lambda: sender.poll() == KVPoll.Failed, 2)
    return {
        "failed": failed,
        "prefill": KVPoll(sender.poll()).name,
        "reason": pair.prefill.failure_records.get(room),
    }


def scenario_bootstrap_deadline(pair: Pair) -> dict[str, Any]:
    """A prefill room whose decode leg never shows up (nothing tells the prefill): bounded by
    the inflight deadline (SGLang's own bootstrap timeout is 300 s)."""
    room = 8600
    sender = pair.sender_cls(pair.prefill, pair.addr, room)
    t0 = time.monotonic()
    bound = (pair.config.inflight_deadline or 0.0) + 5
    failed = poll_until(lambda: sender.poll() == KVPoll.Failed, bound)
    return {
        "failed": failed,
        "seconds": round(time.monotonic() - t0, 2),
        "bootstrap_timeout": pair.prefill.bootstrap_timeout,
        "outcomes": {k: v for k, v in pair.prefill.pdwarden.tracker.outcomes().items() if v},
    }


SCENARIOS: dict[str, Callable[[Pair], dict[str, Any]]] = {
    "abort-before-metadata": scenario_abort_before_metadata,
    "early-abort": scenario_early_abort,
    "bootstrap-deadline": scenario_bootstrap_deadline,
    "hook-error": scenario_hook_error,
    "enqueue-popped": scenario_enqueue_popped,
    "dead-worker": scenario_dead_worker,
    "prefill-vanished": scenario_prefill_vanished,
    "roundtrip": scenario_roundtrip,
    "race": scenario_race,
    "stall": scenario_stall,
    "prefill-abort": scenario_prefill_abort,
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("scenarios", help=f"comma-separated, run in order: {','.join(sorted(SCENARIOS))}")
    # Scenarios inject faults through pdwarden's classes: the control is the emulated port.
    ap.add_argument("--hardening", choices=["on", "emulated-port"], default="on")
    ap.add_argument("--port", type=int, required=True, help="SGLang bootstrap port (loopback)")
    ap.add_argument("--transfer-deadline", type=float, default=1.0)
    ap.add_argument("--inflight-deadline", type=float, default=None)
    args = ap.parse_args(argv)
    names = [n for n in args.scenarios.split(",") if n]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}")
    config = HardeningConfig(
        fixes=ALL_FIXES if args.hardening == "on" else NO_FIXES,
        transfer_deadline=args.transfer_deadline,
        inflight_deadline=args.inflight_deadline,
        fault=FaultSwitch("none"),
        race_window=5.0,
    )
    results: dict[str, Any] = {}
    try:
        pair = Pair(args.port, config)
        for name in names:
            config.fault.set("none")
            results[name] = SCENARIOS[name](pair)
            config.fault.set("none")
        results["ok"] = True
    except Exception as err:  # report, don't hang: SGLang's threads keep the process alive
        results.update({"ok": False, "error": f"{type(err).__name__}: {err}"})
    print(json.dumps(results, sort_keys=True), flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

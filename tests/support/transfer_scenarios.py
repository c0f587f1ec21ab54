"""In-process scenarios on SGLang's real NIXL classes (hardened or not), for tests.

A prefill and a decode KV manager live in one process (each with its own NIXL agent,
memory and threads, talking over loopback ZMQ/UCX as two pods would); each scenario drives
rooms through SGLang's sender/receiver API exactly as SGLang's schedulers do, and prints
one JSON line with what happened. Run as a subprocess from the repository root (SGLang's
threads never exit):

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

import numpy as np

from pdwarden_localcluster.testing import WaitTimeout, wait_for
from pdwarden_runtime.hardening import HardeningConfig, install
from pdwarden_runtime.hardening.config import ALL_FIXES, NO_FIXES, FaultSwitch
from pdwarden_runtime.kvpoll import KVPoll
from pdwarden_runtime.transfer.context import publish_sglang_context
from pdwarden_runtime.transfer.kvpool import KVPool, PoolShape

HOST = "127.0.0.1"


class Pair:
    """A hardened prefill manager, a hardened decode manager, and SGLang's bootstrap server."""

    def __init__(self, port: int, config: HardeningConfig) -> None:
        install(config)
        publish_sglang_context(host=HOST, bootstrap_port=port)
        from sglang.srt.disaggregation.utils import (
            DisaggregationMode,
            KVClassType,
            TransferBackend,
            get_kv_class,
        )

        def cls(kind: Any) -> Any:
            return get_kv_class(TransferBackend.NIXL, kind)

        self.sender_cls = cls(KVClassType.SENDER)
        self.receiver_cls = cls(KVClassType.RECEIVER)
        self.boot = cls(KVClassType.BOOTSTRAP_SERVER)(host=HOST, port=port)
        shape = PoolShape(layers=2, pages=256, page_bytes=4096)
        self.p_pool, self.d_pool = KVPool(shape), KVPool(shape)
        self.prefill = cls(KVClassType.MANAGER)(self.p_pool.kv_args(), DisaggregationMode.PREFILL, None)
        self.decode = cls(KVClassType.MANAGER)(self.d_pool.kv_args(), DisaggregationMode.DECODE, None)
        self.addr = f"{HOST}:{port}"
        deadline = time.time() + 30
        while not self.decode.try_ensure_parallel_info(self.addr):
            if time.time() > deadline:
                raise RuntimeError("decode never saw the prefill's bootstrap info")
            time.sleep(0.1)
        self.config = config

    def open_room(self, room: int, pages: int) -> tuple[Any, Any, np.ndarray]:
        recv = self.receiver_cls(self.decode, self.addr, room)
        recv.init(prefill_dp_rank=0)
        sender = self.sender_cls(self.prefill, self.addr, room)
        dst = self.d_pool.take_pages(pages)
        recv.send_metadata(dst, aux_index=room % 64)
        within(lambda: sender.poll() != KVPoll.Bootstrapping, 10)
        sender.init(pages, aux_index=room % 64)
        return sender, recv, dst

    def rooms_summary(self) -> dict[str, Any]:
        rt = self.prefill.pdwarden
        return {
            "prefill_rooms": {str(r): KVPoll(s).name for r, s in rt.table.snapshot().items()},
            "decode_rooms": {str(r): KVPoll(s).name
                             for r, s in self.decode.pdwarden.table.snapshot().items()},
            "refused": {f"{getattr(a, 'name', a)}->{b.name}": n for (a, b), n in rt.table.refused().items()},
            "outcomes": {k: v for k, v in rt.tracker.outcomes().items() if v},
            "transfer_infos": len(self.prefill.transfer_infos),
            "staging_outstanding": len(self.prefill._staging_outstanding),
            "handle_deadlines": rt.handle_deadlines,
            "failure_notices": rt.failure_notices,
            "skips_concluded": rt.silent_skips_concluded,
        }


def within(predicate: Callable[[], bool], timeout: float) -> bool:
    """Whether `predicate` came true within `timeout` (a scenario reports either outcome)."""
    try:
        wait_for(predicate, timeout, "a scenario's condition", 0.005, ())
    except WaitTimeout:
        return False
    return True


def terminal(value: Any) -> bool:
    return int(value) in (KVPoll.Success, KVPoll.Failed)


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
        within(lambda s=sender, r=recv: bool(terminal(s.poll()) and terminal(r.poll())), 10)  # type: ignore[misc]
        ok = int(pair.d_pool.buffers[0].view(256, 4096)[dst[0]][0]) == 7 + i and int(
            pair.d_pool.aux_view(room % 64)[0]) == 40 + i
        results.append({"prefill": KVPoll(sender.poll()).name, "decode": KVPoll(recv.poll()).name,
                        "data_ok": ok})
        sender.clear()
        recv.clear()
        pair.p_pool.give_pages(src)
        pair.d_pool.give_pages(dst)
    return {"rooms": results, **pair.rooms_summary()}


def scenario_race(pair: Pair) -> dict[str, Any]:
    """The seed's race: ABORT from decode lands between a chunk's completion and its
    Transferring write; then the last chunk is sent. Prefill polls only afterwards, as
    SGLang's inflight queue does."""
    pair.config.fault.set("legacy-status-race")
    room = 4242
    sender, recv, _dst = pair.open_room(room, 8)
    src = pair.p_pool.take_pages(8)
    sender.send(src[:4])  # non-last chunk: the worker parks after it lands
    time.sleep(0.3)
    recv.abort()  # decode aborts: ABORT -> prefill's bootstrap thread
    sender.send(src[4:])  # the last chunk
    within(lambda: terminal(sender.poll()), 3.0)
    prefill_state = KVPoll(sender.poll()).name
    decode_told = within(lambda: pair.decode.pdwarden.table.get(room) is not None
                           and room in pair.decode.failure_records, 1.0)
    return {"prefill_final": prefill_state, "decode_status": KVPoll(recv.poll()).name,
            "decode_failure_record": pair.decode.failure_records.get(room), "decode_told": decode_told,
            **pair.rooms_summary()}


def scenario_stall(pair: Pair) -> dict[str, Any]:
    """Handles that never settle (a stalled peer): the room must fail within the
    transfer deadline and the worker must serve the next room."""
    pair.config.fault.set("stall-transfers")
    t0 = time.time()
    room = 5151
    sender, recv, _dst = pair.open_room(room, 4)
    src = pair.p_pool.take_pages(4)
    sender.send(src)
    concluded = within(lambda: terminal(sender.poll()), pair.config.transfer_deadline + 5)
    stalled = {"prefill": KVPoll(sender.poll()).name, "decode": KVPoll(recv.poll()).name,
               "seconds": round(time.time() - t0, 2), "concluded": concluded}
    within(lambda: terminal(recv.poll()), 2)
    stalled["decode_after"] = KVPoll(recv.poll()).name
    pair.config.fault.set("none")
    # the next room goes to the same worker (same decode endpoint -> same queue shard)
    nxt, nrecv, _ndst = pair.open_room(room + 1, 4)
    nsrc = pair.p_pool.take_pages(4)
    nxt.send(nsrc)
    within(lambda: terminal(nxt.poll()) and terminal(nrecv.poll()), 5)
    return {"stalled_room": stalled,
            "next_room": {"prefill": KVPoll(nxt.poll()).name, "decode": KVPoll(nrecv.poll()).name},
            **pair.rooms_summary()}


def scenario_prefill_abort(pair: Pair) -> dict[str, Any]:
    """Prefill aborts a room between chunks (AbortReq): does decode learn of it?"""
    room = 6161
    sender, recv, _dst = pair.open_room(room, 8)
    src = pair.p_pool.take_pages(8)
    sender.send(src[:4])
    within(lambda: pair.prefill.pdwarden.ledger.idle(room), 2)
    time.sleep(0.1)
    sender.abort()
    told = within(lambda: terminal(recv.poll()), 2.0)
    return {"decode_told": told, "decode_status": KVPoll(recv.poll()).name,
            "prefill_status": KVPoll(sender.poll()).name, **pair.rooms_summary()}


SCENARIOS: dict[str, Callable[[Pair], dict[str, Any]]] = {
    "roundtrip": scenario_roundtrip,
    "race": scenario_race,
    "stall": scenario_stall,
    "prefill-abort": scenario_prefill_abort,
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("scenarios", help=f"comma-separated, run in order: {','.join(sorted(SCENARIOS))}")
    ap.add_argument("--hardening", choices=["on", "off"], default="on")
    ap.add_argument("--port", type=int, required=True, help="SGLang bootstrap port (loopback)")
    ap.add_argument("--transfer-deadline", type=float, default=1.0)
    args = ap.parse_args(argv)
    names = [n for n in args.scenarios.split(",") if n]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}")
    config = HardeningConfig(fixes=ALL_FIXES if args.hardening == "on" else NO_FIXES,
                             transfer_deadline=args.transfer_deadline, inflight_deadline=None,
                             fault=FaultSwitch("none"), race_window=5.0)
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

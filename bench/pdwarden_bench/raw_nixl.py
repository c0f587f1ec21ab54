"""Two bare NIXL agents in two processes: NIXL's best on this machine, the transfer
benchmark's upper bound.

The target registers a DRAM buffer and hands its agent metadata and address to the
initiator over ZMQ (as SGLang's decode does in its registration message), then keeps
PROGRESSING its NIXL agent (``get_new_notifs``) until the initiator is done: when UCX
emulates RMA over TCP (``tcp/lo``), a target that only sleeps in a socket receive leaves
the WRITEs unfinished. The initiator writes ``size`` bytes per iteration in two shapes:
``large`` (one WRITE of one descriptor) and ``batched`` (one WRITE of ``size / chunk``
descriptors), and prints one JSON line. Every wait is bounded by ``--timeout``: on expiry
the process prints an error line and exits, it never hangs.

    python -m pdwarden_bench.raw_nixl target --port P --size N
    python -m pdwarden_bench.raw_nixl initiator --port P --size N --chunk C --iters K
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

SHAPES = ("large", "batched")


def _agent(name: str) -> Any:
    from nixl._api import nixl_agent, nixl_agent_config

    from pdwarden_runtime.transfer import nixl_progress

    nixl_progress.install()  # as the stock and hardened runtimes' agents
    return nixl_agent(name, nixl_agent_config(backends=["UCX"]))


def _fail(message: str) -> None:
    print(json.dumps({"error": message}), flush=True)
    os._exit(1)


def run_target(port: int, size: int, timeout: float) -> None:
    import torch
    import zmq

    end = time.monotonic() + timeout
    agent = _agent("pdwarden-raw-target")
    buf = torch.zeros(size, dtype=torch.uint8)
    agent.register_memory([(buf.data_ptr(), size, 0, "")], "DRAM")
    sock = zmq.Context().socket(zmq.REP)
    sock.bind(f"tcp://127.0.0.1:{port}")
    if not sock.poll(int(timeout * 1000)):
        _fail("target: no initiator came")
    sock.recv()
    sock.send_multipart([json.dumps({"ptr": buf.data_ptr()}).encode(), agent.get_agent_metadata()])
    # Progress NIXL while the initiator writes (a notification-polling target): over
    # TCP-emulated RMA a target that only sleeps in a socket receive never completes them.
    while not sock.poll(1):
        agent.get_new_notifs()
        if time.monotonic() > end:
            _fail(f"target: initiator not done after {timeout:.0f}s")
    sock.recv()
    sock.send(json.dumps({"last_byte": int(buf[-1]), "first_byte": int(buf[0])}).encode())
    # ZMQ sends from its I/O thread: flush (bounded) before the hard exit.
    context = sock.context
    sock.close(linger=10_000)
    context.term()
    os._exit(0)


def _write(agent: Any, local: Any, remote: Any, peer: str, end: float) -> None:
    handle = agent.initialize_xfer("WRITE", local, remote, peer)
    state = agent.transfer(handle)
    polls = 0
    while state == "PROC":
        if time.monotonic() > end:
            _fail("initiator: a WRITE is still in progress at the time limit")
        polls += 1
        if polls > 200:  # leave the CPU to the target's progress on a small machine
            time.sleep(0.0002)
        state = agent.check_xfer_state(handle)
    if state != "DONE":
        _fail(f"initiator: WRITE ended {state}")
    agent.release_xfer_handle(handle)


def run_initiator(port: int, size: int, chunk: int, iters: int, timeout: float) -> None:
    import torch
    import zmq

    if size % chunk:
        raise SystemExit(f"size {size} is not a multiple of chunk {chunk}")
    end = time.monotonic() + timeout
    agent = _agent("pdwarden-raw-initiator")
    src = torch.full((size,), 7, dtype=torch.uint8)
    agent.register_memory([(src.data_ptr(), size, 0, "")], "DRAM")
    sock = zmq.Context().socket(zmq.REQ)
    sock.connect(f"tcp://127.0.0.1:{port}")
    sock.send(b"hello")
    if not sock.poll(int(timeout * 1000)):
        _fail("initiator: the target never answered")
    info_raw, metadata = sock.recv_multipart()
    peer = agent.add_remote_agent(metadata)
    peer = peer.decode() if isinstance(peer, bytes) else peer
    dst = json.loads(info_raw)["ptr"]
    n = size // chunk
    shapes = {
        "large": (
            agent.get_xfer_descs([(src.data_ptr(), size, 0)], "DRAM"),
            agent.get_xfer_descs([(dst, size, 0)], "DRAM"),
        ),
        "batched": (
            agent.get_xfer_descs([(src.data_ptr() + i * chunk, chunk, 0) for i in range(n)], "DRAM"),
            agent.get_xfer_descs([(dst + i * chunk, chunk, 0) for i in range(n)], "DRAM"),
        ),
    }
    _write(agent, *shapes["large"], peer, end)  # warm-up: connection and registration caches
    rates: dict[str, list[float]] = {shape: [] for shape in SHAPES}
    for _ in range(iters):
        for shape in SHAPES:
            t0 = time.perf_counter()
            _write(agent, *shapes[shape], peer, end)
            rates[shape].append(size / (time.perf_counter() - t0) / 1e9)
    sock.send(b"done")
    if not sock.poll(30_000):
        _fail("initiator: the target did not confirm")
    check = json.loads(sock.recv())
    result = {f"{shape}_gbps_median": statistics.median(rates[shape]) for shape in SHAPES}
    result |= {f"{shape}_gbps_best": max(rates[shape]) for shape in SHAPES}
    result |= {"iters": iters, "data_ok": check["last_byte"] == 7 and check["first_byte"] == 7}
    print(json.dumps(result), flush=True)
    sys.stdout.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("role", choices=["target", "initiator"])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--chunk", type=int, default=4 << 20)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=45.0, help="seconds; the process exits after it")
    args = ap.parse_args(argv)
    if args.role == "target":
        run_target(args.port, args.size, args.timeout)
    else:
        run_initiator(args.port, args.size, args.chunk, args.iters, args.timeout)


if __name__ == "__main__":
    main()

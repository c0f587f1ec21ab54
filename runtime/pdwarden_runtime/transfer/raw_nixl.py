"""Two bare NIXL agents in two processes: the baseline the transfer benchmark compares to.

The target registers a DRAM buffer and hands its agent metadata and address to the
initiator over ZMQ (as SGLang's decode does in its registration message). The initiator
WRITEs ``size`` bytes as ``size / chunk`` transfers, one after the other, each awaited
before the next (what a transfer worker does per chunk), and prints one JSON line:

    python -m pdwarden_runtime.transfer.raw_nixl target --port P --size N
    python -m pdwarden_runtime.transfer.raw_nixl initiator --port P --size N --chunk C --iters K
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def _agent(name: str) -> object:
    from nixl._api import nixl_agent, nixl_agent_config

    return nixl_agent(name, nixl_agent_config(backends=["UCX"]))


def run_target(port: int, size: int) -> None:
    import torch
    import zmq

    agent = _agent("pdwarden-raw-target")
    buf = torch.zeros(size, dtype=torch.uint8)
    agent.register_memory([(buf.data_ptr(), size, 0, "")], "DRAM")  # type: ignore[attr-defined]
    sock = zmq.Context().socket(zmq.REP)
    sock.bind(f"tcp://127.0.0.1:{port}")
    sock.recv()
    sock.send_multipart([json.dumps({"ptr": buf.data_ptr()}).encode(),
                         agent.get_agent_metadata()])  # type: ignore[attr-defined]
    sock.recv()  # the initiator is done; check a byte it wrote and answer
    sock.send(json.dumps({"last_byte": int(buf[-1])}).encode())
    os._exit(0)


def run_initiator(port: int, size: int, chunk: int, iters: int) -> None:
    import torch
    import zmq

    if size % chunk:
        raise SystemExit(f"size {size} is not a multiple of chunk {chunk}")
    agent: object = _agent("pdwarden-raw-initiator")
    src = torch.full((size,), 7, dtype=torch.uint8)
    agent.register_memory([(src.data_ptr(), size, 0, "")], "DRAM")  # type: ignore[attr-defined]
    sock = zmq.Context().socket(zmq.REQ)
    sock.connect(f"tcp://127.0.0.1:{port}")
    sock.send(b"hello")
    info_raw, metadata = sock.recv_multipart()
    peer = agent.add_remote_agent(metadata)  # type: ignore[attr-defined]
    peer = peer.decode() if isinstance(peer, bytes) else peer
    dst = json.loads(info_raw)["ptr"]
    chunks = size // chunk
    local = [agent.get_xfer_descs([(src.data_ptr() + i * chunk, chunk, 0)], "DRAM")  # type: ignore[attr-defined]
             for i in range(chunks)]
    remote = [agent.get_xfer_descs([(dst + i * chunk, chunk, 0)], "DRAM")  # type: ignore[attr-defined]
              for i in range(chunks)]
    rates = []
    for _ in range(iters):
        t0 = time.perf_counter()
        for i in range(chunks):
            handle = agent.initialize_xfer("WRITE", local[i], remote[i], peer)  # type: ignore[attr-defined]
            state = agent.transfer(handle)  # type: ignore[attr-defined]
            while state == "PROC":
                state = agent.check_xfer_state(handle)  # type: ignore[attr-defined]
            if state != "DONE":
                raise SystemExit(f"raw NIXL transfer ended {state}")
            agent.release_xfer_handle(handle)  # type: ignore[attr-defined]
        rates.append(size / (time.perf_counter() - t0) / 1e9)
    sock.send(b"done")
    check = json.loads(sock.recv())
    print(json.dumps({"gbps_median": statistics.median(rates), "gbps_best": max(rates),
                      "iters": iters, "data_ok": check["last_byte"] == 7}), flush=True)
    sys.stdout.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("role", choices=["target", "initiator"])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--chunk", type=int, default=4 << 20)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args(argv)
    if args.role == "target":
        run_target(args.port, args.size)
    else:
        run_initiator(args.port, args.size, args.chunk, args.iters)


if __name__ == "__main__":
    main()

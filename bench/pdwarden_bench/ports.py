"""The one free-port helper of the benchmarks, the tests and the harnesses they share."""

from __future__ import annotations

import random
import socket

# Below the kernel's ephemeral range (32768-60999 by default): a port there can be taken at
# any moment by an outgoing connection's local end, so a process told to listen on it may
# find it busy at start.
PORT_RANGE = (31000, 31999)
_taken: set[int] = set()
# Not the `random` module's state: pytest-randomly reseeds that before every test, which
# would hand every test process the same sequence of ports.
_rng = random.SystemRandom()


def free_port(host: str = "127.0.0.1", lo: int = PORT_RANGE[0], hi: int = PORT_RANGE[1]) -> int:
    """A port in [lo, hi] that binds now on host and was not handed out before in this process."""
    for _ in range(500):
        port = _rng.randint(lo, hi)
        if port in _taken:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _taken.add(port)
        return port
    raise RuntimeError(f"no free port in {lo}-{hi} on {host}")

"""The one free-port helper of the benchmarks, the tests and the harnesses they share (and
its variant for a whole local cluster's ports)."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Iterable

# Below the kernel's ephemeral range (32768-60999 by default): a port there can be taken at
# any moment by an outgoing connection's local end, so a process told to listen on it may
# find it busy at start.
PORT_RANGE = (31000, 31999)
# "LO-HI" inside PORT_RANGE: this process's share of it, so that processes that hand out
# ports side by side (parallel test workers) never hand out the same one.
ENV_PORT_RANGE = "PDWARDEN_PORT_RANGE"
_taken: set[int] = set()
# Not the `random` module's state: pytest-randomly reseeds that before every test, which
# would hand every test process the same sequence of ports.
_rng = random.SystemRandom()


def port_range() -> tuple[int, int]:
    """PORT_RANGE, or this process's share of it from $PDWARDEN_PORT_RANGE."""
    given = os.environ.get(ENV_PORT_RANGE)
    if not given:
        return PORT_RANGE
    try:
        lo, hi = (int(part) for part in given.split("-"))
    except ValueError:
        raise ValueError(f"${ENV_PORT_RANGE} must be LO-HI, not {given!r}") from None
    if not PORT_RANGE[0] <= lo <= hi <= PORT_RANGE[1]:
        raise ValueError(f"${ENV_PORT_RANGE}={given} is not inside {PORT_RANGE[0]}-{PORT_RANGE[1]}")
    return lo, hi


def share_of_port_range(index: int, count: int) -> str:
    """The $PDWARDEN_PORT_RANGE value of share ``index`` of ``count`` equal shares."""
    size = (PORT_RANGE[1] - PORT_RANGE[0] + 1) // count
    lo = PORT_RANGE[0] + index * size
    return f"{lo}-{lo + size - 1}"


def _binds(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port in ``port_range()`` that binds now on host and was not handed out before in this
    process."""
    lo, hi = port_range()
    for _ in range(500):
        port = _rng.randint(lo, hi)
        if port in _taken:
            continue
        if not _binds(host, port):
            continue
        _taken.add(port)
        return port
    raise RuntimeError(f"no free port in {lo}-{hi} on {host}")


# Where a second local cluster's ports lie (base+249 to base+614 with 15 nodes): above the
# default cluster's (28249-28614, pdwarden_localcluster/cluster.py) and below PORT_RANGE, so
# that neither is handed out where another's processes listen, and all below the ephemeral range.
CLUSTER_PORT_RANGE = (28700, PORT_RANGE[0] - 1)


def port_bases(
    offsets: Iterable[int], lo: int = CLUSTER_PORT_RANGE[0], hi: int = CLUSTER_PORT_RANGE[1]
) -> list[int]:
    """Every base, a multiple of 100, that puts base + each offset inside [lo, hi]."""
    offsets = list(offsets)
    first = -(-(lo - min(offsets)) // 100) * 100
    return list(range(max(first, 0), hi - max(offsets) + 1, 100))


def free_port_base(offsets: Iterable[int], host: str = "127.0.0.1") -> int:
    """A base from ``port_bases(offsets)``, not handed out before in this process, such that
    base + each offset binds now on host."""
    offsets = list(offsets)
    bases = [b for b in port_bases(offsets) if b not in _taken]
    _rng.shuffle(bases)
    for base in bases:
        if all(_binds(host, base + off) for off in offsets):
            _taken.add(base)
            return base
    lo, hi = CLUSTER_PORT_RANGE
    raise RuntimeError(f"no port base with every offset {offsets} inside {lo}-{hi} and free on {host}")

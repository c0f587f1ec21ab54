"""Keep the kernel from handing a cluster's listening ports to outgoing connections.

The default port base keeps the cluster's ports below Linux's ephemeral range (32768-60999
by default), but a PDWARDEN_CLUSTER_PORT_BASE or a host's wider range can put them inside it.
There any client's connection (a watch, an etcd stream) can get one of them as its local port
and hold it for hours; a component that starts or restarts then cannot bind it (a kubelet
endpoint that never binds makes every `kubectl logs`/`exec` on its node fail). The host
network namespace's `net.ipv4.ip_local_reserved_ports` excludes ports from automatic
allocation while explicit binds still work: `up` adds the cluster's ports there, `down`
removes them again, leaving other entries (other clusters', the administrator's) as they were.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

SYSCTL = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# One lock for every cluster on the host: a read-modify-write of one kernel list.
LOCK = Path("/run/lock/pdwarden-reserved-ports.lock")


def parse(text: str) -> set[int]:
    """The ports of the sysctl's text: comma-separated ports and inclusive ranges ("a-b")."""
    found: set[int] = set()
    for part in text.replace("\n", ",").split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if not 0 < first <= last < 65536:
            raise ValueError(f"not a port or port range: {part!r}")
        found.update(range(first, last + 1))
    return found


def render(ports: Iterable[int]) -> str:
    """The sysctl's text for `ports`, runs of consecutive ports written as ranges."""

    def runs() -> Iterator[str]:
        ordered = sorted(set(ports))
        start = prev = None
        for port in ordered:
            if prev is not None and port == prev + 1:
                prev = port
                continue
            if start is not None:
                yield f"{start}-{prev}" if start != prev else str(start)
            start = prev = port
        if start is not None:
            yield f"{start}-{prev}" if start != prev else str(start)

    return ",".join(runs())


@contextmanager
def _locked() -> Iterator[None]:
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def ephemeral_range(sysctl: Path = EPHEMERAL_RANGE) -> tuple[int, int]:
    """The kernel's range of automatically allocated local ports (inclusive)."""
    low, high = sysctl.read_text().split()
    return int(low), int(high)


def reserved(sysctl: Path = SYSCTL) -> set[int]:
    return parse(sysctl.read_text())


def reserve(ports: Iterable[int], sysctl: Path = SYSCTL) -> None:
    """Add `ports` to the reserved ports. OSError if the kernel's list cannot be written."""
    with _locked():
        sysctl.write_text(render(reserved(sysctl) | set(ports)) + "\n")


def release(ports: Iterable[int], sysctl: Path = SYSCTL) -> None:
    """Remove `ports` from the reserved ports, keeping every other entry."""
    with _locked():
        current = reserved(sysctl)
        wanted = current - set(ports)
        if wanted != current:
            # a newline even for an empty list: the kernel ignores a write of no bytes
            sysctl.write_text(render(wanted) + "\n")

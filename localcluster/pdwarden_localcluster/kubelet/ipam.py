"""Pod IP allocation on loopback: 127.N.X.Y with X and Y in 1..254 (never 127.N.0.x).

N is 0 for the default cluster; another cluster on the same host (another port base) gets
its own N, so two clusters never hand out the same address.

Linux routes all of 127.0.0.0/8 to the loopback device, so every pod can bind its own
address. Allocation is round-robin so a just-freed address is not handed out again at once
(clients of the old pod and sockets in TIME_WAIT do not meet the new one).
"""

from __future__ import annotations

import threading

_SPAN = 254
CAPACITY = _SPAN * _SPAN


def index_to_ip(index: int, octet: int = 0) -> str:
    if not 0 <= index < CAPACITY:
        raise ValueError(f"pod IP index out of range: {index}")
    return f"127.{octet}.{1 + index // _SPAN}.{1 + index % _SPAN}"


def ip_to_index(ip: str, octet: int = 0) -> int | None:
    """Index of a pod IP this allocator could hand out, or None for any other address."""
    parts = ip.split(".")
    if len(parts) != 4 or parts[:2] != ["127", str(octet)] or not all(p.isdigit() for p in parts[2:]):
        return None
    x, y = int(parts[2]), int(parts[3])
    if not (1 <= x <= _SPAN and 1 <= y <= _SPAN):
        return None
    return (x - 1) * _SPAN + (y - 1)


class IpAllocator:
    def __init__(self, octet: int = 0) -> None:
        if not 0 <= octet <= 254:
            raise ValueError(f"second octet of pod IPs out of range: {octet}")
        self.octet = octet
        self._lock = threading.Lock()
        self._owner: dict[int, str] = {}
        self._cursor = 0

    def allocate(self, owner: str, preferred: str | None = None) -> str:
        """An address for `owner` (a pod uid); `preferred` (its previous IP) is kept if free."""
        with self._lock:
            for idx, who in self._owner.items():
                if who == owner:
                    return index_to_ip(idx, self.octet)
            pref = ip_to_index(preferred, self.octet) if preferred else None
            if pref is not None and pref not in self._owner:
                self._owner[pref] = owner
                return index_to_ip(pref, self.octet)
            for step in range(CAPACITY):
                idx = (self._cursor + step) % CAPACITY
                if idx not in self._owner:
                    self._owner[idx] = owner
                    self._cursor = (idx + 1) % CAPACITY
                    return index_to_ip(idx, self.octet)
        raise RuntimeError("no free pod IP on loopback (all 64516 addresses in use)")

    def release(self, owner: str) -> None:
        with self._lock:
            for idx in [i for i, who in self._owner.items() if who == owner]:
                del self._owner[idx]

    def in_use(self) -> dict[str, str]:
        with self._lock:
            return {index_to_ip(i, self.octet): who for i, who in self._owner.items()}

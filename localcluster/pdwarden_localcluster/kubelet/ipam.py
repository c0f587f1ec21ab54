"""Pod IP allocation from one node's subnet (its bridge holds the first address).

Allocation is round-robin so a just-freed address is not handed out again at once
(clients of the old pod and sockets in TIME_WAIT do not meet the new one).
"""

from __future__ import annotations

import ipaddress
import threading


class IpAllocator:
    def __init__(self, subnet: str) -> None:
        net = ipaddress.ip_network(subnet)
        # network address, the bridge (.1) and broadcast are never handed out
        self._hosts = [str(a) for a in net.hosts()][1:]
        if not self._hosts:
            raise ValueError(f"subnet {subnet} has no room for pods")
        self._index = {ip: i for i, ip in enumerate(self._hosts)}
        self.subnet = subnet
        self._lock = threading.Lock()
        self._owner: dict[int, str] = {}
        self._cursor = 0

    @property
    def capacity(self) -> int:
        return len(self._hosts)

    def allocate(self, owner: str, preferred: str | None = None) -> str:
        """An address for `owner` (a pod uid); `preferred` (its previous IP) is kept if free."""
        with self._lock:
            for idx, who in self._owner.items():
                if who == owner:
                    return self._hosts[idx]
            pref = self._index.get(preferred) if preferred else None
            if pref is not None and pref not in self._owner:
                self._owner[pref] = owner
                return self._hosts[pref]
            for step in range(self.capacity):
                idx = (self._cursor + step) % self.capacity
                if idx not in self._owner:
                    self._owner[idx] = owner
                    self._cursor = (idx + 1) % self.capacity
                    return self._hosts[idx]
        raise RuntimeError(f"no free pod IP in {self.subnet} (all {self.capacity} addresses in use)")

    def release(self, owner: str) -> None:
        with self._lock:
            for idx in [i for i, who in self._owner.items() if who == owner]:
                del self._owner[idx]

    def in_use(self) -> dict[str, str]:
        with self._lock:
            return {self._hosts[i]: who for i, who in self._owner.items()}

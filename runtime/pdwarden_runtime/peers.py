"""Per-peer transfer figures: rooms in flight and rooms concluded, per peer pod.

A peer is the other side of a room: on prefill the decode pod(s) its KV goes to, on
decode the prefill pod it comes from. Its identity is the peer's **IP address** as this
runtime knows it (on prefill the ``endpoint`` decode advertised in its transfer info; on
decode the host of the prefill's bootstrap address, which the router (smg) takes from the
prefill pod's IP): the operator maps it to a pod through ``status.podIP``, and it never
names anything a user sent.

Cardinality is bounded: at most ``max_peers`` peers have their own series, later ones are
counted under ``contract.PEER_OTHER``; a peer with no room in flight and no conclusion for
``forget_after`` seconds is forgotten (its series disappear, so a replaced pod's IP does
not keep a series forever; its counters restart from 0 if it comes back, which
Prometheus reads as a counter reset).

Rooms are bound to peers when the peer becomes known and unbound by the inflight tracker's
conclusion listener, which runs with the status table's lock held: this class takes only
its own lock and never calls the table.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from pdwarden_contract import OUTCOMES, PEER_OTHER

DEFAULT_MAX_PEERS: Final = 32
DEFAULT_FORGET_AFTER_S: Final = 600.0
# Rooms bound but never concluded (bound after their conclusion in a race) are dropped
# oldest first beyond this many, so a leak cannot grow without bound.
MAX_BOUND_ROOMS: Final = 65536


@dataclass
class _Peer:
    inflight: int = 0
    outcomes: dict[str, int] | None = None
    last_seen: float = 0.0

    def counts(self) -> dict[str, int]:
        if self.outcomes is None:
            self.outcomes = dict.fromkeys(OUTCOMES, 0)
        return self.outcomes


@dataclass(frozen=True)
class PeerSnapshot:
    inflight: dict[str, int]
    outcomes: dict[str, dict[str, int]]


class PeerCounters:
    """Thread-safe per-peer counts of one runtime's rooms."""

    def __init__(
        self,
        *,
        max_peers: int = DEFAULT_MAX_PEERS,
        forget_after: float = DEFAULT_FORGET_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_peers < 1:
            raise ValueError(f"max_peers must be >= 1, got {max_peers}")
        if not forget_after > 0:
            raise ValueError(f"forget_after must be > 0 seconds, got {forget_after!r}")
        self._max_peers = max_peers
        self._forget_after = forget_after
        self._clock = clock
        self._lock = threading.Lock()
        self._peers: dict[str, _Peer] = {}
        self._rooms: OrderedDict[int, tuple[str, ...]] = OrderedDict()

    def _label(self, peer: str) -> str:
        if peer in self._peers or len(self._peers) < self._max_peers or peer == PEER_OTHER:
            return peer
        return PEER_OTHER

    def bind(self, room: int, peers: Iterable[str]) -> None:
        """Room ``room`` moves KV with ``peers`` (call once, when they are known)."""
        names = tuple(sorted({p for p in peers if isinstance(p, str) and p}))
        if not names:
            return
        now = self._clock()
        with self._lock:
            if room in self._rooms:
                return
            labels = tuple(sorted({self._label(p) for p in names}))
            for label in labels:
                peer = self._peers.setdefault(label, _Peer())
                peer.inflight += 1
                peer.last_seen = now
            self._rooms[room] = labels
            while len(self._rooms) > MAX_BOUND_ROOMS:
                _, dropped = self._rooms.popitem(last=False)
                for label in dropped:
                    self._peers[label].inflight -= 1

    def concluded(self, room: int, outcome: str, seconds: float = 0.0) -> None:
        """The inflight tracker's conclusion listener (table lock held: own lock only)."""
        with self._lock:
            labels = self._rooms.pop(room, None)
            if labels is None:
                return
            now = self._clock()
            for label in labels:
                peer = self._peers[label]
                peer.inflight = max(0, peer.inflight - 1)
                counts = peer.counts()
                counts[outcome] = counts.get(outcome, 0) + 1
                peer.last_seen = now

    def snapshot(self) -> PeerSnapshot:
        """Per-peer figures; forgets peers idle longer than ``forget_after`` first."""
        now = self._clock()
        with self._lock:
            for label in [
                p
                for p, f in self._peers.items()
                if f.inflight == 0 and now - f.last_seen > self._forget_after
            ]:
                del self._peers[label]
            return PeerSnapshot(
                inflight={p: f.inflight for p, f in self._peers.items()},
                outcomes={p: dict(f.counts()) for p, f in self._peers.items()},
            )


def peer_of_address(address: str) -> str:
    """The host part of ``host:port`` (IPv6 in brackets too): the peer's identity."""
    address = address.strip()
    if address.startswith("["):
        return address[1:].split("]", 1)[0]
    host, sep, _port = address.rpartition(":")
    return host if sep else address

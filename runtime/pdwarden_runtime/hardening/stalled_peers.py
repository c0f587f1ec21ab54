"""Decode peers with quarantined handles (``transfer_deadline``).

A chunk for a decode peer whose earlier handle is quarantined would stall the same way and
hold its transfer worker for another full deadline, with rooms queued behind it. The
hardened manager fails such a chunk's room before anything is posted, until every
quarantined batch that named the peer has settled.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class StalledPeers:
    """Per decode peer (NIXL agent name), how many quarantined batches name it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batches_per_peer: dict[str, int] = {}
        # Per room, the peers of each of its quarantined batches, oldest first: the
        # quarantine reports a room's batches settled in the order they were added.
        self._room_batches: dict[int, list[list[str]]] = {}

    def quarantined(self, room: int, peers: Iterable[str]) -> None:
        batch = list(peers)
        with self._lock:
            self._room_batches.setdefault(room, []).append(batch)
            for peer in batch:
                self._batches_per_peer[peer] = self._batches_per_peer.get(peer, 0) + 1

    def settled(self, room: int) -> None:
        """The room's oldest quarantined batch settled: its peers' marks are lifted."""
        with self._lock:
            batches = self._room_batches.get(room) or [[]]
            for peer in batches.pop(0):
                left = self._batches_per_peer.get(peer, 0) - 1
                if left > 0:
                    self._batches_per_peer[peer] = left
                else:
                    self._batches_per_peer.pop(peer, None)
            if not batches:
                self._room_batches.pop(room, None)

    def stalled_among(self, peers: Iterable[str]) -> list[str]:
        with self._lock:
            return [peer for peer in peers if self._batches_per_peer.get(peer)]

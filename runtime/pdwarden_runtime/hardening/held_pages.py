"""Decode pages held for a writer: published to a prefill, their request ended, not yet free.

Once decode has sent a room's metadata, its prefill may write the room's pages at any time
until it says it has stopped (its drain ACK). If the request ends first (the client left,
a deadline), the pages are *held*: handing them to another request while a write can still
land would corrupt that request. This registry says which rooms are held, for which peer,
how many pages and since when, for the metrics (``pdwarden_kv_rooms_abandoned``,
``pdwarden_kv_pages_held``) and for the engine that must not free them.

Rooms enter at publication (``published``), become held when their request ends before the
transfer concluded (``hold``), and leave when their pages are freed or the room concludes
normally (``release``). Thread-safe; bounded (the oldest entries go first past ``MAX_ROOMS``
so a room never released cannot grow it without end).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

MAX_ROOMS: Final = 65536


@dataclass
class _Room:
    peer: str
    pages: int
    held_since: float | None = None


@dataclass(frozen=True)
class HeldRoom:
    room: int
    peer: str
    pages: int
    seconds: float


class HeldPages:
    """Published decode rooms and the ones among them held for their writer."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._rooms: OrderedDict[int, _Room] = OrderedDict()

    def published(self, room: int, peer: str, pages: int) -> None:
        """Decode sent the room's metadata: ``pages`` pages may be written by ``peer``."""
        with self._lock:
            self._rooms[room] = _Room(peer, max(0, int(pages)))
            self._rooms.move_to_end(room)
            while len(self._rooms) > MAX_ROOMS:
                self._rooms.popitem(last=False)

    def hold(self, room: int) -> None:
        """The room's request ended while its writer may still write: its pages are held."""
        with self._lock:
            entry = self._rooms.get(room)
            if entry is not None and entry.held_since is None:
                entry.held_since = self._clock()

    def release(self, room: int) -> None:
        """The room's pages are free again (drain ACK, proof the writer is gone, or the room
        concluded normally)."""
        with self._lock:
            self._rooms.pop(room, None)

    def is_held(self, room: int) -> bool:
        with self._lock:
            entry = self._rooms.get(room)
            return entry is not None and entry.held_since is not None

    def held(self) -> list[HeldRoom]:
        now = self._clock()
        with self._lock:
            return [
                HeldRoom(room, e.peer, e.pages, now - e.held_since)
                for room, e in self._rooms.items()
                if e.held_since is not None
            ]

    def rooms(self) -> int:
        """Rooms held now."""
        with self._lock:
            return sum(1 for e in self._rooms.values() if e.held_since is not None)

    def pages_by_peer(self, older_than: float = 0.0) -> dict[str, int]:
        """Held pages per writer, counting rooms held at least ``older_than`` seconds."""
        out: dict[str, int] = {}
        for entry in self.held():
            if entry.seconds >= older_than:
                out[entry.peer] = out.get(entry.peer, 0) + entry.pages
        return out

"""Decode pages held for a writer: published to a prefill, their request ended, not yet free.

Once decode has sent a room's metadata, its prefill may write the room's pages at any time
until it says it has stopped (its drain ACK). If the request ends first (the client left,
a deadline), the pages are *held*: handing them to another request while a write can still
land would corrupt that request. This registry says which rooms are held, for which writer,
how many pages and since when (``pdwarden_kv_rooms_abandoned``, ``pdwarden_kv_pages_held``),
and whether the writer is proven gone (``writer_watch``): never a clock.

A held room knows its writer twice. For the new-incarnation proof, by the first answer of
its bootstrap endpoint asked *after* the room was held (so after its metadata went out): the
process that received the metadata is that one or an older one that has since died; the
identity can only be newer than the real writer, never older, so a later change of
incarnation proves the real writer gone. For the pod-deleted proof, by the pod that answered
at that address before the metadata went out, with the wall time of publication: the
operator's list says until when that pod was seen alive (``writer_watch``).

Rooms enter at publication (``published``), become held when their request ends before the
transfer concluded (``hold``), and leave when their pages are freed or the room concludes
normally (``release``). SGLang clears a failed receiver before it arms the drain
wait (``ensure_abort_notified`` after ``failure_exception``), so a room cleared unheld is kept
a while (``concluded``) in case the hold comes next. Thread-safe; bounded (the oldest entries
go first past ``MAX_ROOMS`` and ``MAX_CONCLUDED``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from pdwarden_runtime.hardening.writer_watch import (
    CLOCK_SKEW_S,
    FREED_DRAINED,
    GONE_NEW_INCARNATION,
    GONE_POD_DELETED,
    GonePod,
    WriterIdentity,
)

MAX_ROOMS: Final = 65536
MAX_CONCLUDED: Final = 4096
RECENT_FREED: Final = 256


@dataclass
class _Room:
    peer: str  # the writer's IP (the per-peer figures' name for it)
    addr: str  # its bootstrap endpoint, host:port
    pages: int
    published_wall: float = 0.0  # wall clock, when the metadata went out
    published_to: WriterIdentity | None = None  # who answered at addr before that
    held_since: float | None = None
    writer: WriterIdentity | None = None  # the first answer after the hold
    proof: str | None = None  # why the writer cannot write any more


@dataclass(frozen=True)
class HeldRoom:
    room: int
    peer: str
    pages: int
    seconds: float
    proof: str | None


@dataclass(frozen=True)
class Freed:
    """A held room whose pages were freed: how long they were held and why they could go."""

    room: int
    peer: str
    pages: int
    held_seconds: float
    how: str


class HeldPages:
    """Published decode rooms, the ones among them held for their writer, and the proofs."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time
    ) -> None:
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._rooms: OrderedDict[int, _Room] = OrderedDict()
        self._concluded: OrderedDict[int, _Room] = OrderedDict()  # cleared before any hold
        self._freed: deque[Freed] = deque(maxlen=RECENT_FREED)

    def published(
        self, room: int, peer: str, addr: str, pages: int, to: WriterIdentity | None = None
    ) -> None:
        """Decode sent the room's metadata: ``pages`` pages may be written by ``peer`` (``to``:
        the pod that last answered at ``addr``, if any)."""
        with self._lock:
            self._rooms[room] = _Room(peer, addr, max(0, int(pages)), self._wall(), to)
            self._rooms.move_to_end(room)
            while len(self._rooms) > MAX_ROOMS:
                self._rooms.popitem(last=False)

    def hold(self, room: int) -> None:
        """The room's request ended while its writer may still write: its pages are held."""
        with self._lock:
            entry = self._rooms.get(room)
            if entry is None and (entry := self._concluded.pop(room, None)) is not None:
                self._rooms[room] = entry
            if entry is not None and entry.held_since is None:
                entry.held_since = self._clock()

    def concluded(self, room: int) -> None:
        """The room's receiver was cleared: its pages are free unless held (now or right
        after: SGLang arms the drain wait after clearing a failed receiver)."""
        with self._lock:
            entry = self._rooms.get(room)
            if entry is None or entry.held_since is not None:
                return
            del self._rooms[room]
            self._concluded[room] = entry
            while len(self._concluded) > MAX_CONCLUDED:
                self._concluded.popitem(last=False)

    def release(self, room: int) -> None:
        """The room's pages are free again (for a held room: its writer drained, or a proof)."""
        with self._lock:
            self._concluded.pop(room, None)
            entry = self._rooms.pop(room, None)
            if entry is not None and entry.held_since is not None:
                held_for = self._clock() - entry.held_since
                how = entry.proof or FREED_DRAINED
                self._freed.append(Freed(room, entry.peer, entry.pages, held_for, how))

    # --- proofs ------------------------------------------------------------------------
    def held_addresses(self) -> list[str]:
        with self._lock:
            return sorted({e.addr for e in self._rooms.values() if e.held_since is not None})

    def observe(self, addr: str, identity: WriterIdentity, asked_at: float) -> None:
        """``addr``'s bootstrap endpoint, asked at ``asked_at``, answered ``identity``."""
        with self._lock:
            for entry in self._rooms.values():
                if entry.addr != addr or entry.held_since is None or entry.proof is not None:
                    continue
                if entry.writer is None:
                    if entry.held_since <= asked_at:
                        entry.writer = identity
                elif entry.writer.incarnation != identity.incarnation:
                    entry.proof = GONE_NEW_INCARNATION

    def observe_gone_pods(self, gone: Iterable[GonePod]) -> None:
        """The operator says these runtime pods' deletion completed, each last seen alive at
        ``last_seen``: a pod seen alive after a room's metadata went out wrote it, if any did."""
        last_seen = {g.uid: g.last_seen for g in gone}
        with self._lock:
            for entry in self._rooms.values():
                to = entry.published_to
                if entry.proof is not None or entry.held_since is None or to is None or to.pod_uid is None:
                    continue
                seen = last_seen.get(to.pod_uid)
                if seen is not None and seen > entry.published_wall + CLOCK_SKEW_S:
                    entry.proof = GONE_POD_DELETED

    def proof(self, room: int) -> str | None:
        """Why the held room's writer cannot write any more, or None."""
        with self._lock:
            entry = self._rooms.get(room)
            return entry.proof if entry is not None else None

    # --- reads ---------------------------------------------------------------------------
    def is_held(self, room: int) -> bool:
        with self._lock:
            entry = self._rooms.get(room)
            return entry is not None and entry.held_since is not None

    def held(self) -> list[HeldRoom]:
        now = self._clock()
        with self._lock:
            return [
                HeldRoom(room, e.peer, e.pages, now - e.held_since, e.proof)
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

    def pages_for(self, peer: str) -> int:
        """Pages held now for one writer (checked per new decode request: no list built)."""
        with self._lock:
            return sum(e.pages for e in self._rooms.values() if e.held_since is not None and e.peer == peer)

    def freed(self) -> list[Freed]:
        """The latest held rooms whose pages were freed, oldest first."""
        with self._lock:
            return list(self._freed)

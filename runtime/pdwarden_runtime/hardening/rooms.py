"""Room state the hardened KV manager keeps beside SGLang's.

``RoomStatusMap`` stands in for SGLang's ``request_status`` dict: every read and write
SGLang does on it (``get``, ``in``, ``[]``, ``[]=``, ``pop``) goes through pdwarden's
``RoomStatusTable``, so no SGLang code path can bypass the terminal-sticky rule.

``RoomLedger`` tracks what SGLang does not: how many chunks of a room are queued or on a
transfer worker, where its decode endpoints are (they outlive ``transfer_infos``), which
rooms failed and whether decode has been told. With it the manager tells decode about a
failed room exactly once, and only when no chunk of the room can still write into the
decode's pages.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, MutableMapping
from typing import Any

from pdwarden_runtime.kvpoll import OPENING, KVPoll, coerce
from pdwarden_runtime.status import RoomStatusTable

Target = tuple[str, int]


class RoomStatusMap(MutableMapping[int, KVPoll]):
    """A dict-shaped view of a RoomStatusTable (what SGLang's code sees)."""

    def __init__(self, table: RoomStatusTable) -> None:
        self.table = table

    def __getitem__(self, room: int) -> KVPoll:
        status = self.table.get(room)
        if status is None:
            raise KeyError(room)
        return status

    def get(self, room: int, default: Any = None) -> Any:
        status = self.table.get(room)
        return default if status is None else status

    def __contains__(self, room: object) -> bool:
        return room in self.table

    def __setitem__(self, room: int, status: KVPoll | int) -> None:
        target = coerce(status)
        if self.table.get(room) is None and target in OPENING:
            self.table.open(room, target)
        else:
            self.table.update(room, target)

    def __delitem__(self, room: int) -> None:
        if room not in self.table:
            raise KeyError(room)
        self.table.clear(room)

    def pop(self, room: int, *default: Any) -> Any:  # type: ignore[override]
        status = self.table.get(room)
        if status is None:
            if default:
                return default[0]
            raise KeyError(room)
        self.table.clear(room)
        return status

    def __iter__(self) -> Iterator[int]:
        return iter(self.table.snapshot())

    def __len__(self) -> int:
        return len(self.table)


class RoomLedger:
    """Per-room transfer bookkeeping of a prefill manager (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued: dict[int, int] = {}
        self._on_worker: dict[int, int] = {}
        # Rooms with handles in quarantine: a write may still land in decode's pages.
        self._quarantined: dict[int, int] = {}
        self._targets: dict[int, list[Target]] = {}
        self._failed: dict[int, str] = {}
        self._told: set[int] = set()
        self._cleared: set[int] = set()

    # --- chunk accounting ------------------------------------------------------------
    def enqueued(self, room: int) -> None:
        with self._lock:
            self._queued[room] = self._queued.get(room, 0) + 1

    def dequeued(self, room: int) -> None:
        """A worker took a chunk of the room off its queue."""
        with self._lock:
            left = self._queued.get(room, 0) - 1
            if left > 0:
                self._queued[room] = left
            else:
                self._queued.pop(room, None)
            self._on_worker[room] = self._on_worker.get(room, 0) + 1

    def chunk_done(self, room: int) -> bool:
        """A worker finished a chunk of the room; True if the room is now idle."""
        with self._lock:
            left = self._on_worker.get(room, 0) - 1
            if left > 0:
                self._on_worker[room] = left
            else:
                self._on_worker.pop(room, None)
            return self._idle_locked(room)

    def quarantined(self, room: int) -> None:
        """A batch of the room's handles went to quarantine (it may still write)."""
        with self._lock:
            self._quarantined[room] = self._quarantined.get(room, 0) + 1

    def unquarantined(self, room: int) -> bool:
        """A quarantined batch of the room settled; True if the room is now idle."""
        with self._lock:
            left = self._quarantined.get(room, 0) - 1
            if left > 0:
                self._quarantined[room] = left
            else:
                self._quarantined.pop(room, None)
            return self._idle_locked(room)

    def idle(self, room: int) -> bool:
        with self._lock:
            return self._idle_locked(room)

    def _idle_locked(self, room: int) -> bool:
        return room not in self._queued and room not in self._on_worker and room not in self._quarantined

    # --- decode endpoints and failure notices ------------------------------------------
    def remember_targets(self, room: int, targets: list[Target]) -> None:
        if targets:
            with self._lock:
                self._targets[room] = list(targets)

    def has_targets(self, room: int) -> bool:
        """True once decode's metadata for the room was seen (the room is not a dummy)."""
        with self._lock:
            return room in self._targets

    def failed(self, room: int, reason: str) -> None:
        with self._lock:
            self._failed.setdefault(room, reason)

    def told(self, room: int) -> None:
        """Decode got a terminal status for the room (from SGLang or from us)."""
        with self._lock:
            self._told.add(room)

    def claim_failure_notice(self, room: int) -> tuple[list[Target], str] | None:
        """If the room failed, is idle and decode was not told: claim the notice (once)."""
        with self._lock:
            if room in self._told or room not in self._failed or not self._idle_locked(room):
                return None
            targets = self._targets.get(room)
            if not targets:
                return None
            self._told.add(room)
            return list(targets), self._failed[room]

    def cleared(self, room: int) -> None:
        """The room's lifecycle ended; forget it once no chunk of it is left."""
        with self._lock:
            self._cleared.add(room)
            self._forget_if_done_locked(room)

    def settle(self, room: int) -> None:
        with self._lock:
            self._forget_if_done_locked(room)

    def _forget_if_done_locked(self, room: int) -> None:
        if room in self._cleared and self._idle_locked(room):
            self._cleared.discard(room)
            self._targets.pop(room, None)
            self._failed.pop(room, None)
            self._told.discard(room)

    def sizes(self) -> dict[str, int]:
        with self._lock:
            return {
                "queued_rooms": len(self._queued),
                "rooms_on_worker": len(self._on_worker),
                "quarantined_rooms": len(self._quarantined),
                "targets": len(self._targets),
                "failed": len(self._failed),
                "told": len(self._told),
                "cleared_pending": len(self._cleared),
            }

"""SGLang's transfer worker queues, seen through pdwarden's chunk accounting (prefill).

Each chunk a worker takes off its queue is counted in the room's ledger until the worker
takes the next one: a room with a chunk queued or on a worker may still write into decode's
pages, so decode is told of a failure, and its drain ACKed, only once the room is idle.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from pdwarden_runtime.hardening.runtime import (
    WHERE_CHUNK_FINISHED,
    WHERE_CHUNK_TAKEN,
    WHERE_ENQUEUE,
    RoomRuntime,
)

if TYPE_CHECKING:
    from pdwarden_runtime.hardening.skip_guard import SkipGuard


class ChunkSlot(threading.local):
    """What a transfer worker thread is on: its chunk (None between chunks), and the room
    whose next SGLang failure reason is dropped because pdwarden recorded the true cause."""

    chunk: Any = None
    keep_reason: int | None = None


class WatchedQueue:
    """A transfer worker's queue: puts and takes pass the chunk accounting."""

    def __init__(self, inner: Any, queues: WorkerQueues) -> None:
        self._inner = inner
        self._queues = queues

    def put(self, chunk: Any) -> None:
        with self._queues.guard(WHERE_ENQUEUE):
            self._queues.ledger.enqueued(chunk.room)
        self._inner.put(chunk)

    def get(self) -> Any:
        # The worker asks for its next chunk only once it is done with the last one.
        with self._queues.guard(WHERE_CHUNK_FINISHED):
            self._queues.chunk_finished()
        self._queues.slot.chunk = None
        chunk = self._inner.get()
        with self._queues.guard(WHERE_CHUNK_TAKEN):
            self._queues.chunk_taken(chunk)
        return chunk


class WorkerQueues:
    """The watched queues of one manager, and what a chunk taken or finished sets off."""

    def __init__(
        self, rt: RoomRuntime, slot: ChunkSlot, peer_check: Callable[[int], None], skip: SkipGuard
    ) -> None:
        self.ledger = rt.ledger
        self.slot = slot
        self._rt = rt
        self._peer_check = peer_check  # transfer_deadline: a stalled peer fails the room first
        self._skip = skip
        self._watched: dict[int, WatchedQueue] = {}
        self._lock = threading.Lock()

    def guard(self, where: str) -> AbstractContextManager[None]:
        return self._rt.guard(where)

    def watched(self, inner: Any) -> WatchedQueue:
        """The one watched queue over ``inner`` (SGLang hands a worker its queue again)."""
        if isinstance(inner, WatchedQueue):
            return inner
        with self._lock:
            watched = self._watched.get(id(inner))
            if watched is None:
                watched = self._watched[id(inner)] = WatchedQueue(inner, self)
            return watched

    def chunk_taken(self, chunk: Any) -> None:
        # Per-thread state first: if the ledger below fails, this chunk (not the last
        # one) is what the rest of the batch's hooks see.
        self.slot.chunk = chunk
        self.slot.keep_reason = None
        room = chunk.room
        self.ledger.dequeued(room)
        self._peer_check(room)
        self._skip.chunk_taken(room)

    def chunk_finished(self) -> None:
        chunk = self.slot.chunk
        if chunk is None:
            return
        self.slot.chunk = None
        if self.ledger.chunk_done(chunk.room):
            self._skip.room_idle(chunk.room)

"""Transfer handles given up on at the deadline, kept and polled until they cannot write.

Releasing an in-progress NIXL WRITE does not stop it (UCX cancels only tagged receives;
the bytes of a released handle were measured landing after the stalled peer resumed). So
a handle past the transfer deadline is not released: it moves here, and the room's
decode is told its pages are free only once every quarantined handle of the room is
DONE or ERR, or NIXL reports its peer disconnected (a dead peer's memory cannot be
written). Until then the room is Failed for prefill (the worker moves on) and decode
holds its pages.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from pdwarden_contract import (
    QUARANTINE_ENDED_DONE,
    QUARANTINE_ENDED_ERROR,
    QUARANTINE_ENDED_PEER_GONE,
    QUARANTINE_ENDINGS,
)

log = logging.getLogger(__name__)

POLL_S: Final = 0.02

# (handle) -> NIXL state string ("DONE", "ERR", "PROC", ...); may raise.
StateReader = Callable[[Any], str]
# (room) -> None, once every handle of the room settled (called from the monitor thread).
SettledListener = Callable[[int], None]


def is_disconnect(err: BaseException) -> bool:
    """NIXL's error for a torn-down peer connection (nixlRemoteDisconnectError)."""
    return any("Disconnect" in type(e).__name__ for e in (err, err.__cause__) if e is not None)


@dataclass
class _Entry:
    room: int
    handles: list[Any]
    ended: list[str] = field(default_factory=list)


class HandleQuarantine:
    """Quarantined handles per room, polled by one daemon thread until they settle."""

    def __init__(
        self,
        read_state: StateReader,
        release: Callable[[Any], None],
        on_settled: SettledListener,
        on_error: Callable[[str], None] | None = None,
        poll_s: float = POLL_S,
    ) -> None:
        self._read_state = read_state
        self._release = release
        self._on_settled = on_settled
        self._on_error = on_error
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._entries: list[_Entry] = []
        self._ended: dict[str, int] = dict.fromkeys(QUARANTINE_ENDINGS, 0)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="pdwarden-handle-quarantine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def add(self, room: int, handles: list[Any]) -> None:
        if not handles:
            return
        with self._lock:
            self._entries.append(_Entry(room, list(handles)))
        self._wake.set()

    def count(self) -> int:
        """Handles held now (the ``pdwarden_kv_handles_quarantined`` gauge)."""
        with self._lock:
            return sum(len(e.handles) for e in self._entries)

    def rooms(self) -> int:
        """Rooms with quarantined handles now: requests that ended, held for their writes."""
        return len(self.room_list())

    def room_list(self) -> list[int]:
        with self._lock:
            return sorted({e.room for e in self._entries})

    def holds(self, room: int) -> bool:
        with self._lock:
            return any(e.room == room for e in self._entries)

    def ended(self) -> dict[str, int]:
        """How quarantined handles ended, by ending (``pdwarden_kv_quarantine_endings_total``);
        a handle is counted once its whole batch has ended."""
        with self._lock:
            return dict(self._ended)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                entries = list(self._entries)
            if not entries:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            for entry in entries:
                try:
                    self._poll(entry)
                except Exception:  # the monitor must outlive any one bad handle
                    log.exception("quarantine: polling room %s failed", entry.room)
                    if self._on_error is not None:
                        self._on_error("quarantine")
            self._stop.wait(self._poll_s)

    def _poll(self, entry: _Entry) -> None:
        still: list[Any] = []
        for handle in entry.handles:
            try:
                state = self._read_state(handle)
            except Exception as err:
                if is_disconnect(err):
                    entry.ended.append(QUARANTINE_ENDED_PEER_GONE)
                    continue
                still.append(handle)  # unreadable is not proof the write is over
                continue
            if state == "DONE":
                entry.ended.append(QUARANTINE_ENDED_DONE)
                self._release_quietly(handle)
            elif state == "ERR":
                entry.ended.append(QUARANTINE_ENDED_ERROR)
                self._release_quietly(handle)
            else:
                still.append(handle)
        with self._lock:
            entry.handles = still
            if still:
                return
            self._entries.remove(entry)
            for ending in entry.ended:
                self._ended[ending] += 1
        log.warning(
            "room %s: quarantined transfer handles settled (%s); its decode pages may be freed",
            entry.room,
            ", ".join(entry.ended),
        )
        self._on_settled(entry.room)

    def _release_quietly(self, handle: Any) -> None:
        try:
            self._release(handle)
        except Exception as err:  # a settled handle: nothing can write any more
            log.debug("releasing a settled NIXL handle failed: %s", err)

"""The ``emulated-maxstatus-port-race`` fault: the emulated NIXL port's ABORT race.

That port wrote a finished non-last chunk's Transferring status late; an ABORT handled in
between was then overwritten under the ``max()`` rule, and the room waited forever. Here the
worker holds that write (``hold_status_write``) until the room's ABORT has been handled
(``abort_handled``), or the race window ends, so the race happens every time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Final

from sglang.srt.disaggregation.common.conn import AbortNotification

from pdwarden_runtime.hardening.faults.hooks import AbortPaths, Fault, is_abort
from pdwarden_runtime.kvpoll import KVPoll

# How long the ABORT handler waits for a parked worker's resurrecting write.
HANDOFF_S: Final = 2.0


class PortRace:
    """The hand-off between a parked transfer worker and the room's ABORT."""

    def __init__(self) -> None:
        # Held while an ABORT is handled and while a status is read: a reader never sees an
        # ABORT half-handled, so the race is deterministic.
        self.lock = threading.RLock()
        self._parked: dict[int, tuple[threading.Event, threading.Event]] = {}
        self._guard = threading.Lock()

    def hold_status_write(self, room: int, window: float, write: Callable[[], None]) -> None:
        """Wait for the room's ABORT (at most ``window`` seconds), then ``write``."""
        wake, written = threading.Event(), threading.Event()
        with self._guard:
            self._parked[room] = (wake, written)
        try:
            wake.wait(window)
            write()
        finally:
            with self._guard:
                self._parked.pop(room, None)
            written.set()

    def abort_handled(self, room: int) -> None:
        """The room's ABORT was handled: let its parked write go, and wait until it is done."""
        with self._guard:
            events = self._parked.get(room)
        if events is not None:
            wake, written = events
            wake.set()
            written.wait(HANDOFF_S)


class PortRaceFault(Fault):
    """The fault's hooks: the worker parks a finished non-last chunk's Transferring write,
    the ABORT handler lets it go once the room's ABORT is handled (and drops the room's
    transfer info, as that port did), and a status read never sees an ABORT half-handled."""

    def __init__(self, race: PortRace, window: Callable[[], float]) -> None:
        self.race = race
        self._window = window  # read per chunk: the config's race window

    def chunk_landed(self, chunk: Any, update_status: Callable[[int, Any], None]) -> None:
        if chunk.is_last_chunk:
            return
        # The chunk is done, its status write comes late; an ABORT that lands in between
        # is then overwritten by Transferring under max().
        room = chunk.room
        self.race.hold_status_write(room, self._window(), lambda: update_status(room, KVPoll.Transferring))

    def status_read(self) -> AbstractContextManager[object]:
        return self.race.lock  # never see an ABORT half-handled (deterministic race)

    def abort_message(self, msg: list[bytes], paths: AbortPaths) -> bool:
        paths.remember_early()
        if not is_abort(msg):
            return paths.handle()
        notification = AbortNotification.from_zmq(msg)
        if notification is None:
            return True
        room = notification.room
        with self.race.lock:
            handled = paths.handle()
            # The emulated port's control thread also dropped the room's transfer info here.
            paths.drop_transfer_info(room)
            self.race.abort_handled(room)
        return bool(handled)

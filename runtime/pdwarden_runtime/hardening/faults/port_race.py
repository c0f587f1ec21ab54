"""The ``emulated-maxstatus-port-race`` fault: the emulated NIXL port's ABORT race.

That port wrote a finished non-last chunk's Transferring status late; an ABORT handled in
between was then overwritten under the ``max()`` rule, and the room waited forever. Here the
worker holds that write (``hold_status_write``) until the room's ABORT has been handled
(``abort_handled``), or the race window ends, so the race happens every time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

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

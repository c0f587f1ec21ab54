"""ABORTs that reach a prefill before it opened the room (``no_silent_skip``).

Decode can give up on a room before the prefill request for it arrives. SGLang drops such
an ABORT, and the room then waits out the bootstrap timeout once its sender opens it. The
hardened manager keeps them here, so the room fails at open; and keeps here an ownerless
room it ended, so a prefill leg that comes after all fails at once too.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Final

# Bounded: a decode that aborts rooms no prefill ever opens must not grow the set forever.
KEPT: Final = 16384


class EarlyAborts:
    """Rooms aborted before they opened; the oldest is forgotten past ``keep``."""

    def __init__(self, keep: int = KEPT) -> None:
        self._keep = keep
        self._rooms: OrderedDict[int, None] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, room: int) -> None:
        with self._lock:
            self._rooms[room] = None
            self._rooms.move_to_end(room)
            while len(self._rooms) > self._keep:
                self._rooms.popitem(last=False)

    def take(self, room: int) -> bool:
        """Whether the room was aborted before it opened (it is forgotten: taken once)."""
        with self._lock:
            return self._rooms.pop(room, 0) is None

    def __len__(self) -> int:
        return len(self._rooms)

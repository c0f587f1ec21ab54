"""``inflight_deadline``: rooms the inflight tracker found waiting for or moving KV too long.

The tracker's deadline runs from a room leaving Bootstrapping (queueing is not a wedge).
A room past it is failed with its reason; what follows is the role's: a prefill tells
decode as for any failure (``SkipGuard.deadline_failed``), a decode has the engine abort the
room and holds its pages until the prefill drains (``PagesGuard.deadline_failed``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from pdwarden_runtime.hardening.runtime import WHERE_DEADLINE, RoomRuntime

if TYPE_CHECKING:
    from pdwarden_runtime.hardening.nixl import HardenedNixlKVManager

log = logging.getLogger(__name__)

REASON_INFLIGHT_DEADLINE: Final = "inflight deadline: room not concluded within {:.1f}s"


class DeadlineGuard:
    """The tracker's ``on_deadline`` for one manager."""

    def __init__(
        self, mgr: HardenedNixlKVManager, rt: RoomRuntime, fail_room: Callable[[int, str], None]
    ) -> None:
        self._mgr = mgr
        self._rt = rt
        self._fail_room = fail_room  # the role's part, after the reason is recorded

    def rooms_due(self, rooms: list[int]) -> None:
        reason = REASON_INFLIGHT_DEADLINE.format(self._rt.tracker.deadline or 0.0)
        for room in rooms:
            with self._rt.guard(WHERE_DEADLINE):
                log.warning("room %s: %s", room, reason)
                self._mgr.record_failure(room, reason)
                self._fail_room(room, reason)
            self._rt.notify(room)

"""Who owns a prefill room, so an ownerless failed room is ended (``no_silent_skip``).

A prefill room is owned by its request's sender from the sender's creation to its clear.
Decode's metadata can open a room before any sender exists (the prefill leg has not come
yet); if the client leaves first, that leg never comes and nothing would ever read the
room's failure or clear it. A room opened by metadata and not owned by a sender is such a
room.
"""

from __future__ import annotations


class RoomOwners:
    """Rooms a sender owns and rooms decode's metadata opened first."""

    def __init__(self) -> None:
        # Plain sets: each call is one set operation, atomic under the GIL, made from
        # SGLang's scheduler and bootstrap threads.
        self._senders: set[int] = set()
        self._opened_by_metadata: set[int] = set()

    def sender_created(self, room: int) -> None:
        """Before the sender opens its room: never taken for an ownerless one."""
        self._senders.add(room)

    def opened_by_metadata(self, room: int) -> None:
        """Decode's metadata opened the room; a sender may still come and own it."""
        if room not in self._senders:
            self._opened_by_metadata.add(room)

    def ownerless(self, room: int) -> bool:
        return room in self._opened_by_metadata and room not in self._senders

    def cleared(self, room: int) -> None:
        self._senders.discard(room)
        self._opened_by_metadata.discard(room)

"""Where a fault may act in the hardened NIXL classes: ``Faults``, whose default does nothing.

The production overrides call the active fault's hooks unconditionally (``FaultSet.active``);
with no fault on that is ``NO_FAULTS``, and every hook is a pass-through. So no production
path branches on which fault is on, and a fault's whole behaviour is read in its own class.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Final

from sglang.srt.disaggregation.common.conn import ABORT_TAG


@dataclasses.dataclass(frozen=True)
class AbortPaths:
    """What the prefill's ABORT handler does without a fault, step by step (a fault may
    skip or wrap a step)."""

    remember_early: Callable[[], None]  # keep an ABORT for a room not opened yet (guarded)
    handle: Callable[[], bool]  # SGLang's own handler
    drop_transfer_info: Callable[[int], None]  # what the emulated port also did on ABORT


def is_abort(msg: list[bytes]) -> bool:
    return bool(msg) and msg[0] == ABORT_TAG


class Faults:
    """No fault: every hook leaves SGLang's and pdwarden's behaviour as it is."""

    # Handles are awaited by pdwarden's wait even with transfer_deadline off, as they were
    # whenever a fault was on (it counts the bytes and parks the port race's writes).
    takes_handle_wait: bool = False
    # Every handle looks unsettled to the wait (stall-transfers).
    never_settle: bool = False
    # Rooms opened while this is on name the never-progressing agent (stall-kv-receive).
    names_stalled_agent: bool = False

    def handle_state(self, handle: Any, read: Callable[[Any], str]) -> str:
        """A quarantined handle's state, as the quarantine sees it."""
        return read(handle)

    def chunk_landed(self, chunk: Any, update_status: Callable[[int, Any], None]) -> None:
        """A chunk's handles settled, not failed."""

    def status_read(self) -> AbstractContextManager[object]:
        """Held while SGLang reads a room's status (``check_status``)."""
        return nullcontext()

    def abort_message(self, msg: list[bytes], paths: AbortPaths) -> bool:
        """The prefill's ABORT handler (SGLang's return value: whether the message was its)."""
        paths.remember_early()
        return paths.handle()

    def registration_message(self, message: list[bytes]) -> list[bytes]:
        """The decode's registration with a prefill (SGLang's frames)."""
        return message

    def metadata_message(self, message: list[bytes]) -> list[bytes]:
        """The decode's per-room metadata to a prefill (SGLang's frames)."""
        return message


NO_FAULTS: Final = Faults()


class Fault(Faults):
    """An injected fault; one with nothing more to do on this role is this class itself."""

    takes_handle_wait = True

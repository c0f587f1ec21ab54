"""The ``stall-transfers`` fault: every NIXL handle looks unsettled, in the quarantine too.

A test holds a room's handles past their transfer deadline this way, and sees that decode
is not told while they sit in quarantine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from pdwarden_runtime.hardening.faults.hooks import Fault

# NIXL's state of a handle still in progress.
IN_PROGRESS: Final = "PROC"


class StallTransfers(Fault):
    never_settle = True

    def handle_state(self, handle: Any, read: Callable[[Any], str]) -> str:
        return IN_PROGRESS

"""Waiting for a batch's NIXL handles, with the transfer deadline (``transfer_deadline``).

SGLang's worker waits for every handle of a batch without end; a handle that stays in
progress (a stalled peer) holds the worker, and the rooms queued behind it, forever. This
wait stops at the transfer deadline but never reports such a batch settled: a released
WRITE can still land. The caller quarantines it instead (``HandleQuarantine``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

log = logging.getLogger(__name__)

# Busy-poll a handle as SGLang does (sleep(0)) for this long, far more than a healthy chunk
# takes, then back off so a stalled handle does not pin a core until its deadline. A count of
# polls instead of a time made healthy chunks on a slow link sleep between polls.
SPIN_S: Final = 0.05
BACKOFF_S: Final = 0.0002

REASON_HANDLE_DEADLINE: Final = "transfer deadline: NIXL handle still in progress after {:.1f}s; quarantined"
REASON_SIBLING_RUNNING: Final = "NIXL handle still running after a sibling handle failed"
REASON_UNREADABLE: Final = "NIXL transfer state unreadable: {}"


@dataclass(frozen=True)
class HandleWait:
    """How a batch's wait ended. ``quarantine`` is the reason when its handles may still
    write (never settled); ``settled`` and ``failed`` are what SGLang's worker is told."""

    settled: bool
    failed: bool
    quarantine: str | None = None
    past_deadline: bool = False


@dataclass(frozen=True)
class WaitLimits:
    """The bounds of one wait (SGLang's settle bounds after a failed sibling handle)."""

    transfer_deadline: float | None  # None: no deadline (the fix is off)
    settle_timeout: float
    settle_poll: float


def await_handles(
    handles: Sequence[Any],
    read_state: Callable[[Any], str],
    limits: WaitLimits,
    *,
    failure_seen: bool,
    never_settle: bool = False,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> HandleWait:
    """Poll ``read_state`` ("DONE", "ERR", anything else: in progress) until every handle
    ended, or a bound passed. ``never_settle``: the ``stall-transfers`` fault as it was when
    the wait began, every handle looks in progress to its end (switching the fault off later
    does not finish a handle that stalled)."""
    if not handles:
        return HandleWait(settled=True, failed=failure_seen)
    start = clock()
    deadline = limits.transfer_deadline
    settle_deadline = start + limits.settle_timeout if failure_seen else None
    spin_until = start + SPIN_S
    while True:
        all_settled, any_failed = not never_settle, failure_seen
        if not never_settle:
            try:
                for handle in handles:
                    state = read_state(handle)
                    if state == "ERR":
                        any_failed = True
                    elif state != "DONE":
                        all_settled = False
            except Exception as err:
                log.warning("Failed to read NIXL transfer state: %s", err)
                return HandleWait(settled=False, failed=True, quarantine=REASON_UNREADABLE.format(err))
        if all_settled:
            return HandleWait(settled=True, failed=any_failed)
        now = clock()
        if deadline is not None and now - start >= deadline:
            reason = REASON_HANDLE_DEADLINE.format(deadline)
            return HandleWait(settled=False, failed=True, quarantine=reason, past_deadline=True)
        if any_failed:
            if settle_deadline is None:
                settle_deadline = now + limits.settle_timeout
            elif now >= settle_deadline:
                return HandleWait(settled=False, failed=True, quarantine=REASON_SIBLING_RUNNING)
            sleep(limits.settle_poll)
            continue
        sleep(0 if now < spin_until else BACKOFF_S)

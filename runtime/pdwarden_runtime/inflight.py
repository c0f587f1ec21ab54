"""Inflight rooms: how many, how old the oldest, and a deadline that fails stuck ones.

A room is inflight from ``open()`` until it first reaches Failed or Success (or is
cleared without concluding). The operator's wedge test reads exactly these figures: the
count, the age of the oldest room, and the per-outcome conclusions (the progress signal).

The tracker observes the status table's lifecycle edges (open, conclusion, abandonment),
not every write, so the hot path (one Transferring write per chunk) does not touch it.
Start times live in an insertion-ordered dict: starts are recorded under the table's
lock from a monotonic clock, so the first entry is always the oldest and both the age
and the deadline check are O(1) when nothing is due.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from pdwarden_contract import OUTCOME_ABORTED, OUTCOME_DEADLINE, OUTCOMES
from pdwarden_runtime.kvpoll import KVPoll
from pdwarden_runtime.status import RoomStatusTable

_log = logging.getLogger(__name__)

Clock = Callable[[], float]
# (room, outcome, seconds from open to conclusion); called with the table's lock held.
ConcludeListener = Callable[[int, str, float], None]
# rooms the deadline failed; called after the lock is released.
DeadlineListener = Callable[[list[int]], None]


class InflightTracker:
    """Counts and ages the live non-terminal rooms of one RoomStatusTable."""

    def __init__(
        self,
        table: RoomStatusTable,
        *,
        deadline: float | None = None,
        clock: Clock = time.monotonic,
        on_deadline: DeadlineListener | None = None,
    ) -> None:
        self._table = table
        self._lock = table.lock
        self._clock = clock
        self._deadline = _valid_deadline(deadline)
        self._started: OrderedDict[int, float] = OrderedDict()
        # When each live room first left Bootstrapping (waiting for or moving KV): the
        # deadline's clock. A room still queueing for bootstrap is busy, not stuck.
        self._waiting: OrderedDict[int, float] = OrderedDict()
        self._outcomes: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self._conclude_listeners: list[ConcludeListener] = []
        self.on_deadline = on_deadline
        table.attach(self)

    # --- configuration --------------------------------------------------------------------
    @property
    def deadline(self) -> float | None:
        return self._deadline

    @deadline.setter
    def deadline(self, seconds: float | None) -> None:
        self._deadline = _valid_deadline(seconds)

    def add_conclude_listener(self, listener: ConcludeListener) -> None:
        """Called (room, outcome, seconds) on every conclusion, with the table's lock held:
        keep it quick (a histogram observe) and never call the table from it."""
        with self._lock:
            self._conclude_listeners.append(listener)

    # --- LifecycleObserver (called by the table with its lock held) ------------------------
    def opened(self, room: int) -> None:
        started = self._started
        if room in started:  # cannot happen in sticky mode; keeps the order invariant anyway
            del started[room]
        started[room] = self._clock()

    def entered(self, room: int, status: KVPoll) -> None:
        if room not in self._waiting:
            self._waiting[room] = self._clock()

    def concluded(self, room: int, status: KVPoll, outcome: str) -> None:
        self._finish(room, outcome)

    def abandoned(self, room: int) -> None:
        self._finish(room, OUTCOME_ABORTED)

    def _finish(self, room: int, outcome: str) -> None:
        start = self._started.pop(room, None)
        self._waiting.pop(room, None)
        self._outcomes[outcome] += 1
        if self._conclude_listeners:
            seconds = max(0.0, self._clock() - start) if start is not None else 0.0
            for listener in self._conclude_listeners:
                listener(room, outcome, seconds)

    # --- reads ----------------------------------------------------------------------------
    def count(self) -> int:
        return len(self._started)

    def oldest_age(self) -> float:
        """Seconds since the oldest inflight room opened; 0.0 when none is inflight."""
        with self._lock:
            if not self._started:
                return 0.0
            oldest = next(iter(self._started.values()))
            return max(0.0, self._clock() - oldest)

    def outcomes(self) -> dict[str, int]:
        """Conclusions per outcome, every outcome present."""
        with self._lock:
            return dict(self._outcomes)

    # --- the deadline -----------------------------------------------------------------------
    def expire(self) -> list[int]:
        """Fail, through the table, every inflight room that has waited for or moved KV
        longer than the deadline (outcome ``deadline``); return them. Rooms still in
        Bootstrapping, terminal or cleared rooms are never touched."""
        deadline = self._deadline
        if deadline is None:
            return []

        def older_than_deadline() -> list[int]:  # runs under the table's lock
            now = self._clock()
            victims = []
            for room, start in self._waiting.items():
                if now - start <= deadline:
                    break  # insertion order is start order: the rest are younger
                victims.append(room)
            return victims

        failed = self._table.fail_rooms(older_than_deadline, OUTCOME_DEADLINE)
        if failed and self.on_deadline is not None:
            self.on_deadline(failed)
        return failed

    def maybe_expire(self) -> list[int]:
        """``expire()`` when the oldest room is past the deadline; O(1) otherwise, so a
        caller may run it on every status write or poll."""
        deadline = self._deadline
        if deadline is None or not self._waiting:
            return []
        try:
            oldest = next(iter(self._waiting.values()))
        except (StopIteration, RuntimeError):  # emptied or changed concurrently: look properly
            return self.expire()
        if self._clock() - oldest > deadline:
            return self.expire()
        return []

    def start_reaper(self, interval: float) -> DeadlineReaper:
        """A daemon thread that runs ``expire()`` every ``interval`` seconds, so the
        deadline holds even when no write or scrape happens (a wedged pod)."""
        reaper = DeadlineReaper(self, interval)
        reaper.start()
        return reaper


class DeadlineReaper:
    """Runs a tracker's ``expire()`` periodically; ``stop()`` ends it."""

    def __init__(self, tracker: InflightTracker, interval: float) -> None:
        if not interval > 0:
            raise ValueError(f"reaper interval must be > 0 seconds, got {interval!r}")
        self._tracker = tracker
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pdwarden-deadline-reaper", daemon=True)

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._tracker.expire()
            except Exception:  # a listener's bug must not end the deadline for good
                _log.exception("deadline reaper: expire() failed")

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)


def _valid_deadline(seconds: float | None) -> float | None:
    if seconds is None:
        return None
    if not seconds > 0:
        raise ValueError(f"inflight deadline must be > 0 seconds (or None for off), got {seconds!r}")
    return float(seconds)

"""Metrics for SGLang's stock NIXL classes, read from outside (nothing in them is replaced).

With ``--hardening off`` the runtime runs SGLang 0.5.23's classes untouched, so no
status write passes through pdwarden. To still serve the contract metrics (they are how
a test or the operator sees a stock pod wedge), a daemon thread copies the stock
manager's ``request_status`` dict into a ``RoomRuntime``'s table every few milliseconds.
It only reads SGLang's dict; a room that lives shorter than one period may be missed.
It also wakes the engine's waiting requests (``RoomRuntime.notify``) at each copy, so with
stock classes a request learns of its room's Success up to one period late.

``wake_on_status_change`` is for the bench-only ``--hardening bench-stock-prompt-wake``:
the stock classes still run unchanged, and a status write that changes a room also wakes
its request at once, as the hardened manager's writes do.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Final

from pdwarden_runtime.hardening.runtime import WHERE_MIRROR, RoomRuntime
from pdwarden_runtime.kvpoll import OPENING, KVPoll, coerce

log = logging.getLogger(__name__)

PERIOD_S: Final = 0.02


class StockMirror:
    """Copies a stock manager's room statuses into ``runtime.table``."""

    def __init__(self, runtime: RoomRuntime, mgr: Any, period: float = PERIOD_S) -> None:
        self._rt = runtime
        self._mgr = mgr
        self._period = period
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="pdwarden-stock-mirror", daemon=True)

    def start(self) -> None:
        self.thread.start()
        self._rt.threads.watch(self.thread)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            with self._rt.guard(WHERE_MIRROR):
                self.sync()

    def sync(self) -> None:
        source = self._mgr.request_status
        for _ in range(3):  # SGLang's threads write the dict while we copy it
            try:
                snapshot = {room: coerce(status) for room, status in list(source.items())}
                break
            except RuntimeError:
                continue
        else:
            return
        table = self._rt.table
        for room, status in snapshot.items():
            current = table.get(room)
            if current is None:
                table.open(room, status if status in OPENING else KVPoll.Bootstrapping)
                current = table.get(room)
            if current is not status:
                table.update(room, status)
            self._rt.notify(room)
        for room in table.snapshot():
            if room not in snapshot:
                table.clear(room)


def wake_on_status_change(runtime: RoomRuntime, mgr: Any) -> None:
    """Bench only: after each status write through the stock manager that changed its
    room, notify ``runtime``'s listeners at once. SGLang's method still does the write: it
    is wrapped on this instance, the class is untouched."""
    write = mgr.update_status  # bound to mgr: SGLang's own method

    def update_status(bootstrap_room: int, status: Any) -> None:
        before = mgr.request_status.get(bootstrap_room)
        try:
            write(bootstrap_room, status)
        finally:
            # Only a changed status can satisfy a waiter (the worker repeats Transferring
            # once per chunk), as in the hardened manager's update_status.
            if mgr.request_status.get(bootstrap_room) != before:
                runtime.notify(bootstrap_room)

    mgr.update_status = update_status

"""What one hardened KV manager owns: status table, inflight tracker, metrics, ledger."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final

from pdwarden_contract import ROLE_DECODE, ROLE_PREFILL
from pdwarden_runtime.hardening.config import Fix, HardeningConfig
from pdwarden_runtime.hardening.held_pages import HeldPages
from pdwarden_runtime.hardening.rooms import RoomLedger, RoomStatusMap
from pdwarden_runtime.hardening.threads import ThreadWatch
from pdwarden_runtime.inflight import DeadlineReaper, InflightTracker
from pdwarden_runtime.metrics import MetricsServer, RuntimeMetrics, serve_metrics
from pdwarden_runtime.status import RoomStatusTable

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pdwarden_runtime.hardening.quarantine import HandleQuarantine

TRANSFER_BACKEND: Final = "nixl"

# Where pdwarden's hooks inside SGLang's threads can fail (``pdwarden_runtime_errors_total``).
WHERE_ENQUEUE: Final = "enqueue"
WHERE_CHUNK_TAKEN: Final = "chunk_taken"
WHERE_CHUNK_FINISHED: Final = "chunk_finished"
WHERE_STATUS_WRITE: Final = "status_write"
WHERE_STATUS_NOTICE: Final = "status_notice"
WHERE_ABORT: Final = "abort"
WHERE_DEADLINE: Final = "deadline"
WHERE_QUARANTINE: Final = "quarantine"
WHERE_QUARANTINE_SETTLED: Final = "quarantine_settled"
WHERE_LISTENER: Final = "status_listener"
WHERE_MIRROR: Final = "stock_mirror"
WHERE_PEERS: Final = "peers"
# A side-channel message dropped before SGLang's thread saw it: no valid proof, malformed,
# or a decode registration NIXL refused (hardening/side_socket.py).
WHERE_SIDE_CHANNEL: Final = "side_channel"
ERROR_WHERES: Final = (
    WHERE_ENQUEUE,
    WHERE_CHUNK_TAKEN,
    WHERE_CHUNK_FINISHED,
    WHERE_STATUS_WRITE,
    WHERE_STATUS_NOTICE,
    WHERE_ABORT,
    WHERE_DEADLINE,
    WHERE_QUARANTINE,
    WHERE_QUARANTINE_SETTLED,
    WHERE_LISTENER,
    WHERE_MIRROR,
    WHERE_PEERS,
    WHERE_SIDE_CHANNEL,
)


class RoomRuntime:
    """The pdwarden state of one KV manager (one role in one process)."""

    def __init__(self, config: HardeningConfig, role: str) -> None:
        if role not in (ROLE_PREFILL, ROLE_DECODE):
            raise ValueError(f"unknown role {role!r}")
        self.config = config
        self.role = role
        self.table = RoomStatusTable(mode=config.status_mode)
        deadline = config.inflight_deadline if config.has(Fix.INFLIGHT_DEADLINE) else None
        self.tracker = InflightTracker(self.table, deadline=deadline)
        self.threads = ThreadWatch()
        self.quarantine: HandleQuarantine | None = None
        # Decode rooms failed by the deadline: the engine must abort them and hold their
        # pages until prefill acknowledges the drain.
        self.decode_deadline_rooms: set[int] = set()
        # Decode: published rooms, and those held for their writer after their request ended.
        self.held_pages = HeldPages()
        # Pages of the KV pool the manager registered (None: unknown).
        self.pool_pages: int | None = None
        # Pages of that pool allocated now (None: the engine does not say).
        self.pages_in_use: Callable[[], int] | None = None
        self.metrics = RuntimeMetrics(
            role,
            self.table,
            self.tracker,
            engine=config.engine,
            transfer_backend=TRANSFER_BACKEND,
            expire_on_scrape=deadline is not None,
            threads=self.threads,
            quarantined=self.quarantined_handles,
            quarantine_endings=self.quarantine_endings,
            error_wheres=ERROR_WHERES,
            abandoned=self.abandoned_rooms,
            held_pages=self.held_pages if role == ROLE_DECODE else None,
            pool_pages=lambda: self.pool_pages,
            pages_in_use=lambda: self.pages_in_use() if self.pages_in_use is not None else None,
        )
        self.rooms = RoomStatusMap(self.table)
        self.ledger = RoomLedger()
        self.reaper: DeadlineReaper | None = None
        # Called (room) after a status write through the manager that changed the room's
        # status (a repeated write cannot satisfy a waiter): lets an engine wake the
        # request waiting on that room instead of polling on a timer.
        self.status_listeners: list[Callable[[int], None]] = []
        self.metrics_server: MetricsServer | None = None
        # Hardening events beyond the contract (the doctor and tests read them).
        self.handle_deadlines = 0
        self.peer_fast_fails = 0
        self.silent_skips_concluded = 0
        self.failure_notices = 0

    def notify(self, room: int) -> None:
        for listener in self.status_listeners:
            try:
                listener(room)
            except Exception:  # a listener's bug must not break a transfer thread
                self.count_error(WHERE_LISTENER)
                log.exception("status listener failed")

    def count_error(self, where: str) -> None:
        try:
            self.metrics.count_error(where)
        except Exception:  # counting must never be what breaks a thread
            log.exception("counting a runtime error failed")

    @contextmanager
    def guard(self, where: str) -> Iterator[None]:
        """Run pdwarden's own bookkeeping: an exception is logged, counted and swallowed,
        so the SGLang thread it runs on keeps going."""
        try:
            yield
        except Exception:
            self.count_error(where)
            log.exception("pdwarden hook %r failed; the thread continues", where)

    def quarantined_handles(self) -> int:
        return self.quarantine.count() if self.quarantine is not None else 0

    def abandoned_rooms(self) -> int:
        """Rooms whose request ended that this pod holds for a write that may still land."""
        if self.role == ROLE_DECODE:
            return self.held_pages.rooms()
        return self.quarantine.rooms() if self.quarantine is not None else 0

    def quarantine_endings(self) -> dict[str, int]:
        return self.quarantine.ended() if self.quarantine is not None else {}

    def start(self) -> None:
        """Start the deadline reaper and, if configured, this manager's /metrics server."""
        deadline = self.tracker.deadline
        if deadline is not None:
            self.reaper = self.tracker.start_reaper(interval=min(1.0, max(0.05, deadline / 10)))
            self.threads.watch(self.reaper.thread)
        if self.config.metrics_port is not None and self.config.has(Fix.METRICS):
            self.metrics_server = serve_metrics(
                self.metrics.registry, self.config.metrics_host, self.config.metrics_port
            )
            log.info("pdwarden metrics for %s served at %s", self.role, self.metrics_server.url)
        if self.config.on_metrics_registry is not None:
            self.config.on_metrics_registry(self.metrics.registry)

    def stop(self) -> None:
        if self.reaper is not None:
            self.reaper.stop()
        if self.metrics_server is not None:
            self.metrics_server.stop()

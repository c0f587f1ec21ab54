"""What one hardened KV manager owns: status table, inflight tracker, metrics, ledger."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from pdwarden_runtime.contract import ROLE_DECODE, ROLE_PREFILL
from pdwarden_runtime.hardening.config import HardeningConfig
from pdwarden_runtime.hardening.rooms import RoomLedger, RoomStatusMap
from pdwarden_runtime.inflight import DeadlineReaper, InflightTracker
from pdwarden_runtime.metrics import MetricsServer, RuntimeMetrics, serve_metrics
from pdwarden_runtime.status import RoomStatusTable

log = logging.getLogger(__name__)

TRANSFER_BACKEND: Final = "nixl"

class RoomRuntime:
    """The pdwarden state of one KV manager (one role in one process)."""

    def __init__(self, config: HardeningConfig, role: str) -> None:
        if role not in (ROLE_PREFILL, ROLE_DECODE):
            raise ValueError(f"unknown role {role!r}")
        self.config = config
        self.role = role
        self.table = RoomStatusTable(mode=config.status_mode)
        deadline = config.inflight_deadline if (config.has("D") and role == ROLE_PREFILL) else None
        self.tracker = InflightTracker(self.table, deadline=deadline)
        self.metrics = RuntimeMetrics(role, self.table, self.tracker, engine=config.engine,
                                      transfer_backend=TRANSFER_BACKEND,
                                      expire_on_scrape=deadline is not None)
        self.rooms = RoomStatusMap(self.table)
        self.ledger = RoomLedger()
        self.reaper: DeadlineReaper | None = None
        # Called (room) after every status write through the manager: lets an engine
        # wake the request waiting on that room instead of polling on a timer.
        self.status_listeners: list[Callable[[int], None]] = []
        self.metrics_server: MetricsServer | None = None
        # Hardening events beyond the contract (the doctor and tests read them).
        self.handle_deadlines = 0
        self.silent_skips_concluded = 0
        self.failure_notices = 0

    def notify(self, room: int) -> None:
        for listener in self.status_listeners:
            try:
                listener(room)
            except Exception:  # a listener's bug must not break a transfer thread
                log.exception("status listener failed")

    def start(self) -> None:
        """Start the deadline reaper and, if configured, this manager's /metrics server."""
        deadline = self.tracker.deadline
        if deadline is not None:
            self.reaper = self.tracker.start_reaper(interval=min(1.0, max(0.05, deadline / 10)))
        if self.config.metrics_port is not None and self.config.has("E"):
            self.metrics_server = serve_metrics(self.metrics.registry, self.config.metrics_host,
                                                self.config.metrics_port)
            log.info("pdwarden metrics for %s served at %s", self.role, self.metrics_server.url)
        if self.config.on_runtime is not None:
            self.config.on_runtime(self)

    def stop(self) -> None:
        if self.reaper is not None:
            self.reaper.stop()
        if self.metrics_server is not None:
            self.metrics_server.stop()

"""Decode refuses a writer before publishing pages to it: over its bound, or unproven.

Held pages (``held_pages``) are freed only on their writer's drain ACK or proof that it is
gone, never on a clock. A writer that never drains and is never gone (a process that is not
a pod of the model, one that keeps its address) would so take the whole pool, one request
at a time. Two refusals stop that before anything is published (no registration, no
metadata), each counted (``pdwarden_kv_writer_refused_total{peer,reason}``) and logged at
most once per ``LOG_INTERVAL_S`` per reason:

- ``held_pages_over_bound``: the pages held for the request's writer exceed
  ``HardeningConfig.held_pages_per_writer`` of the pool. Nothing held is freed: the bound
  only stops the pool from filling further; the writer's drain ACK or proof of its end
  brings it back under.
- ``unproven_route``: with the model's worker key, the writer's bootstrap server answered a
  rank's address without the proof of that answer (``bootstrap_guard``): it does not hold
  the model's key.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Final

from pdwarden_contract import WRITER_REFUSED_REASONS
from pdwarden_runtime.hardening.side_socket import DropLog

LOG_INTERVAL_S: Final = 10.0
REASON_OVER_BOUND: Final = (
    "pdwarden: pages held for prefill {peer} ({held}) are over this decode's bound ({bound} of "
    "{pool} pages) until it drains or is proven gone; request refused before publishing"
)
REASON_UNPROVEN_ROUTE: Final = (
    "pdwarden: the bootstrap server at {addr} answered without the proof of the model's key; "
    "nothing published to it"
)


def held_pages_bound(pool_pages: int | None, share: float) -> int | None:
    """Pages one writer may hold before its new requests are refused (None: the pool's size
    is unknown, so no bound)."""
    if pool_pages is None or pool_pages <= 0:
        return None
    return max(1, math.floor(pool_pages * share))


def over_bound(held: int, pool_pages: int | None, share: float) -> bool:
    """True when ``held`` pages for one writer exceed its bound."""
    bound = held_pages_bound(pool_pages, share)
    return bound is not None and held > bound


class WriterRefusals:
    """Counts and logs the refusals (thread-safe); ``counts`` for /debug/state."""

    def __init__(self, count: Callable[[str, str], None], clock: Callable[[], float] | None = None) -> None:
        self._count = count
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(WRITER_REFUSED_REASONS, 0)
        extra = {} if clock is None else {"clock": clock}
        self._logs = {
            reason: DropLog(
                f"pdwarden decode ({reason})",
                interval=LOG_INTERVAL_S,
                events="request(s) refused before publishing pages",
                **extra,
            )
            for reason in WRITER_REFUSED_REASONS
        }

    def refused(self, peer: str, reason: str, detail: str) -> bool:
        """Count one refusal of ``peer`` for ``reason``; True when this one was logged."""
        if reason not in self._counts:
            raise ValueError(f"unknown writer refusal reason {reason!r}")
        with self._lock:
            self._counts[reason] += 1
        self._count(peer, reason)
        return self._logs[reason].dropped(detail)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def over_bound_reason(peer: str, held: int, pool_pages: int, share: float) -> str:
    bound = held_pages_bound(pool_pages, share)
    return REASON_OVER_BOUND.format(peer=peer, held=held, bound=bound, pool=pool_pages)

"""Liveness of the threads a runtime depends on (SGLang's NIXL threads and pdwarden's own).

SGLang never restarts its NIXL threads: a bootstrap thread that died leaves every new
prefill room in Bootstrapping, a dead transfer worker strands its queue, a dead decode
listener never hears KV_STATUS. The watch records the Thread objects started while a KV
manager was built (so two managers in one process never count each other's threads),
names each by kind, and reports alive and expected counts per kind for the
``pdwarden_runtime_threads`` / ``pdwarden_runtime_threads_expected`` gauges.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import pdwarden_contract as contract

# Thread kinds, from the target's name that threading puts in a thread's default name
# ("Thread-7 (transfer_worker)") or an explicit name.
THREAD_KINDS: Final = {
    "bootstrap_thread_guarded": contract.THREAD_NIXL_BOOTSTRAP,
    "transfer_worker": contract.THREAD_NIXL_TRANSFER_WORKER,
    "decode_listener_thread": contract.THREAD_NIXL_DECODE_LISTENER,
    "HeartbeatChecker": contract.THREAD_NIXL_HEARTBEAT,
    "pdwarden-handle-quarantine": contract.THREAD_PDWARDEN_QUARANTINE,
    "pdwarden-deadline-reaper": contract.THREAD_PDWARDEN_DEADLINE_REAPER,
    "pdwarden-stock-mirror": contract.THREAD_PDWARDEN_STOCK_MIRROR,
}


_original_start = threading.Thread.start
_recorders: list[ThreadWatch] = []
_recorders_lock = threading.Lock()


def _recording_start(thread: threading.Thread) -> None:
    for watch in list(_recorders):
        watch.watch(thread)
    _original_start(thread)


def kind_of(thread: threading.Thread) -> str | None:
    name = thread.name
    for marker, kind in THREAD_KINDS.items():
        if name == marker or name.endswith(f"({marker})"):
            return kind
    return None


class ThreadWatch:
    """The threads of one runtime, by kind; expected = how many were started."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: list[tuple[str, threading.Thread]] = []

    def watch(self, thread: threading.Thread, kind: str | None = None) -> None:
        kind = kind or kind_of(thread)
        if kind is None:
            return
        with self._lock:
            if all(t is not thread for _, t in self._threads):
                self._threads.append((kind, thread))

    @contextmanager
    def record_started(self) -> Iterator[None]:
        """Watch every known-kind thread started inside the block (even one that dies at
        once: ``Thread.start`` is observed while the block runs)."""
        with _recorders_lock:
            _recorders.append(self)
            if len(_recorders) == 1:
                threading.Thread.start = _recording_start  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            with _recorders_lock:
                _recorders.remove(self)
                if not _recorders:
                    threading.Thread.start = _original_start  # type: ignore[method-assign]

    def expected(self) -> dict[str, int]:
        with self._lock:
            counts: dict[str, int] = {}
            for kind, _ in self._threads:
                counts[kind] = counts.get(kind, 0) + 1
            return counts

    def alive(self) -> dict[str, int]:
        with self._lock:
            counts = dict.fromkeys((kind for kind, _ in self._threads), 0)
            for kind, thread in self._threads:
                if thread.is_alive():
                    counts[kind] += 1
            return counts

    def dead(self) -> dict[str, tuple[int, int]]:
        """Kinds with fewer alive than expected: kind -> (alive, expected)."""
        alive, expected = self.alive(), self.expected()
        return {k: (alive.get(k, 0), n) for k, n in expected.items() if alive.get(k, 0) < n}

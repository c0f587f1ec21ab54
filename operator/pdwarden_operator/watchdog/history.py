"""A short, bounded, per-pod history of scrapes (in memory; rebuilt after a restart)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from pdwarden_operator.watchdog.parse import PodSample


@dataclass(frozen=True, slots=True)
class PodScrape:
    """One scrape of one pod at monotonic time `at`: a sample, or the error that prevented one."""

    at: float
    sample: PodSample | None
    error: str | None = None


class PodHistory:
    """Scrapes of one pod, oldest first, trimmed to what the wedge rule can use."""

    def __init__(self, keep_seconds: float, keep_min: int = 3, keep_max: int = 512) -> None:
        self.keep_seconds = keep_seconds
        self.keep_min = keep_min
        self._items: deque[PodScrape] = deque(maxlen=keep_max)

    def add(self, scrape: PodScrape) -> None:
        if self._items and scrape.at < self._items[-1].at:
            self._items.clear()  # the clock went backwards: start over rather than mis-measure
        self._items.append(scrape)
        horizon = scrape.at - self.keep_seconds
        while len(self._items) > self.keep_min and self._items[0].at < horizon:
            self._items.popleft()

    def observations(self) -> tuple[PodScrape, ...]:
        return tuple(self._items)

    def __len__(self) -> int:
        return len(self._items)


class Histories:
    """Per-pod histories keyed by pod UID (a replaced pod starts a fresh history)."""

    def __init__(self, keep_seconds: float) -> None:
        self.keep_seconds = keep_seconds
        self._by_pod: dict[str, PodHistory] = {}

    def set_keep_seconds(self, keep_seconds: float) -> None:
        self.keep_seconds = keep_seconds
        for history in self._by_pod.values():
            history.keep_seconds = keep_seconds

    def add(self, pod_uid: str, scrape: PodScrape) -> PodHistory:
        history = self._by_pod.get(pod_uid)
        if history is None:
            history = self._by_pod[pod_uid] = PodHistory(self.keep_seconds)
        history.add(scrape)
        return history

    def get(self, pod_uid: str) -> PodHistory | None:
        return self._by_pod.get(pod_uid)

    def pod_uids(self) -> list[str]:
        return list(self._by_pod)

    def retain(self, pod_uids: Iterable[str]) -> None:
        """Forget pods that no longer exist."""
        keep = set(pod_uids)
        for uid in [uid for uid in self._by_pod if uid not in keep]:
            del self._by_pod[uid]

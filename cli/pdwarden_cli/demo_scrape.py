"""Scrape the runtime pods and the operator like the chart's PodMonitor/ServiceMonitor would,
and keep the samples on a fixed time grid so promtool can replay them as input series.

Labels added per target mirror what prometheus-operator attaches: `namespace`, `pod`,
`job`, `instance` (and `model` from the pod label, as the PodMonitor's relabeling does).
The operator's own `namespace` label is kept (the ServiceMonitor's honorLabels).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import aiohttp

from pdwarden_bench import promtext
from pdwarden_runtime import contract

# The series the alert rules read: the contract's exposed names (not histogram parts).
KEPT_NAMES = frozenset(
    value
    for name, value in vars(contract).items()
    if name.startswith("METRIC_") and not name.endswith("_BASE") and isinstance(value, str)
)

SeriesKey = tuple[tuple[str, str], ...]  # sorted (label, value) pairs, __name__ included


@dataclass(frozen=True)
class Target:
    url: str
    labels: Mapping[str, str]  # job, instance, namespace, pod (and model for runtime pods)
    honor_labels: bool = False


@dataclass
class SeriesStore:
    """Samples on a grid of `step` seconds from `start` (wall clock)."""

    start: float
    step: float
    series: dict[SeriesKey, dict[int, float]] = field(default_factory=dict)

    def slot(self, at: float) -> int:
        return max(0, round((at - self.start) / self.step))

    def add(self, at: float, labels: Mapping[str, str], value: float) -> None:
        key = tuple(sorted(labels.items()))
        self.series.setdefault(key, {})[self.slot(at)] = value

    def last_slot(self) -> int:
        return max((max(slots) for slots in self.series.values() if slots), default=0)

    def input_series(self) -> list[dict[str, str]]:
        """promtool `input_series`: one entry per series, `_` where a scrape had no sample."""
        end = self.last_slot()
        out = []
        for key, slots in sorted(self.series.items()):
            labels = dict(key)
            name = labels.pop("__name__")
            body = ", ".join(f'{k}="{escape(v)}"' for k, v in sorted(labels.items()))
            values = " ".join(format_value(slots[i]) if i in slots else "_" for i in range(end + 1))
            out.append({"series": f"{name}{{{body}}}", "values": values})
        return out


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def format_value(value: float) -> str:
    if value != value:  # NaN
        return "NaN"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def parse_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The contract samples of one /metrics page: (name, labels, value)."""
    return [(s.name, s.labels, s.value) for s in promtext.samples(text, KEPT_NAMES)]


def target_labels(sample_labels: Mapping[str, str], target: Target) -> dict[str, str]:
    if target.honor_labels:
        return {**target.labels, **sample_labels}
    return {**sample_labels, **target.labels}


async def scrape_once(session: aiohttp.ClientSession, store: SeriesStore, targets: Iterable[Target]) -> int:
    """Scrape every target at one instant; returns how many answered."""
    at = time.time()
    targets = list(targets)

    async def one(target: Target) -> bool:
        try:
            async with session.get(target.url, timeout=aiohttp.ClientTimeout(total=2.0)) as resp:
                text = await resp.text() if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError):
            text = None
        store.add(at, {"__name__": "up", **target.labels}, 1.0 if text is not None else 0.0)
        if text is None:
            return False
        try:
            samples = parse_samples(text)
        except ValueError:
            return False
        for name, labels, value in samples:
            store.add(at, {"__name__": name, **target_labels(labels, target)}, value)
        return True

    results = await asyncio.gather(*(one(t) for t in targets))
    return sum(results)

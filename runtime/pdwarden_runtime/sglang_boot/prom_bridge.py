"""Contract metrics out of SGLang's processes, through prometheus_client multiprocess mode.

The hardened KV manager lives in SGLang's scheduler process(es) -- one per TP rank --
while the pod's `metrics` port is served by the launcher. SGLang already runs
prometheus_client in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, one mmap file per
process and metric type, merged at scrape time by ``MultiProcessCollector``); the
launcher sets that directory, so:

- pdwarden's own Counter/Histogram/Gauge objects in those processes land in the
  directory by themselves;
- the state-derived series that ``RuntimeMetrics`` computes at scrape time (a custom
  collector, invisible to multiprocess mode) are mirrored into it by
  ``MultiprocessBridge`` every second: gauges as ``max`` gauges (with TP > 1 every rank
  tracks the same rooms; the worst rank is the pod's truth), except the alive-thread
  gauge, a ``min`` gauge (each rank runs its own NIXL threads: a thread dead on any rank
  is dead for the pod, and the largest count would hide it), counters as counters
  (summed over processes). The bridge's periodic read also runs the inflight deadline
  that ``RuntimeMetrics`` enforces on scrape.

Both SGLang's own ``/metrics`` and the launcher's ``metrics`` port (``ContractCollector``,
only ``pdwarden_*`` families, no ``pid`` label) then show the contract metrics.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Iterator
from typing import Any, Final, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from pdwarden_contract import METRIC_RUNTIME_THREADS
from pdwarden_runtime.metrics import ContractRegistry, MetricsServer, serve_metrics

log = logging.getLogger(__name__)

CONTRACT_PREFIX: Final = "pdwarden_"
BRIDGE_INTERVAL_SECONDS: Final = 1.0
_PID_LABEL: Final = "pid"
# How the ranks' values of a mirrored gauge combine into the pod's (default: the worst,
# ``max``). Alive threads: the fewest alive on any rank ("min" keeps an exited rank's
# last value too, so a rank that died with a dead thread is not forgotten).
_GAUGE_MODES: Final[dict[str, Literal["min", "max"]]] = {METRIC_RUNTIME_THREADS: "min"}


def multiprocess_mode_active() -> bool:
    """Whether prometheus_client in THIS process writes to PROMETHEUS_MULTIPROC_DIR."""
    from prometheus_client import values

    return bool(getattr(values.ValueClass, "_multiprocess", False))


def _scrape_time_collectors(registry: CollectorRegistry) -> list[Collector]:
    """The registry's collectors whose values exist only at scrape time.

    Metric objects (Counter, Gauge, Histogram) write their own multiprocess files; the
    rest (custom collectors) need mirroring. prometheus_client has no public listing of
    a registry's collectors; ``_collector_to_names`` is stable across 0.1x-0.2x.
    """
    collectors = getattr(registry, "_collector_to_names", None)
    if collectors is None:
        raise RuntimeError("prometheus_client's CollectorRegistry changed: cannot list its collectors")
    return [col for col in list(collectors) if not isinstance(col, MetricWrapperBase)]


class MultiprocessBridge:
    """Mirrors a registry's scrape-time families into multiprocess-mode metrics."""

    def __init__(self, registry: CollectorRegistry, interval: float = BRIDGE_INTERVAL_SECONDS) -> None:
        if not multiprocess_mode_active():
            raise RuntimeError(
                "prometheus_client is not in multiprocess mode in this process: "
                "PROMETHEUS_MULTIPROC_DIR must be set before prometheus_client is imported"
            )
        self._registry = registry
        self._interval = interval
        self._gauges: dict[str, Gauge] = {}
        self._counters: dict[str, Counter] = {}
        self._last_counts: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._last_gauge_labels: dict[str, set[tuple[str, ...]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pdwarden-metrics-bridge", daemon=True)

    def start(self) -> MultiprocessBridge:
        self.flush()
        self._thread.start()
        atexit.register(self.flush)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.flush()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.flush()
            except Exception:  # a bad scrape must never end the bridge (or the scheduler)
                log.exception("pdwarden: mirroring contract metrics failed")

    def flush(self) -> None:
        """Mirror the current values now."""
        with self._lock:
            for collector in _scrape_time_collectors(self._registry):
                for family in collector.collect():
                    if family.type == "gauge":
                        self._mirror_gauge(family)
                    elif family.type == "counter":
                        self._mirror_counter(family)
                    else:
                        log.warning("pdwarden: cannot mirror %s family %s", family.type, family.name)

    def _mirror_gauge(self, family: Metric) -> None:
        seen: set[tuple[str, ...]] = set()
        for sample in family.samples:
            gauge = self._gauges.get(family.name)
            if gauge is None:
                gauge = self._gauges[family.name] = Gauge(
                    family.name,
                    family.documentation,
                    list(sample.labels),
                    registry=None,
                    multiprocess_mode=_GAUGE_MODES.get(family.name, "max"),
                )
            values = tuple(sample.labels.values())
            seen.add(values)
            _child(gauge, values).set(sample.value)
        # a label set that vanished (no rooms in that state any more) reads 0, not stale
        gauge = self._gauges.get(family.name)
        for values in self._last_gauge_labels.get(family.name, set()) - seen:
            if gauge is not None:
                _child(gauge, values).set(0)
        self._last_gauge_labels[family.name] = seen

    def _mirror_counter(self, family: Metric) -> None:
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue  # _created: per process, meaningless summed
            counter = self._counters.get(family.name)
            if counter is None:
                counter = self._counters[family.name] = Counter(
                    family.name, family.documentation, list(sample.labels), registry=None
                )
            key = (family.name, tuple(sample.labels.items()))
            child = _child(counter, tuple(sample.labels.values()))  # exists at 0 from the start
            delta = sample.value - self._last_counts.get(key, 0.0)
            if delta > 0:
                child.inc(delta)
                self._last_counts[key] = sample.value


def _child(metric: Any, values: tuple[str, ...]) -> Any:
    return metric.labels(*values) if values else metric


_bridges: dict[int, MultiprocessBridge] = {}
_bridges_lock = threading.Lock()


def bridge(registry: CollectorRegistry) -> MultiprocessBridge | None:
    """Export ``registry``'s contract metrics from this process, once per registry.

    A no-op (None) when this process is not in prometheus multiprocess mode, e.g. the
    synthetic engine, which serves its registry itself.
    """
    if not multiprocess_mode_active():
        return None
    with _bridges_lock:
        existing = _bridges.get(id(registry))
        if existing is None:
            existing = _bridges[id(registry)] = MultiprocessBridge(registry).start()
        return existing


# --- the launcher's side -------------------------------------------------------------
class ContractCollector(Collector):
    """The ``pdwarden_*`` families of a multiprocess directory, merged over processes.

    Gauges lose the ``pid`` label that multiprocess mode adds to ``all``-mode gauges
    (e.g. ``pdwarden_runtime_info``): one series per label set, the maximum.
    """

    def __init__(self, path: str) -> None:
        self._path = path

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.multiprocess import MultiProcessCollector

        for family in MultiProcessCollector(None, path=self._path).collect():
            if not family.name.startswith(CONTRACT_PREFIX):
                continue
            if family.type == "gauge":
                family.samples = _max_without_pid(family.samples)
            yield family


def _max_without_pid(samples: list[Sample]) -> list[Sample]:
    merged: dict[tuple[str, tuple[tuple[str, str], ...]], Sample] = {}
    for s in samples:
        labels = {k: v for k, v in s.labels.items() if k != _PID_LABEL}
        key = (s.name, tuple(sorted(labels.items())))
        if key not in merged or s.value > merged[key].value:
            merged[key] = s._replace(labels=labels)
    return list(merged.values())


def contract_registry(path: str) -> ContractRegistry:
    registry = ContractRegistry()
    registry.register(ContractCollector(path))
    return registry


def serve_contract_metrics(path: str, host: str, port: int) -> MetricsServer:
    """Serve the contract metrics found in multiprocess directory ``path`` at /metrics."""
    return serve_metrics(contract_registry(path), host, port)

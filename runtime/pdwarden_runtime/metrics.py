"""The runtime's Prometheus metrics (names from ``contract``), one registry per runtime.

State-derived series (inflight count and oldest age, rooms per state, conclusions per
outcome, refused writes) are read from the status table and the inflight tracker at
scrape time by a custom collector, so the hot path never touches a metric object and a
scrape always agrees with the table. Every label child is emitted from the first scrape
(value 0), so alerts and the operator's rate() see the series before anything happens.
A scrape also enforces the inflight deadline (``expire_on_scrape``).
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator
from importlib import metadata
from typing import TYPE_CHECKING, Any, Final
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, RestrictedRegistry

import pdwarden_contract as c
from pdwarden_runtime.inflight import InflightTracker
from pdwarden_runtime.kvpoll import KVPoll
from pdwarden_runtime.peers import PeerCounters

if TYPE_CHECKING:
    from pdwarden_runtime.hardening.held_pages import HeldPages
    from pdwarden_runtime.hardening.threads import ThreadWatch
from pdwarden_runtime.status import NON_TERMINAL, STICKY_TRANSITIONS, ClosedRoom, RoomStatusTable

if TYPE_CHECKING:
    from aiohttp import web

# KV transfer time from room open to conclusion: milliseconds (CPU, small) to minutes
# (a stalled peer cut by the deadline).
TRANSFER_SECONDS_BUCKETS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)

# Every refusal the sticky table can count, so each series exists at 0 from the start.
REFUSAL_LABELS: Final[tuple[tuple[str, str], ...]] = tuple(
    [(src.label, dst.label) for (src, dst), rule in STICKY_TRANSITIONS.items() if not rule.applies]
    + [(origin.label, dst.label) for origin in ClosedRoom for dst in KVPoll]
)


def pdwarden_version() -> str:
    try:
        return metadata.version("pdwarden")
    except metadata.PackageNotFoundError:
        return "0+unknown"


class RuntimeMetrics:
    """The contract metrics of one runtime (one role), in its own ContractRegistry."""

    def __init__(
        self,
        role: str,
        table: RoomStatusTable,
        tracker: InflightTracker,
        *,
        engine: str,
        transfer_backend: str,
        version: str | None = None,
        expire_on_scrape: bool = True,
        threads: ThreadWatch | None = None,
        quarantined: Callable[[], int] | None = None,
        quarantine_endings: Callable[[], dict[str, int]] | None = None,
        error_wheres: tuple[str, ...] = (),
        abandoned: Callable[[], int] | None = None,
        held_pages: HeldPages | None = None,
        pool_pages: Callable[[], int | None] | None = None,
        pages_in_use: Callable[[], int | None] | None = None,
    ) -> None:
        if role not in c.RUNTIME_ROLES:
            raise ValueError(f"unknown runtime role {role!r}; expected one of {c.RUNTIME_ROLES}")
        self.role = role
        self.registry = ContractRegistry()
        # Per-peer figures: the engine binds each room to its peer(s) once known.
        self.peers = PeerCounters()
        tracker.add_conclude_listener(self.peers.concluded)
        self._state = _StateCollector(
            role,
            table,
            tracker,
            expire_on_scrape,
            threads,
            quarantined,
            quarantine_endings,
            self.peers,
            abandoned,
            held_pages,
            pool_pages,
            pages_in_use,
        )
        self.registry.register(self._state)
        role_label = [c.LABEL_METRIC_ROLE]
        self._errors = Counter(
            c.METRIC_RUNTIME_ERRORS_BASE,
            "Exceptions caught in pdwarden's hooks around SGLang's queues and threads (the thread went on).",
            [c.LABEL_METRIC_ROLE, c.LABEL_METRIC_WHERE],
            registry=self.registry,
        )
        for where in error_wheres:
            self._errors.labels(role, where)
        self._verify_failures = Counter(
            c.METRIC_KV_VERIFY_FAILURES_BASE,
            "KV pages whose bytes did not match what prefill wrote (decode's page verification).",
            role_label,
            registry=self.registry,
        ).labels(role)
        self._bytes = Counter(
            c.METRIC_KV_TRANSFER_BYTES_BASE,
            "Bytes of KV moved by this runtime.",
            role_label,
            registry=self.registry,
        ).labels(role)
        self._seconds = Histogram(
            c.METRIC_KV_TRANSFER_SECONDS,
            "Seconds from a room's open to its conclusion.",
            role_label,
            buckets=TRANSFER_SECONDS_BUCKETS,
            registry=self.registry,
        ).labels(role)
        Gauge(
            c.METRIC_RUNTIME_INFO,
            "Identity of this runtime (value 1).",
            [c.LABEL_METRIC_ROLE, "version", "engine", "transfer_backend"],
            registry=self.registry,
        ).labels(role, version or pdwarden_version(), engine, transfer_backend).set(1)
        self._writer_refused = Counter(
            c.METRIC_KV_WRITER_REFUSED_BASE,
            "New decode requests refused before any page was published to their prefill, by "
            "writer (its IP; bounded, rest as 'other') and reason.",
            [c.LABEL_METRIC_ROLE, c.LABEL_METRIC_PEER, c.LABEL_METRIC_REASON],
            registry=self.registry,
        )
        self._refused_peers: set[str] = set()
        self._refused_lock = threading.Lock()
        tracker.add_conclude_listener(self._observe_conclusion)

    def count_writer_refused(self, peer: str, reason: str) -> None:
        """Count a request refused for its writer ``peer`` (a stranger may name any address:
        past ``_MAX_HELD_PEERS`` writers, the rest are counted under PEER_OTHER)."""
        if reason not in c.WRITER_REFUSED_REASONS:
            raise ValueError(f"unknown writer refusal reason {reason!r}")
        with self._refused_lock:
            if peer not in self._refused_peers and len(self._refused_peers) < _MAX_HELD_PEERS:
                self._refused_peers.add(peer)
            label = peer if peer in self._refused_peers else c.PEER_OTHER
        self._writer_refused.labels(self.role, label, reason).inc()

    def add_bytes(self, count: int) -> None:
        """Count KV bytes moved (call once per completed transfer or chunk)."""
        if count < 0:
            raise ValueError(f"transferred bytes must be >= 0, got {count}")
        self._bytes.inc(count)

    def count_error(self, where: str) -> None:
        self._errors.labels(self.role, where).inc()

    def add_verify_failures(self, pages: int) -> None:
        """Count corrupted KV pages found by decode's verification."""
        if pages > 0:
            self._verify_failures.inc(pages)

    def _observe_conclusion(self, room: int, outcome: str, seconds: float) -> None:
        self._seconds.observe(seconds)

    def exposition(self, names: Collection[str] = ()) -> tuple[bytes, str]:
        return exposition(self.registry, names)


class _StateCollector(Collector):
    """Reads the table and the tracker at scrape time."""

    def __init__(
        self,
        role: str,
        table: RoomStatusTable,
        tracker: InflightTracker,
        expire: bool,
        threads: ThreadWatch | None,
        quarantined: Callable[[], int] | None,
        quarantine_endings: Callable[[], dict[str, int]] | None = None,
        peers: PeerCounters | None = None,
        abandoned: Callable[[], int] | None = None,
        held_pages: HeldPages | None = None,
        pool_pages: Callable[[], int | None] | None = None,
        pages_in_use: Callable[[], int | None] | None = None,
    ) -> None:
        self._role = role
        self._table = table
        self._tracker = tracker
        self._expire = expire
        self._threads = threads
        self._quarantined = quarantined
        self._quarantine_endings = quarantine_endings
        self._peers = peers
        self._abandoned = abandoned
        self._held_pages = held_pages
        self._pool_pages = pool_pages
        self._pages_in_use = pages_in_use

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        if self._expire:
            self._tracker.expire()
        return self._families(with_samples=True)

    def _families(self, with_samples: bool = False) -> Iterator[Metric]:
        role, R = self._role, c.LABEL_METRIC_ROLE
        inflight = GaugeMetricFamily(
            c.METRIC_INFLIGHT_REQUESTS, "Rooms holding KV in flight (opened, not yet concluded).", labels=[R]
        )
        oldest = GaugeMetricFamily(
            c.METRIC_INFLIGHT_OLDEST_AGE, "Age of the oldest inflight room; 0 when none.", labels=[R]
        )
        rooms = GaugeMetricFamily(c.METRIC_KV_ROOMS, "Rooms per KV status.", labels=[R, c.LABEL_METRIC_STATE])
        transfers = CounterMetricFamily(
            c.METRIC_KV_TRANSFERS_BASE,
            "Rooms concluded, by outcome (the progress signal).",
            labels=[R, c.LABEL_METRIC_OUTCOME],
        )
        refused = CounterMetricFamily(
            c.METRIC_STATUS_WRITES_REFUSED_BASE,
            "Status writes the terminal-sticky rule refused, by from and to state.",
            labels=[R, c.LABEL_METRIC_FROM_STATE, c.LABEL_METRIC_TO_STATE],
        )
        in_state = GaugeMetricFamily(
            c.METRIC_KV_OLDEST_IN_STATE,
            "Seconds since the oldest room in each non-terminal state entered that state; 0 when none.",
            labels=[R, c.LABEL_METRIC_STATE],
        )
        threads = GaugeMetricFamily(
            c.METRIC_RUNTIME_THREADS,
            "Alive threads of this runtime, by kind.",
            labels=[R, c.LABEL_METRIC_THREAD],
        )
        threads_expected = GaugeMetricFamily(
            c.METRIC_RUNTIME_THREADS_EXPECTED,
            "Threads of each kind that should be alive (fewer alive = a dead essential thread).",
            labels=[R, c.LABEL_METRIC_THREAD],
        )
        quarantined = GaugeMetricFamily(
            c.METRIC_KV_HANDLES_QUARANTINED,
            "Transfer handles past the deadline that may still write, kept and polled until they end.",
            labels=[R],
        )
        endings = CounterMetricFamily(
            c.METRIC_KV_QUARANTINE_ENDINGS_BASE,
            "Quarantined transfer handles that ended, by how (done, error, peer_gone).",
            labels=[R, c.LABEL_METRIC_HOW],
        )
        peer_inflight = GaugeMetricFamily(
            c.METRIC_KV_PEER_INFLIGHT,
            "Rooms in flight per peer pod (by its IP; bounded, rest as 'other').",
            labels=[R, c.LABEL_METRIC_PEER],
        )
        peer_transfers = CounterMetricFamily(
            c.METRIC_KV_PEER_TRANSFERS_BASE,
            "Rooms concluded per peer pod and outcome (by its IP; bounded, rest as 'other').",
            labels=[R, c.LABEL_METRIC_PEER, c.LABEL_METRIC_OUTCOME],
        )
        abandoned = GaugeMetricFamily(
            c.METRIC_KV_ROOMS_ABANDONED,
            "Rooms whose request ended that this pod still holds for a write that may land "
            "(decode: pages until the prefill's drain ACK; prefill: rooms with quarantined handles).",
            labels=[R],
        )
        pages_held = GaugeMetricFamily(
            c.METRIC_KV_PAGES_HELD,
            "Decode pages held per writer for requests that ended (freed on its drain ACK or "
            "proof that it is gone, never on a timer).",
            labels=[R, c.LABEL_METRIC_PEER],
        )
        pages_held_seconds = GaugeMetricFamily(
            c.METRIC_KV_PAGES_HELD_SECONDS,
            "Seconds the oldest page held for each writer has been held.",
            labels=[R, c.LABEL_METRIC_PEER],
        )
        pool = GaugeMetricFamily(c.METRIC_KV_POOL_PAGES, "Pages of this pod's KV pool.", labels=[R])
        in_use = GaugeMetricFamily(
            c.METRIC_KV_PAGES_IN_USE, "Pages of this pod's KV pool allocated now.", labels=[R]
        )
        if with_samples:
            pages = self._pool_pages() if self._pool_pages is not None else None
            if pages is not None:
                pool.add_metric([role], pages)
            used = self._pages_in_use() if self._pages_in_use is not None else None
            if used is not None:
                in_use.add_metric([role], used)
            abandoned.add_metric([role], self._abandoned() if self._abandoned is not None else 0)
            if self._held_pages is not None:
                for peer, (pages, seconds) in sorted(_held_by_peer(self._held_pages).items()):
                    pages_held.add_metric([role, peer], pages)
                    pages_held_seconds.add_metric([role, peer], seconds)
            if self._peers is not None:
                figures = self._peers.snapshot()
                for peer, count in sorted(figures.inflight.items()):
                    peer_inflight.add_metric([role, peer], count)
                    for outcome, total in sorted(figures.outcomes.get(peer, {}).items()):
                        peer_transfers.add_metric([role, peer, outcome], total)
            ages = self._table.oldest_in_state()
            for state in NON_TERMINAL:
                in_state.add_metric([role, state.label], ages.get(state, 0.0))
            if self._threads is not None:
                expected = self._threads.expected()
                alive = self._threads.alive()
                # only the contract's kinds: the operator refuses a body naming any other
                for kind in sorted(set(expected) & set(c.RUNTIME_THREAD_KINDS)):
                    threads.add_metric([role, kind], alive.get(kind, 0))
                    threads_expected.add_metric([role, kind], expected[kind])
            quarantined.add_metric([role], self._quarantined() if self._quarantined is not None else 0)
            ended = self._quarantine_endings() if self._quarantine_endings is not None else {}
            for how in c.QUARANTINE_ENDINGS:
                endings.add_metric([role, how], ended.get(how, 0))
            inflight.add_metric([role], self._tracker.count())
            oldest.add_metric([role], self._tracker.oldest_age())
            for state, count in self._table.counts().items():
                rooms.add_metric([role, state.label], count)
            for outcome, count in self._tracker.outcomes().items():
                transfers.add_metric([role, outcome], count)
            counted = {(src.label, dst.label): n for (src, dst), n in self._table.refused().items()}
            for labels in REFUSAL_LABELS:
                refused.add_metric([role, *labels], counted.get(labels, 0))
        yield from (inflight, oldest, rooms, transfers, refused, in_state)
        yield from (threads, threads_expected, quarantined, endings, peer_inflight, peer_transfers)
        yield from (abandoned, pages_held, pages_held_seconds, pool, in_use)


# Held-page series per writer: the peers' bound (peers.py), the rest under PEER_OTHER.
_MAX_HELD_PEERS: Final = 32


def _held_by_peer(held: HeldPages) -> dict[str, tuple[int, float]]:
    """(pages, oldest hold in seconds) per writer; bounded like the per-peer figures."""
    out: dict[str, tuple[int, float]] = {}
    for entry in held.held():
        peer = entry.peer if entry.peer in out or len(out) < _MAX_HELD_PEERS else c.PEER_OTHER
        pages, seconds = out.get(peer, (0, 0.0))
        out[peer] = (pages + entry.pages, max(seconds, entry.seconds))
    return out


# --- serving -------------------------------------------------------------------------------
class _WholeFamilies(RestrictedRegistry):
    """The families of a registry with one of ``names`` as a sample name, each whole, one
    with no sample yet too: a labelled counter before its first child is only a TYPE line,
    which says the runtime has it (prometheus_client's own restriction drops it)."""

    def __init__(self, names: Iterable[str], registry: CollectorRegistry) -> None:
        self._names = frozenset(names)  # read once: `names` may be an iterator
        super().__init__(self._names, registry)
        self._source = registry

    def collect(self) -> Iterator[Metric]:
        names = self._names
        for family in self._source.collect():
            # a counter family is named without `_total`, its samples with it
            if (
                family.name in names
                or f"{family.name}_total" in names
                or any(sample.name in names for sample in family.samples)
            ):
                yield family


class ContractRegistry(CollectorRegistry):
    """A runtime's registry: a scrape that names metrics (``contract.METRICS_NAME_PARAM``, on
    this project's handlers and on prometheus_client's own server alike) gets their whole
    families."""

    def restricted_registry(self, names: Iterable[str]) -> RestrictedRegistry:
        return _WholeFamilies(names, self)


def exposition(registry: CollectorRegistry, names: Collection[str] = ()) -> tuple[bytes, str]:
    """The Prometheus text exposition of ``registry`` and its Content-Type; with ``names``, only
    the families those sample names belong to (whole in a ``ContractRegistry``)."""
    return generate_latest(registry.restricted_registry(names) if names else registry), CONTENT_TYPE_LATEST


def requested_names(request: web.Request) -> list[str]:
    """The sample names a scrape asks for (none: every family)."""
    return request.query.getall(c.METRICS_NAME_PARAM, [])


def metrics_handler(registry: CollectorRegistry) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An aiohttp handler serving ``registry``; mount it at ``contract.METRICS_PATH``."""
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        body, content_type = exposition(registry, requested_names(request))
        return web.Response(body=body, headers={"Content-Type": content_type})

    return handle


class MetricsServer:
    """A background HTTP server for one registry (``/metrics``); ``stop()`` ends it."""

    def __init__(self, httpd: WSGIServer, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread
        host, port = httpd.server_address[:2]
        self.host: str = str(host)
        self.port: int = int(port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{c.METRICS_PATH}"

    def stop(self, timeout: float = 5.0) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_metrics(
    registry: ContractRegistry, host: str = "127.0.0.1", port: int = c.DEFAULT_METRICS_PORT
) -> MetricsServer:
    """Serve ``registry`` over HTTP on host:port (port 0 picks a free one)."""
    httpd, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(httpd, thread)

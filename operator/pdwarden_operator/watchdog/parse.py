"""Runtime `/metrics` text -> the figures the wedge rule needs, or a ParseError.

Tolerant by construction: whatever the body (truncated, huge, wrong types, NaN, duplicate
series, binary junk), `parse_metrics` returns a `PodSample` or raises `ParseError`; nothing
else escapes. A pod whose body does not parse is *unobserved*, never wedged.

Bounded by construction too: the lines kept are few and short, and every label value kept
comes from a known set (the contract's outcomes, thread kinds and states; for `peer`, the
addresses of the model's own pods), so a hostile body can make the pod unobserved but cannot
make the operator keep what it sends.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Final

from pdwarden_contract import (
    KV_STATE_BOOTSTRAPPING,
    KV_STATE_TRANSFERRING,
    KV_STATES,
    LABEL_METRIC_OUTCOME,
    LABEL_METRIC_PEER,
    LABEL_METRIC_STATE,
    LABEL_METRIC_THREAD,
    METRIC_INFLIGHT_OLDEST_AGE,
    METRIC_INFLIGHT_REQUESTS,
    METRIC_KV_OLDEST_IN_STATE,
    METRIC_KV_PAGES_HELD,
    METRIC_KV_PAGES_HELD_SECONDS,
    METRIC_KV_PAGES_IN_USE,
    METRIC_KV_PEER_INFLIGHT,
    METRIC_KV_PEER_TRANSFERS_BASE,
    METRIC_KV_PEER_TRANSFERS_TOTAL,
    METRIC_KV_POOL_PAGES,
    METRIC_KV_ROOMS,
    METRIC_KV_ROOMS_ABANDONED,
    METRIC_KV_TRANSFERS_BASE,
    METRIC_KV_TRANSFERS_TOTAL,
    METRIC_RUNTIME_THREADS,
    METRIC_RUNTIME_THREADS_EXPECTED,
    OUTCOMES,
    PEER_OTHER,
    RUNTIME_THREAD_KINDS,
)
from pdwarden_operator.watchdog import exposition

# The one room state in which only a transfer fault holds a room (prefill sending; decode
# waiting for a prefill that stopped sending): rooms in the other states are queueing.
STUCK_STATE = KV_STATE_TRANSFERRING
# Rooms in this state wait on the peer (prefill: for decode's metadata; decode: for its
# prefill's bootstrap info): not the pod's own work, so no progress is owed for them.
WAITING_ON_PEER_STATE = KV_STATE_BOOTSTRAPPING

# A runtime pod's body is a few KiB; anything far bigger is hostile or broken.
DEFAULT_MAX_BYTES = 1 << 20
# Far above any real queue or age; larger values are treated as garbage, not as a wedge.
MAX_PLAUSIBLE_VALUE = 1e12

# family name as the parser reports it -> (sample name, allowed family types)
_GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    METRIC_INFLIGHT_REQUESTS: (METRIC_INFLIGHT_REQUESTS, ("gauge", "unknown")),
    METRIC_INFLIGHT_OLDEST_AGE: (METRIC_INFLIGHT_OLDEST_AGE, ("gauge", "unknown")),
}
# A counter's family is reported without `_total` when typed, with it when untyped.
_COUNTER_FAMILIES: dict[str, tuple[str, ...]] = {
    METRIC_KV_TRANSFERS_BASE: ("counter",),
    METRIC_KV_TRANSFERS_TOTAL: ("unknown",),
}
# Optional gauges: absent (an older runtime) means unknown, never an error.
_OPTIONAL_GAUGES = (METRIC_KV_ROOMS_ABANDONED, METRIC_KV_POOL_PAGES, METRIC_KV_PAGES_IN_USE)
# The sample names the watchdog reads: a scrape asks the pod for only these
# (`contract.METRICS_NAME_PARAM`), and only lines that start with one reach the parser.
METRICS_READ: Final = (
    METRIC_INFLIGHT_REQUESTS,
    METRIC_INFLIGHT_OLDEST_AGE,
    METRIC_KV_ROOMS,
    METRIC_KV_ROOMS_ABANDONED,
    METRIC_KV_TRANSFERS_TOTAL,
    METRIC_KV_OLDEST_IN_STATE,
    METRIC_RUNTIME_THREADS,
    METRIC_RUNTIME_THREADS_EXPECTED,
    METRIC_KV_PEER_INFLIGHT,
    METRIC_KV_PEER_TRANSFERS_TOTAL,
    METRIC_KV_PAGES_HELD,
    METRIC_KV_PAGES_HELD_SECONDS,
    METRIC_KV_PAGES_IN_USE,
    METRIC_KV_POOL_PAGES,
)
_HELD_FAMILIES = (METRIC_KV_PAGES_HELD, METRIC_KV_PAGES_HELD_SECONDS)
_PEER_TRANSFER_FAMILIES = (METRIC_KV_PEER_TRANSFERS_BASE, METRIC_KV_PEER_TRANSFERS_TOTAL)
# More peers than this in one body is garbage (the runtime caps its peers far below).
MAX_PEERS = 256
_THREAD_FAMILIES = (METRIC_RUNTIME_THREADS, METRIC_RUNTIME_THREADS_EXPECTED)
# A runtime's longest kept line is ~180 characters and its longest label value an IPv6 address
# (45); its kept series are under 300 (33 peer series x 7, thread kinds, states). Beyond these
# a body is garbage, refused before the parser sees it.
MAX_LINE_CHARS = 512
MAX_LABEL_VALUE_CHARS = 128
MAX_SERIES = 768
# label -> the values a runtime may write (`peer` is checked against the model's pods)
_KNOWN_VALUES: dict[str, frozenset[str]] = {
    LABEL_METRIC_OUTCOME: frozenset(OUTCOMES),
    LABEL_METRIC_THREAD: frozenset(RUNTIME_THREAD_KINDS),
    LABEL_METRIC_STATE: frozenset(KV_STATES),
}


class ParseError(ValueError):
    """The body cannot be trusted; the message names the problem."""


@dataclass(frozen=True, slots=True)
class PeerFigures:
    """Per-peer figures of one scrape (peer = the peer pod's IP): rooms in flight, and rooms
    concluded per outcome (counters)."""

    inflight: dict[str, float]
    outcomes: dict[str, dict[str, float]]
    # Decode pages held for each writer (requests that ended while it may still write), and
    # how long the oldest has been held.
    held: dict[str, float] = field(default_factory=dict)
    held_seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PodSample:
    """What one scrape says about a pod: queue depth, oldest room's age, finished rooms (all
    outcomes), and how long its oldest Transferring room has been in that state (None: the pod
    does not export the per-state age, so only the progress clause can judge it)."""

    inflight: float
    oldest_age: float
    transfers: float
    transferring_age: float | None = None
    # Thread kinds with fewer alive than expected: (kind, alive, expected). Empty when the
    # runtime exports no thread gauges (older runtimes) or every thread is alive.
    dead_threads: tuple[tuple[str, float, float], ...] = ()
    # Per-peer figures; None when the runtime exports none or they do not parse (pair-aware
    # blame then has no evidence from this pod; the pod itself is still judged).
    peers: PeerFigures | None = None
    # Inflight rooms still waiting on the peer (WAITING_ON_PEER_STATE), and rooms whose request
    # ended that the pod still holds for a writer; None when not exported.
    bootstrapping: float | None = None
    abandoned: float | None = None
    pool_pages: float | None = None  # pages of the pod's KV pool
    pages_in_use: float | None = None  # pages of that pool allocated now
    transferring: float | None = None  # rooms moving KV now (None: per-state rooms not exported)

    @property
    def working(self) -> float:
        """Inflight rooms the pod itself must move (waiting for or moving KV): what the
        progress clause judges. Rooms waiting on the peer are the peer's to advance."""
        if self.bootstrapping is None:
            return self.inflight
        return max(0.0, self.inflight - self.bootstrapping)


# The kept lines, found by one expression over the whole body (a Python loop over every
# line cost nearly twice as much): a sample of a contract metric, or a TYPE comment about
# one, whose words are split as `str.split()` splits them (as prometheus_client reads
# comments). HELP comments are left out: the watchdog never reads a family's documentation,
# and they were a third of the kept lines. Each match starts at a line's "\n", a literal the
# expression engine finds fast.
def _prefix_pattern(prefixes: Collection[str]) -> str:
    """An expression matching a string that starts with one of `prefixes`, as a tree of their
    shared starts (one alternative per character where they part, not one per prefix: a line
    that starts with none is given up after a few characters)."""
    tree: dict[str, Any] = {}
    for prefix in sorted(prefixes, key=len):  # shorter first: a longer one it starts is covered
        node = tree
        for char in prefix:
            if node.get("") is not None:
                break
            node = node.setdefault(char, {})
        else:
            node.clear()
            node[""] = {}

    def alternatives(node: dict[str, Any]) -> str:
        if "" in node:
            return ""
        branches = [re.escape(char) + alternatives(child) for char, child in sorted(node.items())]
        return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"

    return alternatives(tree)


_NAMES = _prefix_pattern(METRICS_READ)
_KEPT_LINE = re.compile(rf"\n((?:{_NAMES})[^\n]*|#\S*[^\S\n]+TYPE[^\S\n]+(?:{_NAMES})[^\n]*)")


def _relevant_lines(text: str) -> list[str]:
    """The lines about the contract's metrics (samples, and their TYPE comments),
    each short (their label values are checked as the parser reads them, `_check_labels`)."""
    keep: list[str] = _KEPT_LINE.findall("\n" + text)
    if len(keep) <= MAX_SERIES and max(map(len, keep), default=0) <= MAX_LINE_CHARS:
        return keep  # within both limits: no line to name
    series = 0
    for line in keep:
        if not line.startswith("#"):
            series += 1
            if series > MAX_SERIES:
                raise ParseError(f"more than {MAX_SERIES} series of the contract's metrics")
        if len(line) > MAX_LINE_CHARS:
            raise ParseError(f"a line of {len(line)} characters ({line[:40]!r}...), at most {MAX_LINE_CHARS}")
    return keep


def _check_labels(family: Any, peers: Collection[str] | None) -> None:
    """Every label value of the parsed family, as the parser read it: bounded and from its known
    set (`peer`: the model's pods), else the pod is unobserved. Checked here in one loop, not a
    call per value: it runs for every label of every kept line of every scrape."""
    for sample in family.samples:
        for label, value in sample.labels.items():
            if len(value) > MAX_LABEL_VALUE_CHARS:
                raise ParseError(
                    f"{sample.name[:60]}: label {label[:40]!r} has a value of {len(value)} characters, "
                    f"at most {MAX_LABEL_VALUE_CHARS}"
                )
            known = _KNOWN_VALUES.get(label)
            if known is not None and value not in known:
                raise ParseError(f"{sample.name[:60]}: {label} {value[:40]!r} is not one of the contract's")
            if (
                label == LABEL_METRIC_PEER
                and peers is not None
                and value != PEER_OTHER
                and value not in peers
            ):
                raise ParseError(f"{sample.name[:60]}: peer {value[:40]!r} is not a pod of this model")


def _checked(name: str, value: float) -> float:
    if type(value) is float and 0.0 <= value <= MAX_PLAUSIBLE_VALUE:  # NaN compares False
        return value
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ParseError(f"{name}: value {value!r} is not a number")
    if math.isnan(value) or math.isinf(value):
        raise ParseError(f"{name}: value {value} is not finite")
    if value < 0:
        raise ParseError(f"{name}: negative value {value}")
    if value > MAX_PLAUSIBLE_VALUE:
        raise ParseError(f"{name}: implausible value {value:g}")
    return float(value)


def parse_metrics(
    body: str | bytes | bytearray, *, max_bytes: int = DEFAULT_MAX_BYTES, peers: Collection[str] | None = None
) -> PodSample:
    """Parse a runtime pod's metrics body. Raises only ParseError.

    `peers`: the addresses a `peer` label may name (the model's pods; `other` is always
    allowed); None leaves them unchecked (a tool reading one pod on its own)."""
    try:
        return _parse(body, max_bytes, peers)
    except ParseError:
        raise
    except Exception as exc:  # the parser raises ValueError, IndexError, ... on junk
        raise ParseError(f"unparseable metrics: {type(exc).__name__}: {str(exc)[:120]}") from None


def _parse(body: str | bytes | bytearray, max_bytes: int, peers: Collection[str] | None) -> PodSample:
    if len(body) > max_bytes:
        raise ParseError(f"body of {len(body)} bytes exceeds the limit of {max_bytes}")
    if isinstance(body, (bytes, bytearray)):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise ParseError("body is not UTF-8") from None
    else:
        text = body
    if "\x00" in text:
        raise ParseError("body contains NUL bytes")

    gauges: dict[str, list[float]] = {name: [] for name in _GAUGES}
    transfers: list[float] = []
    transfers_declared = False  # a labelled counter with no child yet exposes only its TYPE line
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    in_state: list[float] | None = None
    threads: dict[str, dict[str, float]] = {name: {} for name in _THREAD_FAMILIES}
    peer_families: list[Any] = []
    per_state: dict[str, float] | None = None
    optional: dict[str, list[float]] = {name: [] for name in _OPTIONAL_GAUGES}
    for family in exposition.families(_relevant_lines(text)):
        _check_labels(family, peers)
        if (
            family.name == METRIC_KV_PEER_INFLIGHT
            or family.name in _PEER_TRANSFER_FAMILIES
            or family.name in _HELD_FAMILIES
        ):
            peer_families.append(family)
            continue
        if family.name in threads:
            if family.type not in ("gauge", "unknown"):
                raise ParseError(f"{family.name}: type {family.type!r}, expected gauge")
            by_kind = threads[family.name]
            for sample in family.samples:
                if sample.name == family.name:
                    kind = sample.labels.get(LABEL_METRIC_THREAD, "")
                    by_kind[kind] = by_kind.get(kind, 0.0) + _checked(sample.name, sample.value)
            continue
        if family.name == METRIC_KV_ROOMS:
            # an untyped body's samples are families of one each: every one counts
            per_state = {} if per_state is None else per_state
            _add_per_state(family, seen, per_state)
            continue
        if family.name in optional:
            if family.type not in ("gauge", "unknown"):
                raise ParseError(f"{family.name}: type {family.type!r}, expected a gauge")
            for sample in family.samples:
                if sample.name == family.name:
                    optional[family.name].append(_checked(sample.name, sample.value))
            continue
        if family.name == METRIC_KV_OLDEST_IN_STATE:
            if family.type not in ("gauge", "unknown"):
                raise ParseError(f"{family.name}: type {family.type!r}, expected a gauge")
            in_state = in_state or []
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if sample.name != family.name:
                    continue
                if key in seen:
                    raise ParseError(f"{sample.name}: duplicate series {dict(key[1])}")
                seen.add(key)
                value = _checked(sample.name, sample.value)
                if sample.labels.get(LABEL_METRIC_STATE) == STUCK_STATE:
                    in_state.append(value)
            continue
        if family.name in _GAUGES:
            sample_name, types = _GAUGES[family.name]
            target = gauges[family.name]
        elif family.name in _COUNTER_FAMILIES:
            sample_name, types = METRIC_KV_TRANSFERS_TOTAL, _COUNTER_FAMILIES[family.name]
            target = transfers
            transfers_declared = True
        else:
            continue
        if family.type not in types:
            raise ParseError(f"{family.name}: type {family.type!r}, expected one of {types}")
        for sample in family.samples:
            if sample.name != sample_name:
                continue
            key = (sample.name, tuple(sorted(sample.labels.items())))
            if key in seen:
                raise ParseError(f"{sample.name}: duplicate series {dict(key[1])}")
            seen.add(key)
            target.append(_checked(sample.name, sample.value))

    for name, values in gauges.items():
        if not values:
            raise ParseError(f"metric {name} missing")
    if not transfers_declared:
        raise ParseError(f"metric {METRIC_KV_TRANSFERS_TOTAL} missing")
    inflight = sum(gauges[METRIC_INFLIGHT_REQUESTS])
    # The age only means something while a request is in flight (the two gauges are read
    # at slightly different instants, so a just-emptied queue may still show an age).
    oldest_age = max(gauges[METRIC_INFLIGHT_OLDEST_AGE]) if inflight > 0 else 0.0
    transferring_age: float | None = None
    if in_state is not None:  # exported: no Transferring series (or an idle pod) means age 0
        transferring_age = max(in_state, default=0.0) if inflight > 0 else 0.0
    bootstrapping: float | None = None
    if per_state is not None:
        # read with inflight from one scrape; never more than inflight (the gauges are read
        # at slightly different instants)
        bootstrapping = min(inflight, per_state.get(WAITING_ON_PEER_STATE, 0.0))
    abandoned = optional[METRIC_KV_ROOMS_ABANDONED]
    pool = optional[METRIC_KV_POOL_PAGES]
    in_use = optional[METRIC_KV_PAGES_IN_USE]
    return PodSample(
        inflight=inflight,
        oldest_age=oldest_age,
        transfers=sum(transfers),
        transferring_age=transferring_age,
        dead_threads=_dead_threads(threads[METRIC_RUNTIME_THREADS], threads[METRIC_RUNTIME_THREADS_EXPECTED]),
        peers=_peer_figures(peer_families),
        bootstrapping=bootstrapping,
        abandoned=sum(abandoned) if abandoned else None,
        pool_pages=max(pool) if pool else None,
        pages_in_use=sum(in_use) if in_use else None,
        transferring=None if per_state is None else min(inflight, per_state.get(STUCK_STATE, 0.0)),
    )


def _add_per_state(
    family: Any, seen: set[tuple[str, tuple[tuple[str, str], ...]]], counts: dict[str, float]
) -> None:
    """The family's rooms added to `counts` (rooms per state); a state label outside the
    contract's is garbage."""
    if family.type not in ("gauge", "unknown"):
        raise ParseError(f"{family.name}: type {family.type!r}, expected a gauge")
    for sample in family.samples:
        if sample.name != family.name:
            continue
        key = (sample.name, tuple(sorted(sample.labels.items())))
        if key in seen:
            raise ParseError(f"{sample.name}: duplicate series {dict(key[1])}")
        seen.add(key)
        state = sample.labels.get(LABEL_METRIC_STATE, "")
        if state not in KV_STATES:
            raise ParseError(f"{sample.name}: unknown state {state[:40]!r}")
        counts[state] = counts.get(state, 0.0) + _checked(sample.name, sample.value)


def _peer_figures(families: list[Any]) -> PeerFigures | None:
    """The per-peer families, or None when absent or not trustworthy (never an error: a bad
    per-peer series must not make the pod unobserved, only leave blame without evidence)."""
    if not families:
        return None
    inflight: dict[str, float] = {}
    outcomes: dict[str, dict[str, float]] = {}
    held: dict[str, dict[str, float]] = {name: {} for name in _HELD_FAMILIES}
    try:
        for family in families:
            if family.name in held:
                if family.type not in ("gauge", "unknown"):
                    return None
                for sample in family.samples:
                    peer = sample.labels.get(LABEL_METRIC_PEER)
                    if sample.name != family.name or not peer or peer in held[family.name]:
                        return None
                    held[family.name][peer] = _checked(sample.name, sample.value)
                continue
            if family.name == METRIC_KV_PEER_INFLIGHT:
                if family.type not in ("gauge", "unknown"):
                    return None
                for sample in family.samples:
                    peer = sample.labels.get(LABEL_METRIC_PEER)
                    if sample.name != family.name or not peer or peer in inflight:
                        return None
                    inflight[peer] = _checked(sample.name, sample.value)
            else:
                if family.type not in ("counter", "unknown"):
                    return None
                for sample in family.samples:
                    if sample.name != METRIC_KV_PEER_TRANSFERS_TOTAL:
                        continue
                    peer = sample.labels.get(LABEL_METRIC_PEER)
                    outcome = sample.labels.get(LABEL_METRIC_OUTCOME)
                    if not peer or not outcome or outcome in outcomes.get(peer, {}):
                        return None
                    outcomes.setdefault(peer, {})[outcome] = _checked(sample.name, sample.value)
    except ParseError:
        return None
    if max(len(inflight), len(outcomes), *(len(d) for d in held.values())) > MAX_PEERS:
        return None
    return PeerFigures(
        inflight=inflight,
        outcomes=outcomes,
        held=held[METRIC_KV_PAGES_HELD],
        held_seconds=held[METRIC_KV_PAGES_HELD_SECONDS],
    )


def _dead_threads(
    alive: dict[str, float], expected: dict[str, float]
) -> tuple[tuple[str, float, float], ...]:
    """Thread kinds whose alive gauge is below its expected gauge (optional metrics: none
    exported means none judged)."""
    short = ((kind, alive.get(kind, 0.0), want) for kind, want in expected.items())
    return tuple(sorted(entry for entry in short if entry[1] < entry[2]))

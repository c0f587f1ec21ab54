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

import functools
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
    except Exception as exc:  # never expected: a bug must leave the pod unobserved, not end the round
        raise ParseError(f"unparseable metrics: {type(exc).__name__}: {str(exc)[:120]}") from None


# The kept lines are read in one pass, straight into the figures: a sample line by a few
# compiled expressions (remembered by its text), a TYPE comment by `str.split` (as
# prometheus_client reads comments). Samples are grouped into families exactly as
# prometheus_client's `text_string_to_metric_families` groups them (a family declared by a
# TYPE line holds the samples of its names that follow it; any other sample is a family of its
# own, untyped), so a body means here what it means to Prometheus; tests/unit/
# test_watchdog_parse_equal.py holds this parser to the one it replaced over real and fuzzed
# bodies. It is stricter on form: a sample line is `name{labels} value [timestamp]` and
# nothing else, so a line the library would read loosely is garbage here (the pod unobserved).
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_QUOTED = r'"(?:[^"\\]|\\.)*"'
_PAIR = rf"[ \t]*{_LABEL_NAME}[ \t]*=[ \t]*{_QUOTED}[ \t]*"
_METRIC_NAME = re.compile(_NAME)
# name, the label block (pairs, an optional trailing comma), value, optional timestamp
_BLOCK = rf"(?:{_PAIR}(?:,{_PAIR})*,?)?[ \t]*"
_SAMPLE = re.compile(rf"({_NAME})[ \t]*(?:\{{({_BLOCK})\}})?[ \t]+(\S+)(?:[ \t]+(\S+))?")
_LABEL = re.compile(rf"[ \t]*({_LABEL_NAME})[ \t]*=[ \t]*({_QUOTED})")
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
# The sample names a declared family holds: its name plus these suffixes.
_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("",),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}
# A TYPE line's word -> the family type prometheus_client reports (its METRIC_TYPES).
_TYPES: dict[str, str] = {
    typ: typ
    for typ in ("counter", "gauge", "summary", "histogram", "gaugehistogram", "unknown", "info", "stateset")
} | {"untyped": "unknown"}
_GAUGE_TYPES = ("gauge", "unknown")

# Sample lines remembered (about 500 bytes each): the lines that read the same in every pod
# of a role (threads, idle states, pool size) stay; lines whose values move are replaced.
SAMPLE_CACHE_LINES = 4096
# Comment lines remembered: the runtime's TYPE lines, the same in every body.
COMMENT_CACHE_LINES = 256

# One sample line read: (name, labels, value, its series: the labels sorted, its `peer` label).
_Sample = tuple[str, dict[str, str], float, tuple[tuple[str, str], ...], str | None]


def _number(text: str, line: str) -> float:
    if "_" in text:  # float() would take `1_000`; the text format does not
        raise ParseError(f"value {text[:40]!r} in {line[:60]!r}")
    try:
        return float(text)
    except ValueError:
        raise ParseError(f"value {text[:40]!r} in {line[:60]!r}") from None


@functools.lru_cache(maxsize=SAMPLE_CACHE_LINES)
def _sample(line: str) -> _Sample:
    """One sample line: `name{label="value",...} value [timestamp]`, its label values bounded
    and from their known sets (`peer`'s is checked against the model's pods by the caller).
    Remembered by its text: most lines of a pod's body (states, pool, idle peers) read the same
    scrape after scrape and pod after pod. Its labels are never changed by a reader."""
    match = _SAMPLE.fullmatch(line)
    if match is None:
        raise ParseError(f"not a sample line: {line[:60]!r}")
    name, block, value, timestamp = match.groups()
    labels: dict[str, str] = {}
    if block:
        for label, quoted in _LABEL.findall(block):
            if label in labels or label.startswith("__"):
                raise ParseError(f"label {label[:40]!r} repeated or reserved in {line[:60]!r}")
            text = quoted[1:-1]
            if "\\" in text:
                text = _ESCAPE.sub(lambda m: _UNESCAPED[m.group(0)], text)
            if len(text) > MAX_LABEL_VALUE_CHARS:
                raise ParseError(
                    f"{name[:60]}: label {label[:40]!r} has a value of {len(text)} characters, "
                    f"at most {MAX_LABEL_VALUE_CHARS}"
                )
            known = _KNOWN_VALUES.get(label)
            if known is not None and text not in known:
                raise ParseError(f"{name[:60]}: {label} {text[:40]!r} is not one of the contract's")
            labels[label] = text
    if timestamp is not None:
        _number(timestamp, line)  # a number, though nothing reads it
    series = tuple(sorted(labels.items())) if len(labels) > 1 else tuple(labels.items())
    return name, labels, _number(value, line), series, labels.get(LABEL_METRIC_PEER)


@functools.lru_cache(maxsize=COMMENT_CACHE_LINES)
def _comment(line: str) -> tuple[str, str, str, tuple[str, ...]] | None:
    """A comment line: ("TYPE", name, type, the sample names its family holds) or ("HELP", name,
    "untyped", (name,)); None for any other comment. Remembered by its text: every pod sends the
    same comments every scrape."""
    parts = line.split(None, 3)
    if len(parts) < 3 or parts[1] not in ("TYPE", "HELP"):
        return None
    keyword, candidate = parts[1], parts[2]
    if _METRIC_NAME.fullmatch(candidate) is None:
        raise ParseError(f"metric name {candidate[:60]!r}")
    if keyword == "HELP":
        return keyword, candidate, "untyped", (candidate,)  # its documentation is never read
    if len(parts) < 4:
        raise ParseError(f"TYPE line without a type: {line[:60]!r}")
    typ = parts[3]
    return keyword, candidate, typ, tuple(candidate + suffix for suffix in _SUFFIXES.get(typ, ("",)))


# (family name as prometheus_client reports it, its type, its samples)
_Family = tuple[str, str, list[_Sample]]


def _family(name: str, typ: str, samples: list[_Sample]) -> _Family:
    # as prometheus_client reports a counter: the family without `_total`, its samples with it
    if typ == "counter":
        if name.endswith("_total"):
            name = name[:-6]
        else:
            samples = [(s[0] + "_total", *s[1:]) for s in samples]
    if not name:  # `_total` alone: names are checked by the expressions that read them
        raise ParseError("a counter named `_total`")
    reported = _TYPES.get(typ, "")
    if not reported:
        raise ParseError(f"{name[:60]}: unknown type")
    return name, reported, samples


def _families(lines: list[str], peers: Collection[str] | None) -> list[_Family]:
    """The kept lines' families; every sample's labels checked (`peer`: the model's pods)."""
    out: list[_Family] = []
    name, typ = "", "untyped"
    samples: list[_Sample] = []
    allowed: tuple[str, ...] = ()
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if line[0] != "#":
            sample = _sample(line)
            peer = sample[4]
            if peer is not None and peers is not None and peer != PEER_OTHER and peer not in peers:
                raise ParseError(f"{sample[0][:60]}: peer {peer[:40]!r} is not a pod of this model")
            if sample[0] in allowed:
                samples.append(sample)
                continue
            if name:
                out.append(_family(name, typ, samples))
            name, typ, samples, allowed = "", "untyped", [], ()
            out.append(_family(sample[0], "untyped", [sample]))  # undeclared: a family of its own
            continue
        comment = _comment(line)
        if comment is None:
            continue
        keyword, candidate, declared, names = comment
        if candidate != name:
            if name:
                out.append(_family(name, typ, samples))
            name, samples = candidate, []
        elif keyword == "HELP":  # never kept (`_relevant_lines`); read as the library reads one
            continue  # the family goes on as it was declared
        typ, allowed = declared, names
    if name:
        out.append(_family(name, typ, samples))
    return out


def _series(sample: _Sample, seen: set[tuple[str, tuple[tuple[str, str], ...]]]) -> None:
    """A series read once per body; a second is garbage."""
    key = (sample[0], sample[3])
    if key in seen:
        raise ParseError(f"{sample[0]}: duplicate series {dict(sample[3])}")
    seen.add(key)


def _gauge_type(name: str, typ: str) -> None:
    if typ not in _GAUGE_TYPES:
        raise ParseError(f"{name}: type {typ!r}, expected a gauge")


# What each family the watchdog reads is, by its name as reported
_GAUGE, _COUNTER, _STATES, _IN_STATE, _THREADS, _OPTIONAL, _PEER = range(7)
_KINDS: dict[str, int] = (
    dict.fromkeys(_GAUGES, _GAUGE)
    | dict.fromkeys(_COUNTER_FAMILIES, _COUNTER)
    | {METRIC_KV_ROOMS: _STATES, METRIC_KV_OLDEST_IN_STATE: _IN_STATE}
    | dict.fromkeys(_THREAD_FAMILIES, _THREADS)
    | dict.fromkeys(_OPTIONAL_GAUGES, _OPTIONAL)
    | dict.fromkeys((METRIC_KV_PEER_INFLIGHT, *_PEER_TRANSFER_FAMILIES, *_HELD_FAMILIES), _PEER)
)


def _text(body: str | bytes | bytearray, max_bytes: int) -> str:
    """The body as text, within the size limit, UTF-8 and without NUL bytes."""
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
    return text


@dataclass(slots=True)
class _Read:
    """What one body's families added up to so far (`_READERS` fill it, `sample` ends it)."""

    gauges: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in _GAUGES})
    transfers: list[float] = field(default_factory=list)
    transfers_declared: bool = False  # a labelled counter with no child yet exposes only its TYPE line
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = field(default_factory=set)
    in_state: list[float] | None = None
    threads: dict[str, dict[str, float]] = field(default_factory=lambda: {n: {} for n in _THREAD_FAMILIES})
    peer_families: list[_Family] = field(default_factory=list)
    per_state: dict[str, float] | None = None
    optional: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in _OPTIONAL_GAUGES})

    def sample(self) -> PodSample:
        for name, values in self.gauges.items():
            if not values:
                raise ParseError(f"metric {name} missing")
        if not self.transfers_declared:
            raise ParseError(f"metric {METRIC_KV_TRANSFERS_TOTAL} missing")
        inflight = sum(self.gauges[METRIC_INFLIGHT_REQUESTS])
        # The age only means something while a request is in flight (the two gauges are read
        # at slightly different instants, so a just-emptied queue may still show an age).
        oldest_age = max(self.gauges[METRIC_INFLIGHT_OLDEST_AGE]) if inflight > 0 else 0.0
        transferring_age: float | None = None
        if self.in_state is not None:  # exported: no Transferring series (or an idle pod) means age 0
            transferring_age = max(self.in_state, default=0.0) if inflight > 0 else 0.0
        per_state, bootstrapping = self.per_state, None
        if per_state is not None:
            # read with inflight from one scrape; never more than inflight (the gauges are read
            # at slightly different instants)
            bootstrapping = min(inflight, per_state.get(WAITING_ON_PEER_STATE, 0.0))
        abandoned = self.optional[METRIC_KV_ROOMS_ABANDONED]
        pool = self.optional[METRIC_KV_POOL_PAGES]
        in_use = self.optional[METRIC_KV_PAGES_IN_USE]
        threads = self.threads
        return PodSample(
            inflight=inflight,
            oldest_age=oldest_age,
            transfers=sum(self.transfers),
            transferring_age=transferring_age,
            dead_threads=_dead_threads(
                threads[METRIC_RUNTIME_THREADS], threads[METRIC_RUNTIME_THREADS_EXPECTED]
            ),
            peers=_peer_figures(self.peer_families),
            bootstrapping=bootstrapping,
            abandoned=sum(abandoned) if abandoned else None,
            pool_pages=max(pool) if pool else None,
            pages_in_use=sum(in_use) if in_use else None,
            transferring=None if per_state is None else min(inflight, per_state.get(STUCK_STATE, 0.0)),
        )


def _read_gauge(read: _Read, family: _Family) -> None:
    name, typ, samples = family
    _read_values(read, name, typ, samples, name, _GAUGES[name][1], read.gauges[name])


def _read_counter(read: _Read, family: _Family) -> None:
    name, typ, samples = family
    read.transfers_declared = True
    types = _COUNTER_FAMILIES[name]
    _read_values(read, name, typ, samples, METRIC_KV_TRANSFERS_TOTAL, types, read.transfers)


def _read_values(
    read: _Read,
    name: str,
    typ: str,
    samples: list[_Sample],
    sample_name: str,
    types: tuple[str, ...],
    target: list[float],
) -> None:
    if typ not in types:
        raise ParseError(f"{name}: type {typ!r}, expected one of {types}")
    for sample in samples:
        if sample[0] == sample_name:
            _series(sample, read.seen)
            target.append(_checked(sample_name, sample[2]))


def _read_states(read: _Read, family: _Family) -> None:
    name, typ, samples = family
    # an untyped body's samples are families of one each: every one counts
    _gauge_type(name, typ)
    per_state = read.per_state = {} if read.per_state is None else read.per_state
    for sample in samples:
        if sample[0] != name:
            continue
        _series(sample, read.seen)
        state = sample[1].get(LABEL_METRIC_STATE, "")
        if state not in KV_STATES:
            raise ParseError(f"{name}: unknown state {state[:40]!r}")
        per_state[state] = per_state.get(state, 0.0) + _checked(name, sample[2])


def _read_in_state(read: _Read, family: _Family) -> None:
    name, typ, samples = family
    _gauge_type(name, typ)
    in_state = read.in_state = read.in_state or []
    for sample in samples:
        if sample[0] != name:
            continue
        _series(sample, read.seen)
        value = _checked(name, sample[2])
        if sample[1].get(LABEL_METRIC_STATE) == STUCK_STATE:
            in_state.append(value)


def _read_threads(read: _Read, family: _Family) -> None:
    name, typ, samples = family
    if typ not in _GAUGE_TYPES:
        raise ParseError(f"{name}: type {typ!r}, expected gauge")
    by_kind = read.threads[name]
    for sample in samples:
        if sample[0] == name:
            thread = sample[1].get(LABEL_METRIC_THREAD, "")
            by_kind[thread] = by_kind.get(thread, 0.0) + _checked(name, sample[2])


def _read_optional(read: _Read, family: _Family) -> None:
    name, typ, samples = family
    _gauge_type(name, typ)
    values = read.optional[name]
    for sample in samples:
        if sample[0] == name:
            values.append(_checked(name, sample[2]))


def _read_peer(read: _Read, family: _Family) -> None:
    read.peer_families.append(family)  # checked on its own (_peer_figures)


# A family's kind (_KINDS) -> how its samples are read.
_READERS: Final = {
    _GAUGE: _read_gauge,
    _COUNTER: _read_counter,
    _STATES: _read_states,
    _IN_STATE: _read_in_state,
    _THREADS: _read_threads,
    _OPTIONAL: _read_optional,
    _PEER: _read_peer,
}


def _parse(body: str | bytes | bytearray, max_bytes: int, peers: Collection[str] | None) -> PodSample:
    read = _Read()
    for family in _families(_relevant_lines(_text(body, max_bytes)), peers):
        kind = _KINDS.get(family[0])
        if kind is not None:
            _READERS[kind](read, family)
    return read.sample()


def _peer_figures(families: list[_Family]) -> PeerFigures | None:
    """The per-peer families, or None when absent or not trustworthy (never an error: a bad
    per-peer series must not make the pod unobserved, only leave blame without evidence)."""
    if not families:
        return None
    inflight: dict[str, float] = {}
    outcomes: dict[str, dict[str, float]] = {}
    held: dict[str, dict[str, float]] = {name: {} for name in _HELD_FAMILIES}
    try:
        for name, typ, samples in families:
            if name in held or name == METRIC_KV_PEER_INFLIGHT:
                if typ not in _GAUGE_TYPES:
                    return None
                by_peer = held.get(name, inflight)
                for sample in samples:
                    peer = sample[4]
                    if sample[0] != name or not peer or peer in by_peer:
                        return None
                    by_peer[peer] = _checked(name, sample[2])
                continue
            if typ not in ("counter", "unknown"):
                return None
            for sample in samples:
                if sample[0] != METRIC_KV_PEER_TRANSFERS_TOTAL:
                    continue
                peer = sample[4]
                outcome = sample[1].get(LABEL_METRIC_OUTCOME)
                if not peer or not outcome or outcome in outcomes.get(peer, {}):
                    return None
                outcomes.setdefault(peer, {})[outcome] = _checked(sample[0], sample[2])
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

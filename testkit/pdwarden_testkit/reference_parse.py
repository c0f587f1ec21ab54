"""The watchdog's parser as it was before its one-pass rewrite, kept as a reference: the operator's
parser (`pdwarden_operator.watchdog.parse`) must read every body as this one does (the same
`PodSample`, or a `ParseError` where this raises one: tests/unit/test_watchdog_parse_equal.py),
and `bench watchdog` measures the machine with it (`reference_parse_cpu_us`), a yardstick that
does not move when the operator's parser does.

It reads the kept lines (`parse._relevant_lines`, shared) into metric families as
prometheus_client's `text_string_to_metric_families` groups them (tests/unit/
test_watchdog_exposition.py compares the two), then picks the figures from the families.
Not for the operator: it ships one parser.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Iterable, Iterator
from typing import Any, NamedTuple

from prometheus_client.metrics_core import METRIC_TYPES
from prometheus_client.samples import Sample

from pdwarden_contract import (
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
    METRIC_KV_PEER_TRANSFERS_TOTAL,
    METRIC_KV_POOL_PAGES,
    METRIC_KV_ROOMS,
    METRIC_KV_ROOMS_ABANDONED,
    METRIC_KV_TRANSFERS_TOTAL,
    METRIC_RUNTIME_THREADS,
    METRIC_RUNTIME_THREADS_EXPECTED,
    PEER_OTHER,
)
from pdwarden_operator.watchdog.parse import (
    _COUNTER_FAMILIES,
    _ESCAPE,
    _GAUGES,
    _HELD_FAMILIES,
    _KNOWN_VALUES,
    _LABEL,
    _METRIC_NAME,
    _OPTIONAL_GAUGES,
    _PEER_TRANSFER_FAMILIES,
    _SAMPLE,
    _SUFFIXES,
    _THREAD_FAMILIES,
    _UNESCAPED,
    DEFAULT_MAX_BYTES,
    MAX_LABEL_VALUE_CHARS,
    MAX_PEERS,
    STUCK_STATE,
    WAITING_ON_PEER_STATE,
    ParseError,
    PeerFigures,
    PodSample,
    _checked,
    _dead_threads,
    _relevant_lines,
)

# --- the kept lines -> metric families (was pdwarden_operator/watchdog/exposition.py) ---

# The text format's grammar and the contract's tables are the watchdog parser's own (one
# source); what this reference keeps apart is how it groups lines into families.
_HELP_ESCAPE = re.compile(r"\\[\\n]")


# A TYPE line's word -> the family type prometheus_client reports.
_TYPES: dict[str, str] = {typ: typ for typ in METRIC_TYPES} | {"untyped": "unknown"}


# Sample lines remembered (about 500 bytes each): the lines that read the same in every pod
# of a role (threads, idle states, pool size) stay; lines whose values move are replaced.
SAMPLE_CACHE_LINES = 4096
# Comment lines remembered: the runtime's TYPE and HELP lines, the same in every body.
COMMENT_CACHE_LINES = 256


class ExpositionError(ValueError):
    """A kept line is not in the text format; the message names it."""


def _unescape(value: str, pattern: re.Pattern[str]) -> str:
    return pattern.sub(lambda m: _UNESCAPED[m.group(0)], value) if "\\" in value else value


def _number(text: str, line: str) -> float:
    if "_" in text:  # float() would take `1_000`; the text format does not
        raise ExpositionError(f"value {text[:40]!r} in {line[:60]!r}")
    try:
        return float(text)
    except ValueError:
        raise ExpositionError(f"value {text[:40]!r} in {line[:60]!r}") from None


@functools.lru_cache(maxsize=SAMPLE_CACHE_LINES)
def parse_sample(line: str) -> Sample:
    """One sample line: `name{label="value",...} value [timestamp]`. Remembered by its text:
    most lines of a pod's body (threads, states, pool, idle peers) read the same scrape after
    scrape and pod after pod. A Sample is a tuple; its labels are never changed by a reader."""
    match = _SAMPLE.fullmatch(line)
    if match is None:
        raise ExpositionError(f"not a sample line: {line[:60]!r}")
    name, block, value, timestamp = match.groups()
    labels: dict[str, str] = {}
    for label, quoted in _LABEL.findall(block or ""):
        if label in labels or label.startswith("__"):
            raise ExpositionError(f"label {label[:40]!r} repeated or reserved in {line[:60]!r}")
        labels[label] = _unescape(quoted[1:-1], _ESCAPE)
    stamp = _number(timestamp, line) / 1000 if timestamp is not None else None
    return Sample(name, labels, _number(value, line), stamp)


@functools.lru_cache(maxsize=COMMENT_CACHE_LINES)
def parse_comment(line: str) -> tuple[str, str, str] | None:
    """A comment line: ("HELP", name, documentation) or ("TYPE", name, type); None for any
    other comment. Remembered by its text: every pod sends the same comments every scrape."""
    parts = line.split(None, 3)
    if len(parts) < 3 or parts[1] not in ("TYPE", "HELP"):
        return None
    keyword, candidate = parts[1], parts[2]
    if _METRIC_NAME.fullmatch(candidate) is None:
        raise ExpositionError(f"metric name {candidate[:60]!r}")
    if keyword == "HELP":
        return keyword, candidate, _unescape(parts[3], _HELP_ESCAPE) if len(parts) == 4 else ""
    if len(parts) < 4:
        raise ExpositionError(f"TYPE line without a type: {line[:60]!r}")
    return keyword, candidate, parts[3]


class Family(NamedTuple):
    """One metric family as prometheus_client's parser reports it (name, documentation, type
    and samples alike), without building its `Metric` (a name check per family, again)."""

    name: str
    documentation: str
    type: str
    samples: list[Sample]


def _family(name: str, documentation: str, typ: str, samples: list[Sample]) -> Family:
    # as prometheus_client reports a counter: the family without `_total`, its samples with it
    if typ == "counter":
        if name.endswith("_total"):
            name = name[:-6]
        else:
            samples = [Sample(s.name + "_total", *s[1:]) for s in samples]
    if not name:  # `_total` alone: names are checked by the expressions that read them
        raise ExpositionError("a counter named `_total`")
    typ = _TYPES.get(typ, "")
    if not typ:
        raise ExpositionError(f"{name[:60]}: unknown type")
    return Family(name, documentation, typ, samples)


def families(lines: Iterable[str]) -> Iterator[Family]:
    """The families of `lines` (comments, samples and blank lines of the text format)."""
    name, documentation, typ = "", "", "untyped"
    samples: list[Sample] = []
    allowed: tuple[str, ...] = ()
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if not line.startswith("#"):
            sample = parse_sample(line)
            if sample.name in allowed:
                samples.append(sample)
                continue
            if name:
                yield _family(name, documentation, typ, samples)
            name, documentation, typ, samples, allowed = "", "", "untyped", [], ()
            yield _family(sample.name, "", "untyped", [sample])  # undeclared: a family of its own
            continue
        comment = parse_comment(line)
        if comment is None:
            continue
        keyword, candidate, text = comment
        if keyword == "HELP":
            if candidate != name:
                if name:
                    yield _family(name, documentation, typ, samples)
                name, typ, samples, allowed = candidate, "untyped", [], (candidate,)
            documentation = text
            continue
        if candidate != name:
            if name:
                yield _family(name, documentation, typ, samples)
            name, documentation, samples = candidate, "", []
        typ = text
        allowed = tuple(name + suffix for suffix in _SUFFIXES.get(typ, ("",)))
    if name:
        yield _family(name, documentation, typ, samples)


# --- the families -> the figures (was parse.py's parse_metrics) ---


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
    for family in families(_relevant_lines(text)):
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

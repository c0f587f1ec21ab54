"""The lines of a runtime's /metrics body that the watchdog keeps -> metric families.

prometheus_client's text parser scans each label block character by character in Python: at
10,000 pods every 10 s its share of a scrape was most of the operator's CPU. This reads the
same lines with a few compiled regular expressions and yields each family as a `Family` (the
name, documentation, type and samples of prometheus_client's `Metric`, with its own `Sample`),
grouped exactly as its `text_string_to_metric_families` groups them (a test compares the two
over generated bodies). It is stricter on form: a sample line is
`name{labels} value [timestamp]` and nothing else, so a line the library would read loosely
is an `ExpositionError` here (the pod is then unobserved, never judged on it).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from prometheus_client.metrics_core import METRIC_TYPES
from prometheus_client.samples import Sample

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
_HELP_ESCAPE = re.compile(r"\\[\\n]")
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
# The sample names a declared family holds: its name plus these suffixes.
_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("",),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}


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

"""The reference reader of kept /metrics lines (the watchdog's parser is held to it,
test_watchdog_parse_equal.py) groups families and reads samples exactly as prometheus_client's
text parser does, on the bodies runtimes write and on generated ones in the text format; on
anything else it raises only ExpositionError (hypothesis)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from pdwarden_contract import KV_STATES, OUTCOMES, RUNTIME_ROLES
from pdwarden_testkit.fleet.runtimes import FleetRuntimes
from pdwarden_testkit.reference_parse import ExpositionError, families, parse_sample

pytestmark = pytest.mark.unit

NAMES = (
    "pdwarden_inflight_requests",
    "pdwarden_kv_transfers",
    "pdwarden_kv_transfers_total",
    "pdwarden_kv_rooms",
    "pdwarden_kv_transfer_seconds",
)
TYPES = ("counter", "gauge", "untyped", "summary", "histogram")
SUFFIXES = ("", "_total", "_count", "_sum", "_bucket", "_created")
LABEL_VALUES = (*OUTCOMES, *KV_STATES, "2001:2::1", "198.18.0.7", 'a "quoted" \\ value\n', "")


def _shape(metrics: list[Any]) -> list[tuple[Any, ...]]:
    """Families as comparable tuples (NaN equals NaN here; 3 equals 3.0 as in Python)."""

    def value(v: float | None) -> object:
        return "nan" if v is not None and math.isnan(v) else v

    return [
        (
            m.name,
            m.documentation,
            m.type,
            [(s.name, s.labels, value(s.value), value(s.timestamp)) for s in m.samples],
        )
        for m in metrics
    ]


def _both(lines: list[str]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    ours = _shape(list(families(lines)))
    theirs = _shape(list(text_string_to_metric_families("\n".join(lines) + "\n")))
    return ours, theirs


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@pytest.mark.parametrize("role", RUNTIME_ROLES)
@pytest.mark.parametrize("mode", ["serving", "wedged"])
def test_a_runtimes_whole_body_reads_as_the_library_reads_it(role: str, mode: str) -> None:
    fleet = FleetRuntimes().start()
    try:
        body, _ = fleet.body(role, mode)  # type: ignore[arg-type]
    finally:
        fleet.stop()
    lines = body.decode().splitlines()
    ours, theirs = _both(lines)
    assert ours == theirs
    assert sum(len(f[3]) for f in ours) > 20  # the body was read, not skipped


SAMPLE_LINES = st.builds(
    lambda name, suffix, labels, comma, value, stamp, pad: (
        f"{name}{suffix}"
        + (
            "{"
            + ",".join(f'{k}{pad}={pad}"{_escaped(v)}"' for k, v in labels.items())
            + ("," if comma else "")
            + "}"
            if labels
            else ""
        )
        + f"{pad or ' '}{value}"
        + (f" {stamp}" if stamp is not None else "")
    ),
    st.sampled_from(NAMES),
    st.sampled_from(SUFFIXES),
    st.dictionaries(
        st.sampled_from(["outcome", "state", "peer", "role", "le"]), st.sampled_from(LABEL_VALUES), max_size=3
    ),
    st.booleans(),
    st.one_of(
        st.integers(min_value=-(10**6), max_value=10**6).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.sampled_from(["NaN", "+Inf", "-Inf", "1e3", "0.0"]),
    ),
    st.one_of(st.none(), st.integers(min_value=0, max_value=2**40)),
    st.sampled_from(["", " ", "\t"]),
)
COMMENT_LINES = st.builds(
    lambda kind, name, rest: f"# {kind} {name} {rest}".rstrip(),
    st.sampled_from(["TYPE", "HELP"]),
    st.sampled_from([n + s for n in NAMES for s in ("", "_total")]),
    st.one_of(st.sampled_from(TYPES), st.sampled_from(["Rooms per state.", "a \\\\ b \\n c", ""])),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(SAMPLE_LINES, COMMENT_LINES, st.just(""), st.just("# a comment")), max_size=30))
def test_generated_text_format_reads_as_the_library_reads_it(lines: list[str]) -> None:
    try:
        theirs = _shape(list(text_string_to_metric_families("\n".join(lines) + "\n")))
    except ValueError:
        with pytest.raises(ExpositionError):
            list(families(lines))
        return
    assert _shape(list(families(lines))) == theirs


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text(max_size=80), max_size=20))
def test_anything_else_reads_or_raises_only_exposition_error(lines: list[str]) -> None:
    try:
        ours = _shape(list(families(lines)))
    except ExpositionError:
        return
    # what it does read, the library reads the same way
    assert ours == _shape(list(text_string_to_metric_families("\n".join(lines) + "\n")))


@pytest.mark.parametrize(
    "line",
    [
        'pdwarden_kv_rooms{state="Transferring" 1',  # unclosed block
        "pdwarden_kv_rooms{state=Transferring} 1",  # unquoted value
        'pdwarden_kv_rooms{state="a",state="b"} 1',  # a label twice
        'pdwarden_kv_rooms{__name__="x"} 1',  # reserved label
        "pdwarden_kv_rooms 1 2 3",  # more than a value and a timestamp
        "pdwarden_kv_rooms 1_000",
        "pdwarden_kv_rooms abc",
        "pdwarden_kv_rooms",
    ],
)
def test_a_malformed_sample_line_is_named_in_the_error(line: str) -> None:
    with pytest.raises(ExpositionError, match="pdwarden_kv_rooms"):
        parse_sample(line)

"""The watchdog keeps exactly the lines about the contract's metrics that a reading line by
line keeps (samples of its names, and TYPE comments about them, whose words are split as
prometheus_client splits them; never a HELP comment), in order, with the same limits
(hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdwarden_operator.watchdog import parse
from pdwarden_operator.watchdog.parse import ParseError

pytestmark = pytest.mark.unit


def reference(text: str) -> list[str]:
    """The kept lines, read one line at a time."""
    keep: list[str] = []
    series = 0
    for line in text.split("\n"):
        if line.startswith(parse.METRICS_READ):
            series += 1
            if series > parse.MAX_SERIES:
                raise ParseError(f"more than {parse.MAX_SERIES} series of the contract's metrics")
        elif not line.startswith("#"):
            continue
        else:
            words = line.split(None, 3)
            if not (len(words) >= 3 and words[1] == "TYPE" and words[2].startswith(parse.METRICS_READ)):
                continue
        if len(line) > parse.MAX_LINE_CHARS:
            raise ParseError(
                f"a line of {len(line)} characters ({line[:40]!r}...), at most {parse.MAX_LINE_CHARS}"
            )
        keep.append(line)
    return keep


def outcome(read: object, text: str) -> object:
    try:
        return read(text)  # type: ignore[operator]
    except ParseError as exc:
        return ("error", str(exc))


NAMES = st.sampled_from(
    [
        *parse.METRICS_READ,
        "pdwarden_kv_rooms_abandoned",
        "pdwarden_kv_transfer_seconds_bucket",
        "pdwarden_runtime_info",
        "pdwarden_kv",
        "python_gc_objects_collected_total",
        "xpdwarden_kv_rooms",
        "",
    ]
)
SPACES = st.sampled_from([" ", "  ", "\t", "\x0b", "\x0c", "\r", "\x1c", "\x85", "\xa0", "\u2003", ""])
WORDS = st.sampled_from(["TYPE", "HELP", "EOF", "type", "TYPES", "#", ""])
COMMENTS = st.builds(
    lambda hashes, s1, word, s2, name, rest: f"{hashes}{s1}{word}{s2}{name}{rest}",
    st.sampled_from(["#", "#x", "##", " #"]),
    SPACES,
    WORDS,
    SPACES,
    NAMES,
    st.sampled_from(["", " gauge", " counter\r", " text with  words", " " + "h" * 600]),
)
SAMPLES = st.builds(
    lambda lead, name, rest: f"{lead}{name}{rest}",
    st.sampled_from(["", " ", "\r"]),
    NAMES,
    st.sampled_from(['{role="prefill"} 1', " 2", "_total 3\r", "", "{x=" + "y" * 600 + "} 1"]),
)
LINES = st.lists(st.one_of(COMMENTS, SAMPLES, st.text(max_size=20)), max_size=40)


@settings(max_examples=400, deadline=None)
@given(LINES, st.sampled_from(["\n", "\r\n"]), st.booleans())
def test_the_kept_lines_are_those_a_line_by_line_reading_keeps(
    lines: list[str], newline: str, trailing: bool
) -> None:
    text = newline.join(lines) + (newline if trailing else "")
    assert outcome(parse._relevant_lines, text) == outcome(reference, text)


def test_too_many_series_and_a_long_line_are_refused_in_the_order_they_come() -> None:
    sample = 'pdwarden_kv_rooms{state="bootstrapping"} 1\n'
    many = sample * (parse.MAX_SERIES + 1)
    long = f"# TYPE pdwarden_kv_rooms gauge{' ' * 600}\n"
    assert outcome(parse._relevant_lines, many + long) == outcome(reference, many + long)
    assert "more than" in str(outcome(parse._relevant_lines, many + long))
    assert "at most" in str(outcome(parse._relevant_lines, long + many))


def test_a_help_comment_is_never_kept_whatever_its_length() -> None:
    help_line = f"# HELP pdwarden_kv_rooms {'h' * 600}"
    assert parse._relevant_lines(f"{help_line}\npdwarden_kv_rooms 1\n") == ["pdwarden_kv_rooms 1"]

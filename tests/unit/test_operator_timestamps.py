"""Kubernetes' time formats, written and read in one place."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdwarden_operator.timestamps import format_micro_time, format_time, from_rfc3339, to_rfc3339

pytestmark = pytest.mark.unit


def test_times_are_utc_to_the_second_and_leases_to_the_microsecond() -> None:
    t = dt.datetime(2026, 12, 3, 10, 4, 5, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert format_time(t) == "2026-12-03T08:04:05Z"
    assert format_micro_time(t) == "2026-12-03T08:04:05.123456Z"
    assert to_rfc3339(0.0) == "1970-01-01T00:00:00Z"


@given(st.integers(min_value=0, max_value=4_000_000_000))
def test_what_is_written_reads_back(epoch: int) -> None:
    assert from_rfc3339(to_rfc3339(float(epoch))) == float(epoch)


@pytest.mark.parametrize(
    ("value", "epoch"),
    [
        ("1970-01-01T00:00:10Z", 10.0),
        ("1970-01-01T00:00:10", 10.0),  # no offset: UTC, never the machine's zone
        ("1970-01-01T02:00:10+02:00", 10.0),
        ("1970-01-01T00:00:10.5Z", 10.5),
        ("yesterday", None),
        (None, None),
        (10, None),
    ],
)
def test_a_time_is_read_or_is_none(value: object, epoch: float | None) -> None:
    assert from_rfc3339(value) == epoch

"""Kubernetes' time formats, written and read in one place: RFC 3339 in UTC to the second
(metav1.Time: status, Events, annotations) and to the microsecond (metav1.MicroTime: Leases)."""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

SECONDS: Final = "%Y-%m-%dT%H:%M:%SZ"
MICROSECONDS: Final = "%Y-%m-%dT%H:%M:%S.%fZ"


def format_time(t: dt.datetime) -> str:
    """metav1.Time."""
    return t.astimezone(dt.UTC).strftime(SECONDS)


def format_micro_time(t: dt.datetime) -> str:
    """metav1.MicroTime."""
    return t.astimezone(dt.UTC).strftime(MICROSECONDS)


def to_rfc3339(epoch: float) -> str:
    return format_time(dt.datetime.fromtimestamp(epoch, tz=dt.UTC))


def from_rfc3339(value: Any) -> float | None:
    """Seconds since the epoch; None for anything that is not an RFC 3339 string (a time
    without an offset is read as UTC)."""
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()

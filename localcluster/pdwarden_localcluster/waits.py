"""Waiting for a condition, and the readiness of a pod: the one way the local cluster, its
monitoring stack, the demo, the benchmarks and the tests wait."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """`wait_for` ran out of time; the message names what it waited for and the last value."""


class TransientError(Exception):
    """A failure expected while things start (a command against a warming API server):
    `wait_for` keeps polling through it by default."""


TRANSIENT: tuple[type[BaseException], ...] = (TransientError, OSError)


def wait_for(
    check: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = 0.5,
    retry_on: tuple[type[BaseException], ...] = TRANSIENT,
) -> T:
    """Poll `check` until it returns something truthy, and return that.

    Raises WaitTimeout naming `what` and the last value. An exception of a `retry_on` type
    counts as a falsy value (e.g. kubectl failing while things start); any other propagates.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except retry_on as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what}; last value: {last!r}")
        time.sleep(interval)


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """The kubelet's verdict: condition Ready is True (a terminating pod may still be Ready)."""
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def serving(pod: Mapping[str, Any]) -> bool:
    """Ready, not terminating and with an IP: a pod to send traffic to."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return pod_ready(pod) and not meta.get("deletionTimestamp") and bool(status.get("podIP"))

"""The wedge rule's dead-thread clause: a runtime whose essential thread died is wedged."""

from __future__ import annotations

import pytest

from pdwarden_operator.watchdog.parse import ParseError, parse_metrics
from tests.unit.test_watchdog_rule import body, replay

pytestmark = pytest.mark.unit


def threads(alive: int, expected: int = 4, kind: str = "nixl_transfer_worker") -> str:
    return f"""# HELP pdwarden_runtime_threads Alive threads of this runtime, by kind.
# TYPE pdwarden_runtime_threads gauge
pdwarden_runtime_threads{{role="prefill",thread="{kind}"}} {alive}
pdwarden_runtime_threads{{role="prefill",thread="nixl_bootstrap"}} 1.0
# HELP pdwarden_runtime_threads_expected Threads of each kind that should be alive.
# TYPE pdwarden_runtime_threads_expected gauge
pdwarden_runtime_threads_expected{{role="prefill",thread="{kind}"}} {expected}
pdwarden_runtime_threads_expected{{role="prefill",thread="nixl_bootstrap"}} 1.0
"""


def test_dead_thread_on_two_consecutive_scrapes_is_wedged_even_when_idle() -> None:
    verdicts = replay([body(0, 0, 5) + threads(4), body(0, 0, 5) + threads(3), body(0, 0, 5) + threads(3)])
    assert [v.state for v in verdicts] == ["ok", "ok", "wedged"]
    assert verdicts[-1].reason == (
        "essential thread dead on 2 consecutive scrapes: nixl_transfer_worker 3/4 alive"
    )


def test_all_threads_alive_or_no_thread_metrics_changes_nothing() -> None:
    assert {v.state for v in replay([body(0, 0, 5) + threads(4)] * 5)} == {"ok"}
    assert {v.state for v in replay([body(0, 0, 5)] * 5)} == {"ok"}


def test_one_short_reading_then_recovered_is_not_wedged() -> None:
    verdicts = replay([body(0, 0, 5) + threads(3), body(0, 0, 5) + threads(4), body(0, 0, 5) + threads(3)])
    assert {v.state for v in verdicts} == {"ok"}


def test_garbage_thread_gauge_is_a_parse_error_not_a_wedge() -> None:
    with pytest.raises(ParseError):
        parse_metrics(body(0, 0, 5) + threads(4).replace("} 1.0\n#", "} NaN\n#", 1))
    assert parse_metrics(body(0, 0, 5) + threads(2)).dead_threads == (("nixl_transfer_worker", 2.0, 4.0),)

"""When a watchdog round runs at all, and when its status patch is written (pure decisions)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import pdwarden_contract as contract
from pdwarden_operator.watchdog.state import (
    STATUS_HEARTBEAT_S,
    WatchdogState,
    round_due,
    state_to_status,
    status_write_due,
)

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0
ROLES = contract.RUNTIME_ROLES


def patch(at: float, wedged: tuple[str, ...] = (), used: int = 0) -> dict[str, Any]:
    state = WatchdogState(used=used)
    out = state_to_status(state, last_scrape=at, wedged_pods=wedged, unobserved_pods=[], max_remediations=3)
    out["conditions"] = [{"type": "Wedged", "status": "True" if wedged else "False"}]
    return out


def test_first_round_of_a_process_always_writes() -> None:
    assert status_write_due(None, None, patch(T0), T0)


def test_a_round_that_only_moves_last_scrape_is_not_written() -> None:
    assert not status_write_due(patch(T0), T0, patch(T0 + 10), T0 + 10)
    assert not status_write_due(patch(T0), T0, patch(T0 + 50), T0 + STATUS_HEARTBEAT_S - 1)


def test_last_scrape_is_refreshed_once_a_heartbeat() -> None:
    assert status_write_due(patch(T0), T0, patch(T0 + 60), T0 + STATUS_HEARTBEAT_S)


@pytest.mark.parametrize(
    "changed",
    [patch(T0 + 10, wedged=("m-prefill-0",)), patch(T0 + 10, used=1)],
    ids=["a pod became wedged", "budget spent"],
)
def test_any_finding_that_changed_is_written_at_once(changed: dict[str, Any]) -> None:
    assert status_write_due(patch(T0), T0, changed, T0 + 10)


def test_a_new_or_parked_model_has_no_round() -> None:
    assert not round_due(None, False, ROLES)
    assert not round_due({}, False, ROLES)
    parked = {"prefill": {"replicas": 0, "readyReplicas": 0}, "decode": {"replicas": 0, "readyReplicas": 0}}
    assert not round_due(parked, False, ROLES)
    # the router's readiness is not a reason: it serves no KV transfers
    assert not round_due({**parked, "router": {"replicas": 1, "readyReplicas": 1}}, False, ROLES)


@pytest.mark.parametrize(
    ("status", "seen"),
    [
        ({"prefill": {"readyReplicas": 1}}, False),
        ({"decode": {"readyReplicas": 2}}, False),
        ({}, True),  # scraped before, now unready (e.g. SIGSTOPped): it must be judged unobserved
        ({"watchdog": {"inFlight": [{"pod": "p"}]}}, False),  # a remediation to finish after restart
        ({"watchdog": {"wedgedPods": ["p"]}}, False),  # a stale finding to clear
        ({"watchdog": {"unobservedPods": ["d"]}}, False),
    ],
)
def test_a_round_runs_when_there_is_something_to_look_at(status: dict[str, Any], seen: bool) -> None:
    assert round_due(status, seen, ROLES)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


@given(
    st.dictionaries(
        st.sampled_from(["prefill", "decode", "router", "watchdog", "x"]),
        JSONISH | st.dictionaries(st.sampled_from(["readyReplicas", "inFlight", "wedgedPods"]), JSONISH),
    )
    | JSONISH
)
def test_garbage_in_the_status_never_raises(status: Any) -> None:
    # a pod scraped before is judged whatever the status says
    assert round_due(status, True, ROLES) is True
    due = round_due(status, False, ROLES)
    assert type(due) is bool
    if not isinstance(status, dict) or not set(status) & {"prefill", "decode", "watchdog"}:
        # nothing that names a runtime pod or a watchdog finding: nothing to look at
        assert due is False

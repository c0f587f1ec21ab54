"""Operator safety end to end: a leader with a standby, and the fleet brake.

Real operator processes (two of them where a standby matters) against the local cluster and
synthetic runtime pods; the harness (Env, load, wedge injection) is tests/e2e/test_watchdog.py's.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from pdwarden_runtime import contract
from tests.e2e.test_watchdog import (
    INTERVAL,
    LEGACY_PREFILL,
    STUCK,
    WATCHDOG,
    Env,
    _operator_metric,
    _remediations,
    _wedge,
    wait_for,
)
from tests.e2e.test_watchdog import env as watchdog_env  # noqa: F401 - a fixture, used below

pytestmark = pytest.mark.e2e


@pytest.fixture
def env(watchdog_env: Env) -> Env:  # noqa: F811
    return watchdog_env


LEASE_DURATION_S, RETRY_S = 15, 2


def _leader_of(env: Env) -> str | None:
    lease = env._call(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{env.namespace}/leases/pdwarden-operator"
    )
    holder = (lease.get("spec") or {}).get("holderIdentity")
    return str(holder) if holder else None


def _leading(port: int) -> bool:
    return _operator_metric(port, "pdwarden_operator_leader ") == 1


def _ready(env: Env, name: str, replicas: int) -> None:
    wait_for(
        f"{replicas} ready prefill and decode pods of {name}",
        lambda: all(len(env.live_ready_pods(name, r)) == replicas for r in contract.RUNTIME_ROLES),
        timeout=240,
    )
    wait_for(
        f"the watchdog's first scrape of {name}",
        lambda: (env.dm(name).get("status") or {}).get("watchdog", {}).get("lastScrape"),
        timeout=90,
    )


def _conditions(env: Env, name: str) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (env.dm(name).get("status") or {}).get("conditions") or []}


def test_a_frozen_leader_is_replaced_and_acts_on_nothing_when_resumed(env: Env) -> None:
    name = "lead"
    first, first_port = env.start_operator()
    wait_for("the first operator to lead", lambda: _leading(first_port), timeout=60)
    second, second_port = env.start_operator()
    env.create_dm(name, WATCHDOG, LEGACY_PREFILL, replicas=1)
    _ready(env, name, 1)
    assert not _leading(second_port)  # the standby does nothing while the leader renews
    holder = _leader_of(env)

    os.killpg(first.pid, signal.SIGSTOP)  # frozen: it neither renews nor releases the Lease
    try:
        wait_for(
            "the standby to take the Lease",
            lambda: _leading(second_port) and _leader_of(env) != holder,
            timeout=LEASE_DURATION_S + RETRY_S + 30,  # the protocol's bound, plus a loaded machine
            every=0.5,
        )
        victim = env.live_ready_pods(name, contract.ROLE_PREFILL)[0]
        victim_name = victim["metadata"]["name"]
        _wedge(env, name, victim)
        wait_for(
            "the new leader's remediation",
            lambda: [r for r in _remediations(env, name, victim_name) if r["outcome"] == "deleted"],
            timeout=STUCK + 120,
        )
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    # Resumed, the old leader finds its term lapsed: it exits without touching anything.
    assert first.wait(timeout=60) == 1
    assert _leading(second_port)
    status = env.dm(name)["status"]
    assert [r["outcome"] for r in _remediations(env, name, victim_name)] == ["deleted"]
    assert status["watchdog"]["budget"]["used"] == 1
    log = env.operator_logs()
    assert "leadership lost" in log and "WedgedPodRestarted" in log
    assert second.poll() is None


def test_many_models_wedged_at_once_engage_the_fleet_brake_then_it_releases(env: Env) -> None:
    names = ("fleet-a", "fleet-b")
    _, port = env.start_operator("--brake-max-wedged-models", "1")
    # a threshold long enough that the second wedge (injected seconds after the first) has
    # stalled for half of it when the first crosses it: both count at once
    watchdog = {**WATCHDOG, "stuckAfterSeconds": 2 * STUCK}
    for name in names:
        env.create_dm(name, watchdog, LEGACY_PREFILL, replicas=1)
    for name in names:
        _ready(env, name, 1)
    victims = {name: env.live_ready_pods(name, contract.ROLE_PREFILL)[0] for name in names}
    for name, victim in victims.items():
        _wedge(env, name, victim)

    def all_held() -> bool:
        return all(_conditions(env, n).get("FleetBrake", {}).get("status") == "True" for n in names)

    wait_for("FleetBrake on every wedged model", all_held, timeout=2 * STUCK + 120)
    assert _operator_metric(port, "pdwarden_operator_brake_engaged ") == 1
    wait_for(
        "each wedge recorded as held by the brake",
        lambda: all(any(r["outcome"] == "skipped-brake" for r in _remediations(env, n)) for n in names),
        timeout=4 * INTERVAL + 30,
    )
    for name, victim in victims.items():
        # no pod was touched: the wedged pods are the same, alive pods
        uids = {p["metadata"]["uid"] for p in env.live_ready_pods(name, contract.ROLE_PREFILL)}
        assert victim["metadata"]["uid"] in uids
        assert not [r for r in _remediations(env, name) if r["outcome"] in ("deleted", "evicted", "pending")]
        assert any(e["reason"] == "FleetBrakeEngaged" for e in env.events(name))

    # A person fixes one model (its wedged pod replaced by hand): one model in trouble is under
    # the limit, so the brake releases on its own and the other wedge is remediated as usual.
    fixed = names[0]
    env._call("DELETE", f"/api/v1/namespaces/{env.namespace}/pods/{victims[fixed]['metadata']['name']}")
    wait_for(
        "the brake released",
        lambda: _operator_metric(port, "pdwarden_operator_brake_engaged ") == 0,
        timeout=2 * STUCK + 120,
    )
    wait_for(
        "FleetBrake False again",
        lambda: _conditions(env, names[1]).get("FleetBrake", {}).get("status") == "False",
        timeout=4 * INTERVAL + 60,
    )
    assert any(e["reason"] == "FleetBrakeReleased" for e in env.events(names[1]))

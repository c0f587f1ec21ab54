"""The wedge watchdog end to end: local cluster, real operator process, synthetic runtime pods.

Each test runs its own operator process (scoped to the test's namespace) against 2 prefill +
2 decode synthetic pods, drives load at them the way the router (smg) does, injects faults into
ONE pod and checks what the watchdog decided (status, Events, metrics, pods). The harness is
testkit/pdwarden_testkit/cluster_env.py.

The healthy soak runs PDWARDEN_E2E_SOAK_ROUNDS watchdog rounds (default 12: a minute).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from typing import Any

import pytest

import pdwarden_contract as contract
from pdwarden_localcluster.waits import wait_for
from pdwarden_operator.resource.watchdog import WatchdogSpec
from pdwarden_testkit.cluster_env import (
    API_TRANSIENT,
    EMULATED_PORT_PREFILL,
    INTERVAL,
    SOAK_ROUNDS,
    STUCK,
    WATCHDOG,
    Env,
    Load,
    assert_each_pod_acted_on_once,
    epoch,
    operator_metric,
    pod_metrics,
    remediations,
    up,
    wait_rounds,
    wedge,
    with_outcome,
)

pytestmark = pytest.mark.e2e

# The long scenarios detect a wedge sooner: the same rule, shorter figures (stuckAfterSeconds
# stays at least two scrapes, as the CRD requires).
QUICK_STUCK = 10
QUICK_WATCHDOG = {**WATCHDOG, "stuckAfterSeconds": QUICK_STUCK, "scrapeIntervalSeconds": 3}


def _two_ready_prefill(env: Env, name: str) -> list[dict[str, Any]]:
    ready = env.live_ready_pods(name, contract.ROLE_PREFILL)
    return ready if len(ready) == 2 else []


def test_injected_race_is_detected_restarted_replaced_and_traffic_recovers(env: Env) -> None:
    name = "race"
    op = up(env, name, WATCHDOG, EMULATED_PORT_PREFILL)
    with Load(env, name, concurrency=4) as load:
        load.wait_flowing()
        victim = env.live_ready_pods(name, contract.ROLE_PREFILL)[0]
        victim_name = victim["metadata"]["name"]
        born = wedge(env, name, victim)
        rem = wait_for(
            lambda: with_outcome(env, name, victim_name, "deleted"),
            STUCK + 90,
            "the victim's remediation",
            1.0,
            API_TRANSIENT,
        )[0]
        # detected within stuckAfterSeconds plus two scrape intervals (+2 s: status times are whole seconds)
        assert epoch(rem["time"]) - born <= STUCK + 2 * INTERVAL + 2, (rem, born)
        assert rem["role"] == "prefill" and rem["action"] == "restart"
        assert f"stuckAfterSeconds={STUCK}" in rem["reason"]
        wait_for(
            lambda: victim_name not in [p["metadata"]["name"] for p in env.pods(name, contract.ROLE_PREFILL)],
            120,
            "the victim to be gone",
            1.0,
            API_TRANSIENT,
        )
        wait_for(
            lambda: len(env.live_ready_pods(name, contract.ROLE_PREFILL)) == 2,
            240,
            "a replacement prefill pod Ready",
            1.0,
            API_TRANSIENT,
        )
        load.wait_flowing(20)
    reasons = {e["reason"] for e in env.events(name)}
    assert "WedgedPodRestarted" in reasons
    assert any(e["reason"] == "WedgedPodRestarted" for e in env.events(victim_name))
    assert operator_metric(op, contract.METRIC_OPERATOR_REMEDIATIONS_TOTAL, action="restart") >= 1
    assert_each_pod_acted_on_once(env, name)


def test_sigstopped_decode_pod_is_found_unobserved_and_not_remediated_on_that_ground(env: Env) -> None:
    name = "stall"
    op = up(env, name, WATCHDOG)
    from pdwarden_localcluster.cluster import layout

    victim = env.live_ready_pods(name, contract.ROLE_DECODE)[0]
    meta = victim["metadata"]
    pod_dir = layout().pods / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
    pid = json.loads(next(pod_dir.glob("*.pid")).read_text())["pid"]
    os.killpg(pid, signal.SIGSTOP)
    try:
        with Load(env, name, concurrency=2):
            wait_for(
                lambda: (
                    meta["name"]
                    in (env.dm(name).get("status") or {}).get("watchdog", {}).get("unobservedPods", [])
                ),
                4 * INTERVAL + 30,
                "the stalled decode pod reported unobserved",
                1.0,
                API_TRANSIENT,
            )
            assert operator_metric(op, contract.METRIC_OPERATOR_UNOBSERVED_PODS) >= 1
            assert operator_metric(op, contract.METRIC_OPERATOR_SCRAPE_ERRORS_TOTAL) >= 1
            # rounds that still find it unobserved: none of them may act on it
            wait_rounds(op, name, 3)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGCONT)
    assert remediations(env, name, meta["name"]) == []  # unobserved is never a ground for action


def test_heavy_healthy_load_with_deep_queues_takes_no_action(env: Env) -> None:
    name = "soak"
    # slow prefill compute between chunks and long prompts: requests pile up in flight. The
    # default stuckAfterSeconds (and the runtime's deadlines below it, hardening on): the
    # configuration a user gets must never act on a deep, moving queue.
    default = WatchdogSpec.model_validate({}).stuck_after_seconds
    op = up(env, name, {**WATCHDOG, "stuckAfterSeconds": default}, ["--compute-ms", "10"])
    deepest = 0.0
    with Load(env, name, concurrency=12, prompt="s" * 600) as load:
        for _ in range(SOAK_ROUNDS):  # the queue depth, sampled once per watchdog round
            wait_rounds(op, name, 1)
            for pod in env.live_ready_pods(name, contract.ROLE_PREFILL):
                with contextlib.suppress(Exception):
                    deepest = max(deepest, pod_metrics(pod)["inflight"])
        completed = len(load.ok)
    status = env.dm(name)["status"]
    assert completed > 0 and deepest >= 2, (completed, deepest)  # the load really queued work
    assert status.get("remediations") in (None, []), status.get("remediations")
    assert status["watchdog"]["wedgedPods"] == []
    assert operator_metric(op, contract.METRIC_OPERATOR_REMEDIATIONS_TOTAL) == 0


def test_alert_action_only_reports(env: Env) -> None:
    name = "alert"
    op = up(env, name, {**WATCHDOG, "action": "alert"}, EMULATED_PORT_PREFILL)
    with Load(env, name, concurrency=4):
        victim = env.live_ready_pods(name, contract.ROLE_PREFILL)[0]
        victim_name, victim_uid = victim["metadata"]["name"], victim["metadata"]["uid"]
        wedge(env, name, victim)
        rem = wait_for(
            lambda: remediations(env, name, victim_name), STUCK + 120, "an alert", 1.0, API_TRANSIENT
        )[0]
        assert (rem["action"], rem["outcome"]) == ("alert", "alerted")
        # later rounds still find it wedged: they must neither alert again nor act
        wait_rounds(op, name, 3)
    pods = {p["metadata"]["uid"]: p for p in env.pods(name, contract.ROLE_PREFILL)}
    assert victim_uid in pods and not pods[victim_uid]["metadata"].get("deletionTimestamp")
    status = env.dm(name)["status"]
    assert len(remediations(env, name, victim_name)) == 1  # one alert per episode
    assert victim_name in status["watchdog"]["wedgedPods"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Wedged"]["status"] == "True"
    assert conditions["Degraded"]["status"] == "True" and conditions["Degraded"]["reason"] == "WedgedPods"
    assert any(e["reason"] == "PodWedged" for e in env.events(name))
    assert operator_metric(op, contract.METRIC_OPERATOR_WEDGED_PODS) >= 1
    assert status["watchdog"]["budget"]["used"] == 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_flapping_fault_exhausts_the_budget_and_stops(env: Env) -> None:
    """A budget of one: the first wedge is remediated, the next one finds the budget spent."""
    name = "flap"
    op = up(env, name, {**QUICK_WATCHDOG, "maxRemediations": 1}, EMULATED_PORT_PREFILL)
    acted: list[str] = []
    with Load(env, name, concurrency=4):
        for outcome in ("deleted", "skipped-budget"):
            ready = wait_for(
                lambda: _two_ready_prefill(env, name), 240, "2 ready prefill pods", 1.0, API_TRANSIENT
            )
            victim = next(p for p in ready if p["metadata"]["name"] not in acted)
            acted.append(victim["metadata"]["name"])
            wedge(env, name, victim)
            want = (acted[-1], outcome)
            wait_for(
                lambda: with_outcome(env, name, *want),  # noqa: B023
                QUICK_STUCK + 150,
                f"{want}",
                1.0,
                API_TRANSIENT,
            )
        # later rounds still find the last victim wedged with the budget spent: no action
        wait_rounds(op, name, 3)
    status = env.dm(name)["status"]
    last = acted[-1]
    assert last in [p["metadata"]["name"] for p in env.pods(name, "prefill")]  # not touched
    assert status["watchdog"]["budget"]["used"] == 1 and status["watchdog"]["budgetExhausted"] is True
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "RemediationBudgetExhausted")
    assert any(e["reason"] == "RemediationBudgetExhausted" for e in env.events(name))
    assert operator_metric(op, contract.METRIC_OPERATOR_BUDGET_EXHAUSTED) == 1
    deleted = [r for r in remediations(env, name) if r["outcome"] == "deleted"]
    assert [r["pod"] for r in deleted] == acted[:1]


def test_leader_killed_during_a_remediation_the_standby_finishes_it_once(env: Env) -> None:
    """The leader is killed from outside (SIGKILL) as soon as its intent is persisted, before
    or after it touched the pod: the standby takes the Lease and finishes that remediation
    (resumes a pending one, settles a performed one), never repeats it."""
    name = "crash"
    first = up(env, name, QUICK_WATCHDOG, EMULATED_PORT_PREFILL)
    second = env.start_operator()  # the standby: waits for the Lease
    before = {p["metadata"]["name"] for p in env.pods(name, "prefill")}
    victim = env.live_ready_pods(name, contract.ROLE_PREFILL)[0]
    victim_name = victim["metadata"]["name"]
    wedge(env, name, victim)
    wait_for(
        lambda: [
            f for f in env.dm(name)["status"]["watchdog"].get("inFlight") or [] if f["pod"] == victim_name
        ],
        QUICK_STUCK + 120,
        "the remediation's intent",
        0.2,
        API_TRANSIENT,
    )
    first.kill()
    rem = wait_for(
        lambda: [r for r in remediations(env, name, victim_name) if r["outcome"] in ("deleted", "pod-gone")],
        120,
        "the remediation finished by the standby",
        1.0,
        API_TRANSIENT,
    )
    assert len(rem) == 1
    wait_for(
        lambda: (
            len(env.live_ready_pods(name, "prefill")) == 2
            and not env.dm(name)["status"]["watchdog"].get("inFlight")
        ),
        240,
        "a replacement prefill pod Ready and nothing in flight",
        1.0,
        API_TRANSIENT,
    )
    # rounds of the new leader after the replacement: none may repeat the deletion
    wait_rounds(second, name, 2)
    after = {p["metadata"]["name"] for p in env.pods(name, "prefill")}
    charged = assert_each_pod_acted_on_once(env, name)
    prefill_acted = [r for r in charged if r["role"] == "prefill"]
    # one replacement per prefill remediation: the deletion happened once, not twice
    assert len(after - before) == len(prefill_acted), (before, after, charged)
    assert len(remediations(env, name, victim_name)) == 1

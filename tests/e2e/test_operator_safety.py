"""Operator safety end to end: a leader with a standby, and the brakes (one tenant's wedges
hold only its own namespace).

Real operator processes (two of them where a standby matters) against the local cluster and
synthetic runtime pods; the harness (Env, load, wedge injection) is tests/e2e/test_watchdog.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import pytest

import pdwarden_contract as contract
from pdwarden_demo import demo_traffic
from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.cluster_env import (
    API_TRANSIENT,
    EMULATED_PORT_PREFILL,
    INTERVAL,
    SOAK_ROUNDS,
    STUCK,
    WATCHDOG,
    Env,
    open_env,
    operator_metric,
    pod_metrics,
    remediations,
    wedge,
)
from pdwarden_testkit.operator_process import OperatorProcess

pytestmark = pytest.mark.e2e


LEASE_DURATION_S, RETRY_S = 15, 2
CLIENTS = 24  # through one router to one prefill and one decode pod on a shared 2-core machine


def _leader_of(env: Env) -> str | None:
    lease = env.call(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{env.namespace}/leases/pdwarden-operator"
    )
    holder = (lease.get("spec") or {}).get("holderIdentity")
    return str(holder) if holder else None


def _leading(op: OperatorProcess) -> bool:
    return operator_metric(op, contract.METRIC_OPERATOR_LEADER) == 1


def _ready(env: Env, name: str, replicas: int) -> None:
    wait_for(
        lambda: all(len(env.live_ready_pods(name, r)) == replicas for r in contract.RUNTIME_ROLES),
        240,
        f"{replicas} ready prefill and decode pods of {name}",
        1.0,
        API_TRANSIENT,
    )
    wait_for(
        lambda: (env.dm(name).get("status") or {}).get("watchdog", {}).get("lastScrape"),
        90,
        f"the watchdog's first scrape of {name}",
        1.0,
        API_TRANSIENT,
    )


def _conditions(env: Env, name: str) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (env.dm(name).get("status") or {}).get("conditions") or []}


def test_a_frozen_leader_is_replaced_and_acts_on_nothing_when_resumed(env: Env) -> None:
    name = "lead"
    first = env.start_operator()
    wait_for(lambda: _leading(first), 60, "the first operator to lead", 1.0, API_TRANSIENT)
    second = env.start_operator()
    env.create_dm(name, WATCHDOG, EMULATED_PORT_PREFILL, replicas=1)
    _ready(env, name, 1)
    assert not _leading(second)  # the standby does nothing while the leader renews
    holder = _leader_of(env)

    assert first.proc is not None and second.proc is not None
    # one process (OperatorProcess starts it in the test's own process group, not a session of its own)
    os.kill(first.proc.pid, signal.SIGSTOP)  # frozen: it neither renews nor releases the Lease
    try:
        wait_for(
            lambda: _leading(second) and _leader_of(env) != holder,
            LEASE_DURATION_S + RETRY_S + 30,
            "the standby to take the Lease",
            0.5,
            API_TRANSIENT,
        )  # the protocol's bound, plus a loaded machine
        victim = env.live_ready_pods(name, contract.ROLE_PREFILL)[0]
        victim_name = victim["metadata"]["name"]
        wedge(env, name, victim)
        wait_for(
            lambda: [r for r in remediations(env, name, victim_name) if r["outcome"] == "deleted"],
            STUCK + 120,
            "the new leader's remediation",
            1.0,
            API_TRANSIENT,
        )
    finally:
        os.kill(first.proc.pid, signal.SIGCONT)
    # Resumed, the old leader finds its term lapsed: it exits without touching anything.
    assert first.proc.wait(timeout=60) == 1
    assert _leading(second)
    status = env.dm(name)["status"]
    assert [r["outcome"] for r in remediations(env, name, victim_name)] == ["deleted"]
    assert status["watchdog"]["budget"]["used"] == 1
    log = env.operator_logs()
    assert "leadership lost" in log and "WedgedPodRestarted" in log
    assert second.proc.poll() is None


@contextlib.contextmanager
def _second_tenant(env: Env) -> Iterator[Env]:
    """An Env on a namespace of its own beside `env`'s, deleted afterwards."""
    namespace = f"{env.namespace}-b"
    env.call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    other = open_env(env.kubeconfig, namespace, env.tmp / "b")
    (env.tmp / "b").mkdir()
    try:
        yield next(other)
    finally:
        with contextlib.suppress(StopIteration):
            next(other)


def test_one_tenants_wedged_models_engage_its_namespace_brake_and_no_one_elses(env: Env) -> None:
    names = ("fleet-a", "fleet-b")
    # a threshold long enough that the second wedge (injected seconds after the first) has
    # stalled for half of it when the first crosses it: both count at once
    watchdog = {**WATCHDOG, "stuckAfterSeconds": 2 * STUCK}
    with _second_tenant(env) as other:
        op = env.start_operator("--namespace", other.namespace, "--namespace-brake-max-wedged-models", "1")
        for name in names:
            env.create_dm(name, watchdog, EMULATED_PORT_PREFILL, replicas=1)
        other.create_dm("elsewhere", watchdog, EMULATED_PORT_PREFILL, replicas=1)
        for name in names:
            _ready(env, name, 1)
        _ready(other, "elsewhere", 1)
        victims = {name: env.live_ready_pods(name, contract.ROLE_PREFILL)[0] for name in names}
        theirs = other.live_ready_pods("elsewhere", contract.ROLE_PREFILL)[0]
        # the same fault on both of one tenant's models at once, and on the other tenant's model
        with ThreadPoolExecutor(len(names) + 1) as pool:
            list(pool.map(lambda n: wedge(env, n, victims[n]), names))
            pool.submit(wedge, other, "elsewhere", theirs).result()

        def all_held() -> bool:
            return all(
                _conditions(env, n).get("FleetBrake", {}).get("reason") == "NamespaceBrakeEngaged"
                for n in names
            )

        wait_for(all_held, 2 * STUCK + 120, "the namespace brake on every wedged model", 1.0, API_TRANSIENT)
        namespace_brake = contract.METRIC_OPERATOR_NAMESPACE_BRAKE_ENGAGED
        assert operator_metric(op, namespace_brake, namespace=env.namespace) == 1
        assert operator_metric(op, contract.METRIC_OPERATOR_BRAKE_ENGAGED) == 0, "not the fleet's"
        wait_for(
            lambda: all(any(r["outcome"] == "skipped-brake" for r in remediations(env, n)) for n in names),
            4 * INTERVAL + 30,
            "each wedge recorded as held by the brake",
            1.0,
            API_TRANSIENT,
        )
        for name, victim in victims.items():
            # no pod was touched: the wedged pods are the same, alive pods
            uids = {p["metadata"]["uid"] for p in env.live_ready_pods(name, contract.ROLE_PREFILL)}
            assert victim["metadata"]["uid"] in uids
            assert not [
                r for r in remediations(env, name) if r["outcome"] in ("deleted", "evicted", "pending")
            ]
            assert any(e["reason"] == "NamespaceBrakeEngaged" for e in env.events(name))
        # the other tenant's wedge is remediated as usual meanwhile
        wait_for(
            lambda: (
                [r["outcome"] for r in remediations(other, "elsewhere", theirs["metadata"]["name"])]
                == ["deleted"]
            ),
            2 * STUCK + 120,
            "the other tenant's wedged pod restarted",
            1.0,
            API_TRANSIENT,
        )
        assert operator_metric(op, namespace_brake, namespace=other.namespace) == 0

        # A person fixes one model (its wedged pod replaced by hand): one model in trouble is
        # under the limit, so the brake releases on its own and the other wedge is remediated.
        fixed = names[0]
        env.call("DELETE", f"/api/v1/namespaces/{env.namespace}/pods/{victims[fixed]['metadata']['name']}")
        wait_for(
            lambda: operator_metric(op, namespace_brake, namespace=env.namespace) == 0,
            2 * STUCK + 120,
            "the brake released",
            1.0,
            API_TRANSIENT,
        )
        wait_for(
            lambda: _conditions(env, names[1]).get("FleetBrake", {}).get("status") == "False",
            4 * INTERVAL + 60,
            "FleetBrake False again",
            1.0,
            API_TRANSIENT,
        )
        assert any(e["reason"] == "NamespaceBrakeReleased" for e in env.events(names[1]))


def test_many_clients_through_the_router_with_cancellations_take_no_action(env: Env) -> None:
    """The load shape that once got a busy prefill pod restarted as wedged: many concurrent
    clients through the real router, long prompts, a third giving up at random moments, a
    60 s threshold, the runtime hardened. Rooms queue; none is stuck; nothing is done."""
    name = "crowd"
    op = env.start_operator()
    env.create_dm(name, {**WATCHDOG, "stuckAfterSeconds": 60}, ["--compute-ms", "10"], replicas=1)
    _ready(env, name, 1)
    router = wait_for(lambda: env.live_ready_pods(name, "router"), 120, "a Ready router", 1.0, API_TRANSIENT)[
        0
    ]
    log = demo_traffic.TrafficLog()
    deepest = 0.0

    async def crowd() -> None:
        stop = asyncio.Event()
        url = f"http://{router['status']['podIP']}:{contract.ROUTER_HTTP_PORT}{contract.GENERATE_PATH}"
        body = demo_traffic.request_body(name, demo_traffic.LONG_PROMPT * 3, 8)
        rng = random.Random(17)

        async def client(session: aiohttp.ClientSession, impatient: bool) -> None:
            while not stop.is_set():
                give_up = rng.uniform(0.2, 6.0) if impatient else None
                log.record(await demo_traffic.one_request(session, url, body, 60.0, give_up))

        async def watch() -> None:
            nonlocal deepest
            end = asyncio.get_running_loop().time() + SOAK_ROUNDS * INTERVAL
            while asyncio.get_running_loop().time() < end:
                for pod in env.live_ready_pods(name, contract.ROLE_PREFILL):
                    with contextlib.suppress(Exception):
                        deepest = max(deepest, (await asyncio.to_thread(pod_metrics, pod))["inflight"])
                await asyncio.sleep(1)
            stop.set()

        async with aiohttp.ClientSession() as session:
            clients = [client(session, impatient=i % 3 == 0) for i in range(CLIENTS)]
            await asyncio.gather(watch(), *clients)

    asyncio.run(crowd())
    counts = log.counts()
    assert counts[demo_traffic.OK] > 0 and counts[demo_traffic.CANCELLED] > 0, counts
    assert deepest >= 2, deepest  # the load really queued rooms
    status = env.dm(name)["status"]
    assert status.get("remediations") in (None, []), status.get("remediations")
    assert status["watchdog"]["wedgedPods"] == []
    assert operator_metric(op, contract.METRIC_OPERATOR_REMEDIATIONS_TOTAL) == 0

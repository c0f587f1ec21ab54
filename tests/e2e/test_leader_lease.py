"""The leader Lease against the local cluster's real API server: renewed on the elector's own
thread, loop and connection, so a main event loop blocked for longer than the renew deadline
neither loses leadership nor lets a standby take over."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from pdwarden_localcluster.cluster import ClusterInfo
from pdwarden_operator import leader
from pdwarden_operator.kube import lease as kube_lease
from pdwarden_operator.kube.client import KubeClient, connect
from pdwarden_operator.metrics import OperatorMetrics

pytestmark = pytest.mark.e2e

LEASE = "pdwarden-blocked-loop"
# shorter than the operator's (15/10/2 s) so the test is short; the same protocol
TIMING = leader.Timing(lease_duration=6.0, renew_deadline=4.0, retry_period=1.0, renew_period=2.0)


@pytest.fixture
async def reader(cluster: ClusterInfo) -> AsyncIterator[KubeClient]:
    """A connection of the test's own, to read the Lease as the API server has it."""
    client = connect(str(cluster.kubeconfig), max_connections=2)
    try:
        yield client
    finally:
        await client.aclose()


def elector(cluster: ClusterInfo, namespace: str, identity: str) -> tuple[leader.Elector, threading.Event]:
    lost = threading.Event()
    e = leader.Elector(
        namespace,
        LEASE,
        identity,
        timing=TIMING,
        metrics=OperatorMetrics(CollectorRegistry()),
        client=leader.lease_client(TIMING, str(cluster.kubeconfig)),
    )
    e.start(on_lost=lost.set)
    return e, lost


def renew_time(lease: dict) -> dt.datetime:
    return dt.datetime.strptime(lease["spec"]["renewTime"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)


async def test_the_lease_stays_held_while_the_main_loop_is_blocked(
    cluster: ClusterInfo, namespace: str, reader: KubeClient
) -> None:
    a, a_lost = elector(cluster, namespace, "replica-a")
    b: leader.Elector | None = None
    try:
        await asyncio.wait_for(a.wait_leading(), 60)
        b, b_lost = elector(cluster, namespace, "replica-b")  # a standby beside it
        renewals = a.renewals
        blocked_at = dt.datetime.now(dt.UTC)

        time.sleep(2 * TIMING.renew_deadline)  # blocks this loop: nothing on it runs meanwhile

        assert a.is_leader(), "leadership lapsed while the main loop was blocked"
        assert a.renewals >= renewals + 3  # one renewal per renew period went on
        lease = await kube_lease.get_lease(reader, namespace, LEASE)
        assert lease is not None and lease["spec"]["holderIdentity"] == "replica-a"
        assert renew_time(lease) > blocked_at + dt.timedelta(seconds=TIMING.renew_deadline)
        assert not b.is_leader() and not a_lost.is_set() and not b_lost.is_set()
        assert await a.prove()
    finally:
        if b is not None:
            await b.stop()
        await a.stop()
    lease = await kube_lease.get_lease(reader, namespace, LEASE)
    assert lease is not None and lease["spec"].get("holderIdentity") is None  # handed back on stop

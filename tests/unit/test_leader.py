"""Leader election's protocol over an in-memory Lease with compare-and-swap (pure logic)."""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

import pytest
from prometheus_client import CollectorRegistry

from pdwarden_localcluster.waits import wait_for
from pdwarden_operator import leader
from pdwarden_operator.kube import lease as kube_lease
from pdwarden_operator.kube.client import KubeApiError, KubeClient
from pdwarden_operator.metrics import OperatorMetrics
from tests.support.kube_client import unreachable_client

pytestmark = pytest.mark.unit


S = TypeVar("S", bound="Store")


def installed(monkeypatch: pytest.MonkeyPatch, store: S) -> S:
    """`store` as the Lease API the elector calls."""
    monkeypatch.setattr(kube_lease, "get_lease", store.get)
    monkeypatch.setattr(kube_lease, "create_lease", store.create)
    monkeypatch.setattr(kube_lease, "replace_lease", store.replace)
    return store


class Store:
    """One Lease object, versioned like the API server's (409 on a stale resourceVersion)."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = None
        self.version = 0

    async def get(self, client: KubeClient, ns: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.obj)

    async def create(self, client: KubeClient, ns: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        if self.obj is not None:
            raise KubeApiError(409, "AlreadyExists", "exists")
        return self._put(spec)

    async def replace(
        self, client: KubeClient, ns: str, name: str, rv: str, spec: dict[str, Any]
    ) -> dict[str, Any]:
        if self.obj is None or self.obj["metadata"]["resourceVersion"] != rv:
            raise KubeApiError(409, "Conflict", "the object has been modified")
        return self._put(spec)

    def _put(self, spec: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.obj = {"metadata": {"resourceVersion": str(self.version)}, "spec": dict(spec)}
        return copy.deepcopy(self.obj)


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Store:
    return installed(monkeypatch, Store())


def elector(identity: str, clock: list[float]) -> tuple[leader.Elector, OperatorMetrics]:
    metrics = OperatorMetrics(CollectorRegistry())
    client = unreachable_client()  # the Lease calls are the store's
    return leader.Elector(
        "ns", "lease", identity, clock=lambda: clock[0], metrics=metrics, client=client
    ), metrics


def gauge(metrics: OperatorMetrics) -> float | None:
    return metrics.registry.get_sample_value("pdwarden_operator_leader")


def test_may_take() -> None:
    assert leader.may_take(None, "a", 0, 15, 1)
    assert leader.may_take("a", "a", 0, 15, 1)
    assert not leader.may_take("b", "a", 0, 15, 14.9)
    assert leader.may_take("b", "a", 0, 15, 15)


def test_one_leader_a_paused_one_loses_and_the_standby_takes_over(store: Store) -> None:
    clock = [100.0]
    a, a_metrics = elector("a", clock)
    b, b_metrics = elector("b", clock)

    async def scenario() -> None:
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()  # a's lease is fresh
        assert a.is_leader() and not b.is_leader()
        assert gauge(a_metrics) == 1 and gauge(b_metrics) == 0
        # a renews every retry period for a while; b keeps seeing a changing record
        for _ in range(5):
            clock[0] += 2
            assert await a.try_acquire_or_renew()
            assert not await b.try_acquire_or_renew()
        # a is paused (SIGSTOP): nothing renews; b waits a full lease duration from its last look
        clock[0] += 14
        assert not await b.try_acquire_or_renew()
        assert not a.is_leader()  # a's own clock already says its term lapsed
        clock[0] += 2
        assert await b.try_acquire_or_renew() and b.is_leader()
        # a resumes: it may neither act nor win the lease back
        assert not await a.prove()
        assert not await a.try_acquire_or_renew()
        assert await b.prove()

    asyncio.run(scenario())
    assert store.obj is not None and store.obj["spec"]["holderIdentity"] == "b"
    assert store.obj["spec"]["leaseTransitions"] == 1
    assert store.obj["spec"]["leaseDurationSeconds"] == 15


def test_two_standbys_racing_for_a_free_lease_get_one_winner(store: Store) -> None:
    clock = [0.0]
    a, _ = elector("a", clock)
    b, _ = elector("b", clock)

    async def scenario() -> list[bool]:
        return list(await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew()))

    assert sorted(asyncio.run(scenario())) == [False, True]


class CountingStore(Store):
    """The Store, counting the requests it answers by verb."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    async def get(self, client: KubeClient, ns: str, name: str) -> dict[str, Any] | None:
        self.calls.append("GET")
        return await super().get(client, ns, name)

    async def replace(
        self, client: KubeClient, ns: str, name: str, rv: str, spec: dict[str, Any]
    ) -> dict[str, Any]:
        self.calls.append("PUT")
        return await super().replace(client, ns, name, rv, spec)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> CountingStore:
    return installed(monkeypatch, CountingStore())


def test_a_leader_renews_with_one_request_and_reads_again_when_the_lease_changed(
    counting: CountingStore,
) -> None:
    clock = [0.0]
    a, _ = elector("a", clock)

    async def scenario() -> None:
        assert await a.try_acquire_or_renew()  # acquiring reads first
        counting.calls.clear()
        for _ in range(3):
            clock[0] += 2
            assert await a.try_acquire_or_renew()
        assert counting.calls == ["PUT"] * 3  # renewing: its own last write's version, no read
        # someone else wrote the Lease (an admin's edit): the renewal's write is refused, the
        # elector reads and, still the holder, renews on what it read
        assert counting.obj is not None
        counting._put({**counting.obj["spec"], "renewTime": "edited"})
        counting.calls.clear()
        clock[0] += 2
        assert await a.try_acquire_or_renew()
        assert counting.calls == ["PUT", "GET", "PUT"]
        assert counting.obj["spec"]["holderIdentity"] == "a" and counting.obj["spec"]["renewTime"] != "edited"

    asyncio.run(scenario())


def test_a_lease_taken_over_is_not_renewed_on_the_fast_path(counting: CountingStore) -> None:
    clock = [0.0]
    a, _ = elector("a", clock)
    b, _ = elector("b", clock)

    async def scenario() -> None:
        assert await a.try_acquire_or_renew()
        clock[0] += 11  # past a's renew deadline: a no longer leads, b may not take it yet
        assert not await b.try_acquire_or_renew()
        clock[0] += 15
        assert await b.try_acquire_or_renew()
        counting.calls.clear()
        assert not await a.try_acquire_or_renew()  # not leading: reads, sees b's fresh Lease
        assert counting.calls == ["GET"]

    asyncio.run(scenario())
    assert counting.obj is not None and counting.obj["spec"]["holderIdentity"] == "b"


def test_a_released_lease_is_taken_at_once(store: Store) -> None:
    clock = [0.0]
    a, a_metrics = elector("a", clock)
    b, _ = elector("b", clock)

    async def scenario() -> None:
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
        await a.release()
        assert gauge(a_metrics) == 0 and not a.is_leader()
        assert await b.try_acquire_or_renew()

    asyncio.run(scenario())


def test_without_an_elector_remediation_is_allowed_and_with_one_it_asks_the_elector() -> None:
    assert asyncio.run(leader.Leadership().still_leading())

    class Deposed:
        async def prove(self) -> bool:
            return False

    assert not asyncio.run(leader.Leadership(cast(Any, Deposed())).still_leading())


class RecordingStore(Store):
    """The Store, recording on which thread each read ran; `down` makes every call fail as an
    unreachable API server would."""

    def __init__(self) -> None:
        super().__init__()
        self.read_on: list[str] = []
        self.down = False

    async def get(self, client: KubeClient, ns: str, name: str) -> dict[str, Any] | None:
        self.read_on.append(threading.current_thread().name)
        if self.down:
            raise KubeApiError(0, "ConnectionRefusedError", "down")
        return await super().get(client, ns, name)

    async def replace(
        self, client: KubeClient, ns: str, name: str, rv: str, spec: dict[str, Any]
    ) -> dict[str, Any]:
        if self.down:
            raise KubeApiError(0, "ConnectionRefusedError", "down")
        return await super().replace(client, ns, name, rv, spec)


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> RecordingStore:
    return installed(monkeypatch, RecordingStore())


# A deadline that passes quickly, for the tests of losing the lease; the others hold it with a
# deadline no starved thread misses (a loaded machine can hold a thread off the GIL for
# seconds, and an elector then rightly gives up a term it could not renew).
FAST = leader.Timing(lease_duration=3.0, renew_deadline=2.0, retry_period=0.05, renew_period=0.05)
ROOMY = leader.Timing(lease_duration=60.0, renew_deadline=40.0, retry_period=0.05, renew_period=0.05)


def threaded(identity: str, timing: leader.Timing = ROOMY) -> tuple[leader.Elector, threading.Event]:
    lost = threading.Event()
    e = leader.Elector(
        "ns",
        "lease",
        identity,
        timing=timing,
        metrics=OperatorMetrics(CollectorRegistry()),
        client=unreachable_client(),  # the Lease calls are the store's
    )
    e.start(on_lost=lost.set)
    return e, lost


def wait_until(condition: Callable[[], bool], what: str) -> None:
    wait_for(condition, 30, what, 0.02, ())  # generous: only a broken elector takes this long


def test_the_elector_thread_leads_renews_and_hands_the_lease_back(recording: RecordingStore) -> None:
    a, a_lost = threaded("a")

    async def main_loop() -> None:
        await asyncio.wait_for(a.wait_leading(), 30)
        assert a.is_leader()
        renewed = recording.version
        wait_until(lambda: recording.version >= renewed + 3, "three renewals")
        # a check before acting runs on the elector's own loop, with its own connection
        assert await a.prove() and recording.read_on[-1] == "pdwarden-leader"
        await a.stop()

    asyncio.run(main_loop())
    assert recording.obj is not None and recording.obj["spec"]["holderIdentity"] is None
    assert not a.is_leader() and not a_lost.is_set()


def test_a_standby_thread_waits_and_stops_without_leading(recording: RecordingStore) -> None:
    a, _ = threaded("a")
    wait_until(a.is_leader, "a leading")
    b, b_lost = threaded("b")

    async def main_loop() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(b.wait_leading(), 0.5)
        await b.stop()
        await a.stop()

    asyncio.run(main_loop())
    assert not b.is_leader() and not b_lost.is_set()
    assert recording.obj is not None and recording.obj["spec"]["holderIdentity"] is None  # a released


def test_renewals_that_keep_failing_end_leadership_on_the_elector_thread(recording: RecordingStore) -> None:
    a, a_lost = threaded("a", FAST)
    wait_until(a.is_leader, "a leading")
    recording.down = True
    wait_until(a_lost.is_set, "on_lost called once the renew deadline passed")
    assert not a.is_leader()
    assert recording.obj is not None and recording.obj["spec"]["holderIdentity"] == "a"  # never released


def test_the_leader_renews_each_renew_period_and_retries_a_failure_each_retry_period() -> None:
    now = [100.0]
    e = leader.Elector(
        "ns",
        "lease",
        "a",
        timing=leader.Timing(),  # 15 s lease, 10 s deadline, 2 s retries, 5 s renewals
        clock=lambda: now[0],
        metrics=OperatorMetrics(CollectorRegistry()),
        client=unreachable_client(),
    )
    assert e.until_next_try() == 0.0  # never tried: at once
    e._tried_at = e._renewed_at = 100.0  # a renewal sent at 100 s succeeded
    now[0] = 101.0
    assert e.until_next_try() == 4.0
    now[0] = 105.0
    e._tried_at = 105.0  # the renewal at 105 s failed
    assert e.until_next_try() == 2.0
    now[0] = 109.0
    e._tried_at = 109.0  # and the one at 107 s, and at 109 s: still leading, one more try
    assert e.is_leader() and e.until_next_try() == 2.0
    now[0] = 110.0
    assert not e.is_leader()  # the deadline passed: the hold loop ends before another try


@pytest.mark.parametrize(
    "timing",
    [
        {"renew_period": 1.0},  # under the retry period
        {"renew_period": 10.0},  # not under the deadline: no try could beat it
        {"renew_deadline": 15.0},  # the standby could take over while it still leads
        {"retry_period": 0.0},
    ],
)
def test_a_timing_that_could_lose_the_lease_unseen_is_refused(timing: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="leader timing"):
        leader.Timing(**timing)

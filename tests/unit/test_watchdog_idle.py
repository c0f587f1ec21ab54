"""A watchdog with nothing to look at (a parked model, a spec that does not validate) has no
rounds until its model's body changes: a thousand parked models cost nothing between watch
events. A change is looked at on the watchdog's own phase (within one scrape interval), so
models changed together do not all scrape in the same second."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

import pdwarden_contract as contract
from pdwarden_operator.metrics import OperatorMetrics
from pdwarden_operator.watchdog import model_watchdog
from pdwarden_operator.watchdog.context import WatchdogContext
from pdwarden_operator.watchdog.latest_body import LatestBody
from pdwarden_operator.watchdog.model_watchdog import ModelWatchdog
from tests.support.kube_client import unreachable_client

pytestmark = pytest.mark.unit

KEY = ("ns", "parked")
ROUNDS = f"{contract.METRIC_OPERATOR_ROUND_SECONDS}_count"


PARKED_STATUS = {role: {"replicas": 0, "readyReplicas": 0} for role in contract.RUNTIME_ROLES}


def _parked(generation: int, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"namespace": KEY[0], "name": KEY[1], "uid": "uid-1", "generation": generation},
        "spec": spec
        if spec is not None
        else {
            "model": {"path": "synthetic/bench"},
            "engine": "synthetic",
            "prefill": {"replicas": 0},
            "decode": {"replicas": 0},
            "watchdog": {"scrapeIntervalSeconds": 1},
        },
        "status": PARKED_STATUS,
    }


class _Running:
    def __init__(self, latest: LatestBody) -> None:
        self.latest = latest
        self.metrics = OperatorMetrics()
        context = WatchdogContext.build(self.metrics, kube=unreachable_client())
        self.task = asyncio.create_task(ModelWatchdog(*KEY, "uid-1", context=context).run(latest))

    def rounds(self) -> float:
        return self.metrics.registry.get_sample_value(ROUNDS) or 0.0

    async def until_rounds(self, n: float) -> None:
        while self.rounds() < n:
            await asyncio.sleep(0.01)


@pytest.fixture
async def start(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.setattr(model_watchdog, "FIRST_ROUND_MIN_S", 0.0)
    monkeypatch.setattr(model_watchdog, "FIRST_ROUND_MAX_S", 0.0)
    started: list[_Running] = []

    def _start(body: dict[str, Any]) -> _Running:
        running = _Running(LatestBody(body))
        started.append(running)
        return running

    yield _start
    for running in started:
        running.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running.task


@pytest.mark.parametrize(
    "spec",
    [None, {"engine": "no-such-engine", "watchdog": {"scrapeIntervalSeconds": 1}}],
    ids=["parked at 0 replicas", "spec does not validate"],
)
async def test_an_idle_watchdog_has_no_rounds_until_its_body_changes(start: Any, spec: Any) -> None:
    running = start(_parked(1, spec))
    await asyncio.wait_for(running.until_rounds(1), 5)
    # with a round per 1 s interval there would be at least two more by now
    await asyncio.sleep(2.6)
    assert running.rounds() == 1
    assert not running.task.done()
    running.latest.set(_parked(2, spec))
    await asyncio.wait_for(running.until_rounds(2), 5)  # the new body is looked at
    await asyncio.sleep(0.2)
    assert running.rounds() == 2


async def test_an_idle_watchdog_ends_when_its_model_is_gone(start: Any) -> None:
    running = start(_parked(1))
    await asyncio.wait_for(running.until_rounds(1), 5)
    running.latest.end()
    await asyncio.wait_for(running.task, 5)
    assert running.rounds() == 1


async def test_a_wait_returns_at_once_for_a_body_newer_than_the_one_read() -> None:
    latest = LatestBody({"v": 0})
    read = latest.version
    latest.set({"v": 1})  # arrived while the round ran
    await asyncio.wait_for(latest.changed_since(read), 1)
    assert latest.get() == {"v": 1}


async def test_a_wait_lasts_until_the_next_body_and_wakes_every_waiter() -> None:
    latest = LatestBody({"v": 0})
    read = latest.version
    waiters = [asyncio.create_task(latest.changed_since(read)) for _ in range(3)]
    await asyncio.sleep(0.05)
    assert not any(w.done() for w in waiters)
    latest.set({"v": 1})
    await asyncio.wait_for(asyncio.gather(*waiters), 1)
    # a later wait from the new version waits again, until the end
    later = asyncio.create_task(latest.changed_since(latest.version))
    await asyncio.sleep(0.05)
    assert not later.done()
    latest.end()
    await asyncio.wait_for(later, 1)
    assert latest.get() is None


@pytest.mark.parametrize(
    ("anchor", "period", "now", "wait"),
    [
        (100.0, 10.0, 100.0, 0.0),
        (100.0, 10.0, 103.0, 7.0),
        (100.0, 10.0, 131.0, 9.0),
        (100.0, 1.0, 100.25, 0.75),
    ],
)
def test_a_woken_watchdog_waits_for_its_own_phase(
    anchor: float, period: float, now: float, wait: float
) -> None:
    assert model_watchdog.until_phase(anchor, period, now) == pytest.approx(wait)


async def test_models_changed_together_keep_their_spread_phases(
    start: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twenty parked models whose first rounds were spread over their 1 s interval all change
    at once: their next rounds come spread over that second again, not together."""
    delays = iter([i / 20 for i in range(20)])
    monkeypatch.setattr(model_watchdog, "first_round_delay", lambda *_: next(delays))
    second_round_at: list[float] = []
    original = ModelWatchdog.round

    async def round_(self: ModelWatchdog, body: Any) -> float | None:
        if (body.get("metadata") or {}).get("generation") == 2:
            second_round_at.append(asyncio.get_running_loop().time())
        return await original(self, body)

    monkeypatch.setattr(ModelWatchdog, "round", round_)
    fleet = [start(_parked(1)) for _ in range(20)]
    await asyncio.wait_for(asyncio.gather(*(r.until_rounds(1) for r in fleet)), 5)
    for running in fleet:
        running.latest.set(_parked(2))
    await asyncio.wait_for(asyncio.gather(*(r.until_rounds(2) for r in fleet)), 5)
    assert len(second_round_at) == 20
    assert max(second_round_at) - min(second_round_at) > 0.8

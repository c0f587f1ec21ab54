"""The one status writer: both inputs, one pure composition, no write of what a writer did not see."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pdwarden_operator.models import parse_spec
from pdwarden_operator.status import Observed, observe_deployment
from pdwarden_operator.status_writer import StatusWriter
from pdwarden_operator.watchdog.state import WatchdogState, state_to_status

pytestmark = pytest.mark.unit

SPEC = parse_spec({"model": {"path": "m"}, "prefill": {"replicas": 2}, "decode": {"replicas": 1}})
BODY = {"metadata": {"namespace": "ns", "name": "m", "generation": 3}, "status": {}}


def deployment(replicas: int, ready: int, *, stalled: bool = False) -> dict[str, Any]:
    conditions = [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]
    return {
        "metadata": {"generation": 1},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": 1,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": ready,
            "conditions": conditions if stalled else [],
        },
    }


def stalled_rollout() -> Observed:
    return Observed(
        generation=3,
        workloads={
            "prefill": observe_deployment(deployment(2, 1, stalled=True)),
            "decode": observe_deployment(deployment(1, 1)),
            "router": observe_deployment(deployment(1, 1)),
        },
    )


def findings(at: float, wedged: list[str]) -> dict[str, Any]:
    out = state_to_status(
        WatchdogState(), last_scrape=at, wedged_pods=wedged, unobserved_pods=[], max_remediations=3
    )
    out["watchdog"]["budgetExhausted"] = False
    return out


class Recorder:
    """Stands in for the API: records every patch and applies it as a merge patch would."""

    def __init__(self) -> None:
        self.writes: list[dict[str, Any]] = []
        self.status: dict[str, Any] = {}

    async def __call__(self, ns: str, name: str, patch: dict[str, Any], rv: str | None) -> None:
        self.writes.append(patch)
        self.status.update(patch)


def test_a_stalled_rollout_and_a_wedge_never_make_conditions_flap() -> None:
    api = Recorder()
    clock = [datetime(2026, 11, 30, 6, 0, tzinfo=UTC)]
    writer = StatusWriter(api, clock=lambda: clock[0])

    async def scenario() -> None:
        # resyncs (every 30 s) and watchdog rounds (every 10 s) interleaved for five minutes,
        # the rollout stalled and one prefill pod wedged the whole time
        for tick in range(30):
            clock[0] += timedelta(seconds=10)
            body = {**BODY, "status": dict(api.status)}
            if tick % 3 == 0:
                await writer.observed(body, SPEC, stalled_rollout())
            await writer.findings(body, SPEC, findings(1.8e9 + 10 * tick, ["m-prefill-a"]))

    asyncio.run(scenario())
    snapshots = [
        [(c["type"], c["status"], c["reason"]) for c in w["conditions"]]
        for w in api.writes
        if "conditions" in w
    ]
    # the first write (the reconciler's, before any scrape) says Wedged Unknown; the wedge found
    # makes one change; after that nothing moves, whichever input triggers the write
    assert len(snapshots) == 2, snapshots
    assert [dict((t, s) for t, s, _ in snap)["Wedged"] for snap in snapshots] == ["Unknown", "True"]
    assert len(api.writes) >= 20  # the watchdog's rounds kept writing (lastScrape heartbeats included)
    by_type = {c["type"]: (c["status"], c["reason"]) for c in api.status["conditions"]}
    assert by_type == {
        "Ready": ("False", "ReplicasNotReady"),
        "Progressing": ("True", "RollingOut"),
        "Degraded": ("True", "RolloutStalled"),
        "Wedged": ("True", "InflightQueueStuck"),
        "FleetBrake": ("False", "NotEngaged"),
    }
    assert api.status["phase"] == "Degraded"


def test_the_watchdog_alone_writes_only_its_own_keys() -> None:
    api = Recorder()
    body = {**BODY, "status": {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}]}}
    asyncio.run(StatusWriter(api).findings(body, SPEC, findings(1.8e9, ["m-prefill-a"])))
    assert [set(w) for w in api.writes] == [{"watchdog", "remediations"}]


def test_the_reconciler_uses_the_watchdogs_latest_findings() -> None:
    api = Recorder()
    writer = StatusWriter(api)

    async def scenario() -> None:
        await writer.findings(BODY, SPEC, findings(1.8e9, ["m-prefill-a"]))
        await writer.observed(BODY, SPEC, stalled_rollout())
        await writer.findings(BODY, SPEC, findings(1.8e9 + 10, []))  # the wedge cleared

    asyncio.run(scenario())
    wedged = [c["status"] for w in api.writes for c in w.get("conditions", ()) if c["type"] == "Wedged"]
    assert wedged == ["True", "False"]
    assert "watchdog" not in api.writes[1]  # the reconciler's write carried nothing new of the watchdog's


def test_an_intent_carries_the_resource_version_it_read() -> None:
    seen: list[str | None] = []

    async def patch(ns: str, name: str, body: dict[str, Any], rv: str | None) -> None:
        seen.append(rv)

    asyncio.run(StatusWriter(patch).findings(BODY, SPEC, findings(1.8e9, []), resource_version="42"))
    assert seen == ["42"]


def test_a_failed_write_is_not_remembered_as_written() -> None:
    calls: list[dict[str, Any]] = []

    async def failing(ns: str, name: str, body: dict[str, Any], rv: str | None) -> None:
        calls.append(body)
        if len(calls) == 1:
            raise RuntimeError("409 Conflict")

    writer = StatusWriter(failing)
    with pytest.raises(RuntimeError):
        asyncio.run(writer.findings(BODY, SPEC, findings(1.8e9, ["m-prefill-a"])))
    asyncio.run(writer.findings(BODY, SPEC, findings(1.8e9, ["m-prefill-a"])))
    assert calls[0] == calls[1]  # the same patch again: nothing was taken as written


def test_a_refused_generation_is_remembered_until_an_observation_without_the_refusal() -> None:
    writer = StatusWriter(Recorder())
    refusal = Observed(3, error_reason="ApplyFailed", error_message="Deployment m-decode was refused")

    async def scenario() -> list[bool]:
        seen = [writer.refused("ns", "m", 3)]
        await writer.observed(BODY, SPEC, refusal)
        seen += [writer.refused("ns", "m", 3), writer.refused("ns", "m", 4)]
        await writer.observed(BODY, SPEC, Observed(3))
        seen.append(writer.refused("ns", "m", 3))
        await writer.observed(BODY, SPEC, refusal)
        writer.forget("ns", "m")
        return [*seen, writer.refused("ns", "m", 3)]

    assert asyncio.run(scenario()) == [False, True, False, False, False]

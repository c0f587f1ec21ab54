"""The watchdog's status parts are typed (resource/status_parts.py: WatchdogStatus,
RemediationStatus): what state.py writes is exactly what the CRD declares (an undeclared key
would be pruned by the API server), null only where the CRD allows it, and reading back gives
the same state; a malformed stored entry costs only itself."""

from __future__ import annotations

from typing import Any, get_args, get_origin

import pytest
from pydantic import BaseModel

from pdwarden_operator.crd import build_crd
from pdwarden_operator.resource.status_parts import FleetBrakeStatus, RemediationStatus, WatchdogStatus
from pdwarden_operator.watchdog.outcome import Outcome
from pdwarden_operator.watchdog.state import (
    InFlight,
    Remediation,
    WatchdogState,
    state_from_status,
    state_to_status,
)

pytestmark = pytest.mark.unit
T0 = 1_800_000_000.0
QUARANTINE = ((Outcome.QUARANTINED, T0 + 1),)

STATE = WatchdogState(
    window_start=T0,
    used=2,
    exhausted=True,
    cooldown_until={"prefill": T0 + 60},
    in_flight=(
        InFlight("p1", "uid-p1", "prefill", "drain", T0, 3, "stuck", 1, Outcome.QUARANTINED, None, T0 + 1),
        InFlight("d1", "uid-d1", "decode", "evict", T0, 4, "stuck", 0, Outcome.THROTTLED, T0 + 25, None),
    ),
    remediations=(
        Remediation(
            3, "p1", "prefill", "stuck", "drain", T0, Outcome.QUARANTINED, ((Outcome.QUARANTINED, T0 + 1),)
        ),
        Remediation(4, "d1", "decode", "stuck", "evict", T0, Outcome.THROTTLED),
    ),
    next_id=5,
)


def _status() -> dict[str, Any]:
    return state_to_status(
        STATE,
        last_scrape=T0 + 2,
        wedged_pods=["p1"],
        unobserved_pods=[],
        max_remediations=2,
        budget_exhausted=True,
        fleet_brake=FleetBrakeStatus(engaged=True, scope="namespace", reason="3 pods"),
    )


def _model_of(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *get_args(annotation)):
        if get_origin(candidate) is list:
            return _model_of(get_args(candidate)[0])
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _undeclared(value: Any, model: type[BaseModel], path: str) -> list[str]:
    if isinstance(value, list):
        return [u for i, item in enumerate(value) for u in _undeclared(item, model, f"{path}[{i}]")]
    declared = {f.alias or name: f for name, f in model.model_fields.items()}
    out = [f"{path}.{key}" for key in value if key not in declared]
    for key, sub in value.items():
        inner = _model_of(declared[key].annotation) if key in declared else None
        if inner is not None and sub is not None:
            out += _undeclared(sub, inner, f"{path}.{key}")
    return out


def _schema(path: tuple[str, ...]) -> dict[str, Any]:
    node = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for part in ("status", *path):
        node = node["items"] if part == "[]" else node["properties"][part]
    return dict(node)


def test_what_state_writes_is_declared_and_reads_back_as_it_was() -> None:
    status = _status()
    assert _undeclared(status["watchdog"], WatchdogStatus, "watchdog") == []
    assert _undeclared(status["remediations"], RemediationStatus, "remediations") == []
    assert state_from_status(status) == STATE
    watchdog = status["watchdog"]
    assert watchdog["budgetExhausted"] is True and watchdog["fleetBrake"]["scope"] == "namespace"
    assert watchdog["inFlight"][0]["quarantinedAt"] and "quarantinedAt" not in watchdog["inFlight"][1]
    assert "phases" in status["remediations"][0] and "phases" not in status["remediations"][1]


def test_null_is_written_only_where_the_crd_allows_it() -> None:
    status = state_to_status(
        WatchdogState(in_flight=(STATE.in_flight[0],)),
        last_scrape=None,
        wedged_pods=[],
        unobserved_pods=[],
        max_remediations=1,
        fleet_brake=FleetBrakeStatus(engaged=False),
    )
    nulls: list[tuple[str, ...]] = []

    def walk(value: Any, path: tuple[str, ...]) -> None:
        if value is None:
            nulls.append(path)
        elif isinstance(value, dict):
            for key, sub in value.items():
                walk(sub, (*path, key))
        elif isinstance(value, list):
            for item in value:
                walk(item, (*path, "[]"))

    walk(status, ())
    assert nulls, "a window not open and no scrape yet are written as null"
    for path in nulls:
        assert _schema(path).get("nullable") is True, path
    assert status["watchdog"]["fleetBrake"] == {"engaged": False}


def test_a_malformed_stored_entry_costs_only_itself() -> None:
    status = _status()
    status["watchdog"]["inFlight"].insert(0, {"pod": "x", "action": "explode"})
    status["remediations"].append({"id": "seven"})
    status["watchdog"]["budget"] = {"used": -1}
    read = state_from_status(status)
    assert read.in_flight == STATE.in_flight and read.remediations == STATE.remediations
    assert (read.used, read.window_start) == (0, None)

"""The watchdog's persisted state: what must survive an operator restart, and its status shape.

Lives in the DisaggregatedModel's status (`status.watchdog`, `status.remediations`), never only
in memory, so a restarted operator neither repeats nor forgets a remediation. Reading is
tolerant: a malformed stored entry is dropped, not fatal.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pdwarden_operator.watchdog.settings import ACTIONS

MAX_REMEDIATIONS_KEPT = 20


def to_rfc3339(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def from_rfc3339(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


@dataclass(frozen=True)
class InFlight:
    """A remediation decided (intent persisted) and not yet known to be finished."""

    pod: str
    uid: str
    role: str
    action: str
    started_at: float
    attempts: int = 0  # calls made so far (0: intent written, action not yet performed)
    last_outcome: str = "pending"


@dataclass(frozen=True)
class Remediation:
    """One decision, as `status.remediations` shows it."""

    pod: str
    role: str
    reason: str
    action: str
    time: float
    outcome: str


@dataclass(frozen=True)
class WatchdogState:
    window_start: float | None = None
    used: int = 0
    exhausted: bool = False
    cooldown_until: Mapping[str, float] = field(default_factory=dict)
    in_flight: tuple[InFlight, ...] = ()
    remediations: tuple[Remediation, ...] = ()

    def with_remediation(self, entry: Remediation) -> WatchdogState:
        kept = (*self.remediations, entry)[-MAX_REMEDIATIONS_KEPT:]
        return replace(self, remediations=kept)


def _entries(value: Any) -> Sequence[Mapping[str, Any]]:
    if not isinstance(value, list):
        return ()
    return [item for item in value if isinstance(item, Mapping)]


def state_from_status(status: Mapping[str, Any] | None) -> WatchdogState:
    """Read the persisted state from a DisaggregatedModel's status (missing parts -> defaults)."""
    status = status or {}
    wd = status.get("watchdog") if isinstance(status.get("watchdog"), Mapping) else {}
    assert isinstance(wd, Mapping)
    budget = wd.get("budget") if isinstance(wd.get("budget"), Mapping) else {}
    assert isinstance(budget, Mapping)
    used = budget.get("used")
    cooldowns: dict[str, float] = {}
    raw_cooldowns = wd.get("cooldownUntil")
    if isinstance(raw_cooldowns, Mapping):
        for role, when in raw_cooldowns.items():
            parsed = from_rfc3339(when)
            if parsed is not None:
                cooldowns[str(role)] = parsed
    in_flight: list[InFlight] = []
    for item in _entries(wd.get("inFlight")):
        started = from_rfc3339(item.get("startedAt"))
        if started is None or not all(isinstance(item.get(k), str) for k in ("pod", "role", "action")):
            continue
        if item["action"] not in ACTIONS:
            continue
        attempts = item.get("attempts")
        in_flight.append(
            InFlight(
                pod=item["pod"],
                uid=str(item.get("uid") or ""),
                role=item["role"],
                action=item["action"],
                started_at=started,
                attempts=attempts if isinstance(attempts, int) and attempts >= 0 else 0,
                last_outcome=str(item.get("lastOutcome") or "pending"),
            )
        )
    remediations: list[Remediation] = []
    for item in _entries(status.get("remediations")):
        when = from_rfc3339(item.get("time"))
        if when is None:
            continue
        remediations.append(
            Remediation(
                pod=str(item.get("pod", "")),
                role=str(item.get("role", "")),
                reason=str(item.get("reason", "")),
                action=str(item.get("action", "")),
                time=when,
                outcome=str(item.get("outcome", "")),
            )
        )
    return WatchdogState(
        window_start=from_rfc3339(budget.get("windowStart")),
        used=used if isinstance(used, int) and used >= 0 else 0,
        exhausted=bool(budget.get("exhausted", False)),
        cooldown_until=cooldowns,
        in_flight=tuple(in_flight),
        remediations=tuple(remediations[-MAX_REMEDIATIONS_KEPT:]),
    )


def state_to_status(
    state: WatchdogState,
    *,
    last_scrape: float | None,
    wedged_pods: Sequence[str],
    unobserved_pods: Sequence[str],
    max_remediations: int,
) -> dict[str, Any]:
    """The status patch body for the watchdog's parts (`watchdog`, `remediations`)."""
    return {
        "watchdog": {
            "lastScrape": to_rfc3339(last_scrape) if last_scrape is not None else None,
            "wedgedPods": sorted(wedged_pods),
            "unobservedPods": sorted(unobserved_pods),
            "budget": {
                "windowStart": to_rfc3339(state.window_start) if state.window_start is not None else None,
                "used": state.used,
                "limit": max_remediations,
                "exhausted": state.exhausted,
            },
            "cooldownUntil": {role: to_rfc3339(t) for role, t in sorted(state.cooldown_until.items())},
            "inFlight": [
                {
                    "pod": f.pod,
                    "uid": f.uid,
                    "role": f.role,
                    "action": f.action,
                    "startedAt": to_rfc3339(f.started_at),
                    "attempts": f.attempts,
                    "lastOutcome": f.last_outcome,
                }
                for f in state.in_flight
            ],
        },
        "remediations": [
            {
                "pod": r.pod,
                "role": r.role,
                "reason": r.reason,
                "action": r.action,
                "time": to_rfc3339(r.time),
                "outcome": r.outcome,
            }
            for r in state.remediations
        ],
    }


# A round whose findings did not change still refreshes `lastScrape` this often, so a person
# (or an alert) can tell a live watchdog from a dead one without a status write per model
# per scrape interval: with 1,000 models that would be 100 writes/s for nothing.
STATUS_HEARTBEAT_S = 60.0


def _without_heartbeat(patch: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(patch)
    watchdog = out.get("watchdog")
    if isinstance(watchdog, Mapping):
        out["watchdog"] = {k: v for k, v in watchdog.items() if k != "lastScrape"}
    return out


def status_write_due(
    last_written: Mapping[str, Any] | None,
    last_written_at: float | None,
    new: Mapping[str, Any],
    now: float,
    heartbeat_s: float = STATUS_HEARTBEAT_S,
) -> bool:
    """Whether a round's status patch must be written: something besides `lastScrape` changed,
    nothing was written yet by this process, or the last write is a heartbeat old."""
    if last_written is None or last_written_at is None:
        return True
    if now - last_written_at >= heartbeat_s:
        return True
    return _without_heartbeat(last_written) != _without_heartbeat(new)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value > 0 else 0


def round_due(status: Mapping[str, Any] | None, seen_pods: bool, runtime_roles: Sequence[str]) -> bool:
    """Whether a round has anything to look at, judged from the status the reconciler wrote.

    A model none of whose runtime pods is Ready (new, parked at 0 replicas, still starting) has
    nothing to scrape: rounds there would only list pods and write status. A round still runs
    when this process has scraped a pod before (it may now be unready: unobserved), when a
    remediation is in flight, or when the status names wedged/unobserved pods to clear.
    """
    if seen_pods:
        return True
    status = status if isinstance(status, Mapping) else {}
    watchdog = status.get("watchdog")
    if isinstance(watchdog, Mapping) and any(
        watchdog.get(k) for k in ("inFlight", "wedgedPods", "unobservedPods")
    ):
        return True
    for role in runtime_roles:
        part = status.get(role)
        if isinstance(part, Mapping) and _count(part.get("readyReplicas")) > 0:
            return True
    return False

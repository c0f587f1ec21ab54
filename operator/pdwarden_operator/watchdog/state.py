"""The watchdog's persisted state: what must survive an operator restart, and its status shape.

Lives in the DisaggregatedModel's status (`status.watchdog`, `status.remediations`), never only
in memory, so a restarted operator neither repeats nor forgets a remediation. Reading is
tolerant: a malformed stored entry is dropped, not fatal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pdwarden_operator.models import MAX_REMEDIATIONS_KEPT, WATCHDOG_ACTIONS
from pdwarden_operator.timestamps import from_rfc3339, to_rfc3339
from pdwarden_operator.watchdog.outcome import Outcome, parse


@dataclass(frozen=True)
class InFlight:
    """A remediation decided (intent persisted) and not yet known to be finished."""

    pod: str
    uid: str
    role: str
    action: str
    started_at: float
    remediation_id: int  # the `status.remediations` entry this remediation updates
    reason: str = ""
    attempts: int = 0  # calls made so far (0: intent written, action not yet performed)
    last_outcome: Outcome = Outcome.PENDING
    not_before: float | None = None  # a 429's Retry-After: not retried before this time
    quarantined_at: float | None = None  # action drain: when the pod left its Deployment's selector


@dataclass(frozen=True)
class Remediation:
    """One decision, as `status.remediations` shows it; `id` is stable for its lifetime."""

    id: int
    pod: str
    role: str
    reason: str
    action: str
    time: float
    outcome: Outcome
    # action drain: every phase the entry went through, with its time (status shows them all)
    phases: tuple[tuple[Outcome, float], ...] = ()


@dataclass(frozen=True)
class WatchdogState:
    window_start: float | None = None
    used: int = 0
    exhausted: bool = False
    cooldown_until: Mapping[str, float] = field(default_factory=dict)
    in_flight: tuple[InFlight, ...] = ()
    remediations: tuple[Remediation, ...] = ()
    next_id: int = 1

    def with_remediation(self, entry: Remediation) -> WatchdogState:
        """Add an entry (its id taken from `next_id`), keeping at most MAX_REMEDIATIONS_KEPT: the
        oldest entries no in-flight remediation refers to go first, so an open remediation's
        entry never rolls out of the history."""
        entry = replace(entry, id=self.next_id)
        entries = [*self.remediations, entry]
        open_ids = {f.remediation_id for f in self.in_flight}
        while len(entries) > MAX_REMEDIATIONS_KEPT:
            drop = next((i for i, e in enumerate(entries) if e.id not in open_ids), 0)
            del entries[drop]
        return replace(self, remediations=tuple(entries), next_id=self.next_id + 1)

    def entry(self, remediation_id: int) -> Remediation | None:
        return next((e for e in self.remediations if e.id == remediation_id), None)


def _entries(value: Any) -> Sequence[Mapping[str, Any]]:
    if not isinstance(value, list):
        return ()
    return [item for item in value if isinstance(item, Mapping)]


def _phases(value: Any) -> tuple[tuple[Outcome, float], ...]:
    out = []
    for item in _entries(value):
        when = from_rfc3339(item.get("time"))
        if when is not None:
            out.append((parse(item.get("phase"), Outcome.ERROR), when))
    return tuple(out)


def _remediation_to_status(r: Remediation) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": r.id,
        "pod": r.pod,
        "role": r.role,
        "reason": r.reason,
        "action": r.action,
        "time": to_rfc3339(r.time),
        "outcome": r.outcome.value,
    }
    if r.phases:
        entry["phases"] = [{"phase": p.value, "time": to_rfc3339(t)} for p, t in r.phases]
    return entry


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
        rid = item.get("remediationId")
        if started is None or not all(isinstance(item.get(k), str) for k in ("pod", "role", "action")):
            continue
        if item["action"] not in WATCHDOG_ACTIONS or not isinstance(rid, int):
            continue
        attempts = item.get("attempts")
        in_flight.append(
            InFlight(
                pod=item["pod"],
                uid=str(item.get("uid") or ""),
                role=item["role"],
                action=item["action"],
                started_at=started,
                remediation_id=rid,
                reason=str(item.get("reason") or ""),
                attempts=attempts if isinstance(attempts, int) and attempts >= 0 else 0,
                last_outcome=parse(item.get("lastOutcome")),
                not_before=from_rfc3339(item.get("notBefore")),
                quarantined_at=from_rfc3339(item.get("quarantinedAt")),
            )
        )
    remediations: list[Remediation] = []
    for item in _entries(status.get("remediations")):
        when = from_rfc3339(item.get("time"))
        rid = item.get("id")
        if when is None or not isinstance(rid, int):
            continue
        remediations.append(
            Remediation(
                id=rid,
                pod=str(item.get("pod", "")),
                role=str(item.get("role", "")),
                reason=str(item.get("reason", "")),
                action=str(item.get("action", "")),
                time=when,
                outcome=parse(item.get("outcome"), Outcome.ERROR),
                phases=_phases(item.get("phases")),
            )
        )
    next_id = wd.get("nextId")
    known = max([r.id for r in remediations] + [f.remediation_id for f in in_flight] + [0])
    return WatchdogState(
        window_start=from_rfc3339(budget.get("windowStart")),
        used=used if isinstance(used, int) and used >= 0 else 0,
        exhausted=bool(budget.get("exhausted", False)),
        cooldown_until=cooldowns,
        in_flight=tuple(in_flight),
        remediations=tuple(remediations[-MAX_REMEDIATIONS_KEPT:]),
        next_id=max(next_id if isinstance(next_id, int) else 1, known + 1),
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
            "nextId": state.next_id,
            "inFlight": [
                {
                    "pod": f.pod,
                    "uid": f.uid,
                    "role": f.role,
                    "action": f.action,
                    "startedAt": to_rfc3339(f.started_at),
                    "remediationId": f.remediation_id,
                    "reason": f.reason,
                    "attempts": f.attempts,
                    "lastOutcome": f.last_outcome.value,
                    "notBefore": to_rfc3339(f.not_before) if f.not_before is not None else None,
                    **(
                        {"quarantinedAt": to_rfc3339(f.quarantined_at)}
                        if f.quarantined_at is not None
                        else {}
                    ),
                }
                for f in state.in_flight
            ],
        },
        "remediations": [_remediation_to_status(r) for r in state.remediations],
    }


# A round whose findings did not change still refreshes `lastScrape` this often, so a person
# (or an alert) can tell a live watchdog from a dead one without a status write per model
# per scrape interval: with 1,000 models that would be 100 writes/s for nothing.
STATUS_HEARTBEAT_S = 60.0


def _without_heartbeat(patch: Mapping[str, Any]) -> dict[str, Any]:
    """The patch without what changes every round: lastScrape, and an autoscaled role's
    message (its load figures); a change of count or reason is still written at once."""
    out = dict(patch)
    watchdog = out.get("watchdog")
    if isinstance(watchdog, Mapping):
        out["watchdog"] = {k: v for k, v in watchdog.items() if k != "lastScrape"}
    autoscaling = out.get("autoscaling")
    if isinstance(autoscaling, Mapping):
        out["autoscaling"] = {
            k: {f: x for f, x in v.items() if f != "message"} if isinstance(v, Mapping) else v
            for k, v in autoscaling.items()
        }
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

"""The watchdog's persisted state: what must survive an operator restart, and its status shape.

Lives in the DisaggregatedModel's status (`status.watchdog`, `status.remediations`), never only
in memory, so a restarted operator neither repeats nor forgets a remediation. Reading is
tolerant: a malformed stored entry is dropped, not fatal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from pdwarden_operator.resource.status_parts import (
    MAX_REMEDIATIONS_KEPT,
    BudgetStatus,
    FleetBrakeStatus,
    InFlightStatus,
    RemediationPhase,
    RemediationStatus,
    WatchdogStatus,
)
from pdwarden_operator.resource.watchdog import WatchdogAction
from pdwarden_operator.timestamps import from_rfc3339, to_rfc3339
from pdwarden_operator.watchdog.outcome import Outcome, parse


@dataclass(frozen=True)
class InFlight:
    """A remediation decided (intent persisted) and not yet known to be finished."""

    pod: str
    uid: str
    role: str
    action: WatchdogAction
    started_at: float
    remediation_id: int  # the `status.remediations` entry this remediation updates
    reason: str = ""
    attempts: int = 0  # calls made so far (0: intent written, action not yet performed)
    last_outcome: Outcome = Outcome.PENDING
    not_before: float | None = None  # a 429's Retry-After: not retried before this time
    quarantined_at: float | None = None  # action drain: when the pod left its Deployment's selector


@dataclass(frozen=True)
class Alert:
    """An open alert episode (`action: alert`): reported once, kept until the pod is healthy or
    gone. It holds no remediation slot (no budget, cooldown or unavailability); the status lists
    it among `inFlight` as action `alert`, outcome `alerted`."""

    pod: str
    uid: str
    role: str
    started_at: float
    remediation_id: int
    reason: str = ""

    def as_in_flight(self) -> InFlight:
        """Its entry in `status.watchdog.inFlight`."""
        return InFlight(
            self.pod,
            self.uid,
            self.role,
            "alert",
            self.started_at,
            self.remediation_id,
            self.reason,
            attempts=1,
            last_outcome=Outcome.ALERTED,
        )


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
    alerts: tuple[Alert, ...] = ()  # open alert episodes (action alert): not remediations in flight

    def with_remediation(self, entry: Remediation) -> WatchdogState:
        """Add an entry (its id taken from `next_id`), keeping at most MAX_REMEDIATIONS_KEPT: the
        oldest entries no in-flight remediation refers to go first, so an open remediation's
        entry never rolls out of the history."""
        entry = replace(entry, id=self.next_id)
        entries = [*self.remediations, entry]
        open_ids = {f.remediation_id for f in self.in_flight} | {a.remediation_id for a in self.alerts}
        while len(entries) > MAX_REMEDIATIONS_KEPT:
            drop = next((i for i, e in enumerate(entries) if e.id not in open_ids), 0)
            del entries[drop]
        return replace(self, remediations=tuple(entries), next_id=self.next_id + 1)

    def entry(self, remediation_id: int) -> Remediation | None:
        return next((e for e in self.remediations if e.id == remediation_id), None)


_Part = TypeVar("_Part", bound=BaseModel)


def _valid(model: type[_Part], value: Any) -> _Part | None:
    """`value` read as `model`, or None when it does not fit (a malformed stored part is
    dropped, never fatal)."""
    try:
        return model.model_validate(value)
    except ValidationError:
        return None


def _each(model: type[_Part], value: Any) -> list[_Part]:
    """The entries of a stored list that fit `model`."""
    items = value if isinstance(value, list) else []
    return [part for item in items if (part := _valid(model, item)) is not None]


# InFlight and InFlightStatus share their field names; only these differ in form (a wall-clock
# float here, RFC 3339 in the status) and the outcome (an Outcome here, its value there).
_IN_FLIGHT_TIMES = ("started_at", "not_before", "quarantined_at")
# Remediation and RemediationStatus: the fields of the same form (time, outcome, phases differ)
_REMEDIATION_SAME = {"id", "pod", "role", "reason", "action"}


def _in_flight(item: InFlightStatus) -> InFlight | None:
    values = item.model_dump()  # field names, not the wire's aliases
    times = {k: from_rfc3339(values.get(k)) for k in _IN_FLIGHT_TIMES}
    if times["started_at"] is None:
        return None
    return InFlight(**{**values, **times, "last_outcome": parse(item.last_outcome)})


def _alert(flight: InFlight) -> Alert:
    return Alert(flight.pod, flight.uid, flight.role, flight.started_at, flight.remediation_id, flight.reason)


def _remediation(item: RemediationStatus) -> Remediation | None:
    when = from_rfc3339(item.time)
    if when is None:
        return None
    phases = [(parse(p.phase, Outcome.ERROR), from_rfc3339(p.time)) for p in item.phases or ()]
    return Remediation(
        **item.model_dump(include=_REMEDIATION_SAME),
        time=when,
        outcome=parse(item.outcome, Outcome.ERROR),
        phases=tuple((phase, t) for phase, t in phases if t is not None),
    )


def state_from_status(status: Mapping[str, Any] | None) -> WatchdogState:
    """Read the persisted state from a DisaggregatedModel's status (missing or malformed parts
    -> defaults; a malformed list entry is dropped)."""
    status = status if isinstance(status, Mapping) else {}
    stored = status.get("watchdog")
    stored = stored if isinstance(stored, Mapping) else {}
    # part by part: one malformed part or entry must not cost the others
    next_id = _valid(WatchdogStatus, {"nextId": stored.get("nextId", 1)}) or WatchdogStatus()
    budget = _valid(BudgetStatus, stored.get("budget")) or BudgetStatus()
    raw_cooldowns = stored.get("cooldownUntil")
    cooldowns = {
        str(role): when
        for role, value in (raw_cooldowns.items() if isinstance(raw_cooldowns, Mapping) else ())
        if (when := from_rfc3339(value)) is not None
    }
    flights = _each(InFlightStatus, stored.get("inFlight"))
    in_flight = [f for item in flights if (f := _in_flight(item)) is not None]
    entries = _each(RemediationStatus, status.get("remediations"))
    remediations = [r for item in entries if (r := _remediation(item)) is not None]
    known = max([r.id for r in remediations] + [f.remediation_id for f in in_flight] + [0])
    return WatchdogState(
        window_start=from_rfc3339(budget.window_start),
        used=budget.used,
        exhausted=budget.exhausted,
        cooldown_until=cooldowns,
        in_flight=tuple(f for f in in_flight if f.action != "alert"),
        remediations=tuple(remediations[-MAX_REMEDIATIONS_KEPT:]),
        next_id=max(next_id.next_id, known + 1),
        alerts=tuple(_alert(f) for f in in_flight if f.action == "alert"),
    )


def _time(t: float | None) -> str | None:
    return to_rfc3339(t) if t is not None else None


def _in_flight_status(f: InFlight) -> InFlightStatus:
    values = asdict(f)
    times = {k: _time(values[k]) for k in _IN_FLIGHT_TIMES}
    return InFlightStatus(**{**values, **times, "last_outcome": f.last_outcome.value})


def _remediation_status(r: Remediation) -> RemediationStatus:
    return RemediationStatus(
        **{k: getattr(r, k) for k in _REMEDIATION_SAME},
        time=to_rfc3339(r.time),
        outcome=r.outcome.value,
        phases=[RemediationPhase(phase=p.value, time=to_rfc3339(t)) for p, t in r.phases] or None,
    )


def state_to_status(
    state: WatchdogState,
    *,
    last_scrape: float | None,
    wedged_pods: Sequence[str],
    unobserved_pods: Sequence[str],
    max_remediations: int,
    budget_exhausted: bool | None = None,
    fleet_brake: FleetBrakeStatus | None = None,
) -> dict[str, Any]:
    """The status patch body for the watchdog's parts (`watchdog`, `remediations`)."""
    watchdog = WatchdogStatus(
        last_scrape=_time(last_scrape),
        wedged_pods=sorted(wedged_pods),
        unobserved_pods=sorted(unobserved_pods),
        budget=BudgetStatus(
            window_start=_time(state.window_start),
            used=state.used,
            limit=max_remediations,
            exhausted=state.exhausted,
        ),
        budget_exhausted=budget_exhausted,
        cooldown_until={role: to_rfc3339(t) for role, t in sorted(state.cooldown_until.items())},
        next_id=state.next_id,
        in_flight=[
            _in_flight_status(f) for f in (*state.in_flight, *(a.as_in_flight() for a in state.alerts))
        ],
        fleet_brake=fleet_brake,
    )
    return {
        "watchdog": watchdog.model_dump(by_alias=True),
        "remediations": [_remediation_status(r).model_dump(by_alias=True) for r in state.remediations],
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

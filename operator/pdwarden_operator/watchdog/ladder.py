"""The remediation ladder, as pure functions: verdicts + persisted state + settings + time -> plan.

`plan` decides; it performs nothing. Its new state already records every action it plans
(budget charged, cooldown set, an in-flight entry, a remediation entry with outcome
"pending"): the caller persists that state BEFORE performing the actions (intent first), so
a crash between the two leaves an in-flight entry that the next run resumes, not repeats.
`apply_results` then folds the performed actions' outcomes back in.

Guards, in order: one remediation per pod at a time (in-flight entries); the budget
(`maxRemediations` per `budgetWindowSeconds`); the cooldown after an action (model-wide: a
removed pod's peers of the other role need time to let go of its rooms); never
more than `maxUnavailable` pods of one role down (not Ready, terminating, missing, or under
remediation). `alert` only reports: no budget, no cooldown, one alert per wedge episode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from pdwarden_operator.watchdog.rule import Verdict
from pdwarden_operator.watchdog.settings import WatchdogSettings
from pdwarden_operator.watchdog.state import InFlight, Remediation, WatchdogState
from pdwarden_runtime.contract import RUNTIME_ROLES

# An action the API refused for a reason other than a PodDisruptionBudget is retried this
# many times (once per round), then given up and reported.
MAX_ATTEMPTS = 5

# Outcomes (also the `outcome` label of pdwarden_operator_remediations_total).
PENDING = "pending"
ALERTED = "alerted"
DELETED = "deleted"
EVICTED = "evicted"
REFUSED_BY_PDB = "refused-by-pdb"
ERROR = "error"
FAILED = "failed"
POD_GONE = "pod-gone"
SKIPPED_BUDGET = "skipped-budget"
SKIPPED_COOLDOWN = "skipped-cooldown"
SKIPPED_MAX_UNAVAILABLE = "skipped-max-unavailable"


@dataclass(frozen=True)
class PodView:
    """What the ladder needs to know about a runtime pod."""

    name: str
    uid: str
    role: str
    ready: bool
    terminating: bool


@dataclass(frozen=True)
class Action:
    kind: Literal["alert", "restart", "evict"]
    pod: str
    uid: str
    role: str
    reason: str
    started_at: float
    resumed: bool = False  # continuing an in-flight remediation (after a crash, a refusal, an error)
    previous_outcome: str = ""  # the last attempt's outcome, so a repeated refusal is not re-announced


@dataclass(frozen=True)
class Notice:
    """A decision that performs nothing but must be reported (an Event; pod None: the model only)."""

    pod: str | None
    event_reason: str
    message: str
    action: str
    outcome: str  # "" for model-level notices that are not a remediation outcome


@dataclass(frozen=True)
class Plan:
    state: WatchdogState
    actions: tuple[Action, ...]
    notices: tuple[Notice, ...]


@dataclass(frozen=True)
class ActionResult:
    action: Action
    outcome: str  # DELETED, EVICTED, REFUSED_BY_PDB, ERROR, POD_GONE, ALERTED
    message: str = ""


def _last_remediation(state: WatchdogState, pod: str) -> Remediation | None:
    for entry in reversed(state.remediations):
        if entry.pod == pod:
            return entry
    return None


def _set_outcome(state: WatchdogState, flight: InFlight, outcome: str) -> WatchdogState:
    """Update the remediation entry that `flight` created (same pod, action and start time)."""
    entries = list(state.remediations)
    for i in range(len(entries) - 1, -1, -1):
        e = entries[i]
        if e.pod == flight.pod and e.action == flight.action and e.time == flight.started_at:
            entries[i] = replace(e, outcome=outcome)
            return replace(state, remediations=tuple(entries))
    return state


def plan(
    *,
    verdicts: Mapping[str, Verdict],
    pods: Sequence[PodView],
    state: WatchdogState,
    settings: WatchdogSettings,
    now: float,
    desired: Mapping[str, int],
) -> Plan:
    """Decide this round's actions. `verdicts` is keyed by pod UID; `desired` is replicas per role."""
    now = float(int(now))  # whole seconds: the status stores RFC 3339 to the second
    by_uid = {p.uid: p for p in pods}
    actions: list[Action] = []
    notices: list[Notice] = []

    # 1. Settle or resume what is already in flight.
    kept: list[InFlight] = []
    for flight in state.in_flight:
        pod = by_uid.get(flight.uid)
        gone = pod is None or pod.terminating
        if flight.action == "alert":
            verdict = verdicts.get(flight.uid)
            if gone or (verdict is not None and verdict.cleared):
                continue  # the alert episode is over
            kept.append(flight)
            continue
        if gone:
            if flight.last_outcome in (PENDING, ERROR, REFUSED_BY_PDB):
                state = _set_outcome(state, flight, POD_GONE)
            continue
        if flight.last_outcome == ERROR and flight.attempts >= MAX_ATTEMPTS:
            state = _set_outcome(state, flight, FAILED)
            notices.append(
                Notice(
                    flight.pod,
                    "RemediationFailed",
                    f"gave up {flight.action} of {flight.role} pod {flight.pod} "
                    f"after {flight.attempts} attempts",
                    flight.action,
                    FAILED,
                )
            )
            continue
        kept.append(flight)
        if flight.last_outcome in (PENDING, ERROR, REFUSED_BY_PDB):
            reason = next(
                (
                    r.reason
                    for r in reversed(state.remediations)
                    if r.pod == flight.pod and r.time == flight.started_at
                ),
                "",
            )
            actions.append(
                Action(
                    "evict" if flight.action == "evict" else "restart",
                    flight.pod,
                    flight.uid,
                    flight.role,
                    reason,
                    flight.started_at,
                    resumed=True,
                    previous_outcome=flight.last_outcome,
                )
            )
    state = replace(state, in_flight=tuple(kept))

    # 2. The budget window.
    if state.window_start is not None and now - state.window_start >= settings.budget_window_seconds:
        state = replace(state, window_start=None, used=0, exhausted=False)

    # 3. New wedges.
    for pod in sorted(pods, key=lambda p: p.name):
        verdict = verdicts.get(pod.uid)
        if verdict is None or not verdict.wedged or pod.terminating:
            continue
        if any(f.uid == pod.uid for f in state.in_flight):
            continue
        if settings.action == "alert":
            flight = InFlight(pod.name, pod.uid, pod.role, "alert", now, attempts=1, last_outcome=ALERTED)
            state = replace(state, in_flight=(*state.in_flight, flight)).with_remediation(
                Remediation(pod.name, pod.role, verdict.reason, "alert", now, ALERTED)
            )
            actions.append(Action("alert", pod.name, pod.uid, pod.role, verdict.reason, now))
            continue

        skip: tuple[str, str, str] | None = None
        if state.used >= settings.max_remediations:
            skip = (
                SKIPPED_BUDGET,
                "RemediationBudgetExhausted",
                f"budget spent: {state.used}/{settings.max_remediations} remediations in "
                f"{settings.budget_window_seconds:g}s; not acting on wedged {pod.role} pod {pod.name}",
            )
            if not state.exhausted:
                state = replace(state, exhausted=True)
        elif now < state.cooldown_until.get(pod.role, 0.0):
            wait = state.cooldown_until[pod.role] - now
            skip = (
                SKIPPED_COOLDOWN,
                "RemediationDeferred",
                f"cooldown after the last remediation for {wait:.0f}s more; wedged {pod.role} pod "
                f"{pod.name} waits",
            )
        else:
            down = _unavailable(pod.role, pods, state, desired)
            after = len(down) + (0 if pod.uid in down else 1)
            if after > settings.max_unavailable:
                skip = (
                    SKIPPED_MAX_UNAVAILABLE,
                    "RemediationDeferred",
                    f"{len(down)} {pod.role} pod(s) already unavailable (maxUnavailable="
                    f"{settings.max_unavailable}); wedged pod {pod.name} waits",
                )
        if skip is not None:
            outcome, event_reason, message = skip
            last = _last_remediation(state, pod.name)
            if last is None or last.outcome != outcome:  # report each kind of refusal once per pod
                state = state.with_remediation(
                    Remediation(pod.name, pod.role, verdict.reason, settings.action, now, outcome)
                )
                notices.append(
                    Notice(pod.name, event_reason, f"{message} ({verdict.reason})", settings.action, outcome)
                )
            continue

        window_start = state.window_start if state.window_start is not None else now
        used = state.used + 1
        state = replace(
            state,
            window_start=window_start,
            used=used,
            exhausted=used >= settings.max_remediations,
            cooldown_until={role: now + settings.cooldown for role in RUNTIME_ROLES},
            in_flight=(*state.in_flight, InFlight(pod.name, pod.uid, pod.role, settings.action, now)),
        ).with_remediation(Remediation(pod.name, pod.role, verdict.reason, settings.action, now, PENDING))
        actions.append(Action(settings.action, pod.name, pod.uid, pod.role, verdict.reason, now))
        if state.exhausted:
            notices.append(
                Notice(
                    None,
                    "RemediationBudgetExhausted",
                    f"remediation budget spent: {used}/{settings.max_remediations} in "
                    f"{settings.budget_window_seconds:g}s; further wedges are only reported",
                    settings.action,
                    "",
                )
            )
    return Plan(state=state, actions=tuple(actions), notices=tuple(notices))


def _unavailable(
    role: str, pods: Sequence[PodView], state: WatchdogState, desired: Mapping[str, int]
) -> set[str]:
    """UIDs (or placeholders for missing replicas) of the role's pods that are down or about to be."""
    role_pods = [p for p in pods if p.role == role]
    down = {p.uid for p in role_pods if not p.ready or p.terminating}
    down |= {f.uid for f in state.in_flight if f.role == role and f.action != "alert"}
    live = sum(1 for p in role_pods if not p.terminating)
    missing = max(0, desired.get(role, live) - live)
    down |= {f"missing-{role}-{i}" for i in range(missing)}
    return down


def apply_results(state: WatchdogState, results: Sequence[ActionResult]) -> WatchdogState:
    """Fold performed actions' outcomes into the state (in-flight entries and remediation entries)."""
    for result in results:
        action = result.action
        if action.kind == "alert":
            continue
        flights = list(state.in_flight)
        for i, flight in enumerate(flights):
            if flight.uid != action.uid or flight.action != action.kind:
                continue
            if result.outcome == POD_GONE:
                del flights[i]
            else:
                flights[i] = replace(flight, attempts=flight.attempts + 1, last_outcome=result.outcome)
            state = _set_outcome(replace(state, in_flight=tuple(flights)), flight, result.outcome)
            break
    return state

"""The remediation ladder, as pure functions: verdicts + persisted state + spec + time -> plan.

`plan` decides; it performs nothing. Its new state already records every action it plans
(budget charged, cooldown set, an in-flight entry, a remediation entry with outcome
"pending"): the caller persists that state BEFORE performing the actions (intent first), so
a crash between the two leaves an in-flight entry that the next run resumes, not repeats.
`apply_results` then folds the performed actions' outcomes back in. Outcomes move only
along `outcome.TRANSITIONS`; an in-flight entry finds its remediation entry by its stable id.

Guards, in order: the fleet brake (operator-wide: nothing is performed while it holds);
one remediation per pod at a time (in-flight entries); the budget (`maxRemediations` per
`budgetWindowSeconds`); the cooldown after an action (model-wide: a removed pod's peers of
the other role need time to let go of its rooms); never more than `maxUnavailable` pods of
one role down (not Ready, terminating, missing, or under remediation). `alert` only
reports: no budget, no cooldown, one alert per wedge episode.

`drain` takes several rounds, one phase each (outcome.py): quarantine the pod (a `quarantine`
action: its role label changes, so its ReplicaSet starts a replacement and the router drops
it); each later round, once its healthy requests are done (drain.py) and the role has its
desired Ready pods again, or once `drainSeconds` passed, record DRAINED or DRAIN_DEADLINE
and delete it (a `finish-drain` action), which aborts what remains. A quarantined pod with
no open remediation (found on start-up) is adopted and finished the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from pdwarden_contract import RUNTIME_ROLES
from pdwarden_operator.models import MAX_REMEDIATIONS_KEPT, WatchdogSpec
from pdwarden_operator.watchdog.outcome import RETRYING, Outcome, advance
from pdwarden_operator.watchdog.state import InFlight, Remediation, WatchdogState
from pdwarden_operator.watchdog.verdict import PodView, Verdict

# An action the API refused with an error (not a disruption budget, not throttling) is
# retried this many times (once per round), then given up and reported.
MAX_ATTEMPTS = 5


# A multi-node group's uid in the ladder (gangs.py): this prefix and its leader's (lowest
# rank's) pod uid, so a restarted group is a new entry and an open remediation of the old one settles.
GROUP_UID_PREFIX = "group:"

ActionKind = Literal["alert", "restart", "evict", "quarantine", "finish-drain"]
DRAIN_STEPS: frozenset[str] = frozenset({"quarantine", "finish-drain"})


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    pod: str
    uid: str
    role: str
    reason: str
    started_at: float
    remediation_id: int = 0
    resumed: bool = False  # continuing an in-flight remediation (after a crash, a refusal, an error)
    previous_outcome: Outcome | None = None  # the last attempt's, so a repeated refusal is not re-announced

    @property
    def remediation(self) -> str:
        """spec.watchdog.action this step belongs to (the metric's and the status's `action`)."""
        return "drain" if self.kind in DRAIN_STEPS else self.kind


@dataclass(frozen=True)
class Notice:
    """A decision that performs nothing but must be reported (an Event; pod None: the model only)."""

    pod: str | None
    event_reason: str
    message: str
    action: str
    outcome: Outcome | None  # None for model-level notices that are not a remediation outcome


@dataclass(frozen=True)
class Plan:
    state: WatchdogState
    actions: tuple[Action, ...]
    notices: tuple[Notice, ...]


@dataclass(frozen=True)
class ActionResult:
    action: Action
    outcome: Outcome  # DELETED, EVICTED, REFUSED_BY_PDB, THROTTLED, ERROR, POD_GONE, ALERTED, QUARANTINED
    message: str = ""
    retry_after: float | None = None  # seconds, from a 429's Retry-After


def _last_remediation(state: WatchdogState, pod: str) -> Remediation | None:
    for entry in reversed(state.remediations):
        if entry.pod == pod:
            return entry
    return None


def _set_outcome(
    state: WatchdogState, flight: InFlight, outcome: Outcome, now: float | None = None
) -> WatchdogState:
    """Move the remediation entry `flight` created (found by its id) to `outcome`. An entry no
    longer in the history (status edited by hand) is written again rather than lost. A drain's
    entry also records the phase with its time."""
    when = now if now is not None else flight.started_at
    entry = state.entry(flight.remediation_id)
    if entry is None:
        restored = Remediation(
            flight.remediation_id,
            flight.pod,
            flight.role,
            flight.reason,
            flight.action,
            flight.started_at,
            outcome,
            phases=((outcome, when),) if flight.action == "drain" else (),
        )
        kept = tuple(e for e in state.remediations if e.id != flight.remediation_id)
        return replace(state, remediations=(*kept, restored)[-MAX_REMEDIATIONS_KEPT:])
    moved = replace(entry, outcome=advance(entry.outcome, outcome))
    if entry.action == "drain" and outcome != entry.outcome:
        moved = replace(moved, phases=(*entry.phases, (outcome, when)))
    return replace(state, remediations=tuple(moved if e.id == entry.id else e for e in state.remediations))


def _replacement_ready(role: str, pods: Sequence[PodView], desired: Mapping[str, int]) -> bool:
    """The role serves with its desired number of Ready pods again, not counting quarantined ones."""
    serving = sum(1 for p in pods if p.role == role and p.ready and not p.terminating and not p.quarantined)
    return serving >= desired.get(role, 0)


def _drain_step(
    flight: InFlight,
    pods: Sequence[PodView],
    desired: Mapping[str, int],
    drained: Mapping[str, bool],
    settings: WatchdogSpec,
    now: float,
) -> tuple[ActionKind | None, Outcome | None]:
    """The next step of an open drain: (action to perform or None to wait, phase reached or None)."""
    if flight.quarantined_at is None:
        return "quarantine", None
    if flight.last_outcome in (Outcome.DRAINED, Outcome.DRAIN_DEADLINE):
        return "finish-drain", None  # decided earlier (then a crash, or the deletion failed)
    if now >= flight.quarantined_at + settings.drain_seconds:
        return "finish-drain", Outcome.DRAIN_DEADLINE
    if drained.get(flight.uid, False) and _replacement_ready(flight.role, pods, desired):
        return "finish-drain", Outcome.DRAINED
    return None, None


def _resumed(flight: InFlight, kind: ActionKind) -> Action:
    """The next action of an open remediation (its intent is already recorded)."""
    return Action(
        kind,
        flight.pod,
        flight.uid,
        flight.role,
        flight.reason,
        flight.started_at,
        remediation_id=flight.remediation_id,
        resumed=True,
        previous_outcome=flight.last_outcome,
    )


def _drain_notice(flight: InFlight, phase: Outcome, settings: WatchdogSpec, now: float) -> Notice:
    held = now - (flight.quarantined_at or now)
    if phase == Outcome.DRAINED:
        message = (
            f"quarantined {flight.role} pod {flight.pod} drained after {held:.0f}s: its healthy requests "
            "finished and its replacement is Ready; deleting it (what remains was stuck)"
        )
        return Notice(flight.pod, "WedgedPodDrained", message, "drain", phase)
    message = (
        f"quarantined {flight.role} pod {flight.pod} still held requests or had no Ready replacement "
        f"after drainSeconds={settings.drain_seconds}; deleting it, aborting what remains"
    )
    return Notice(flight.pod, "DrainDeadlinePassed", message, "drain", phase)


def plan(
    *,
    verdicts: Mapping[str, Verdict],
    pods: Sequence[PodView],
    state: WatchdogState,
    settings: WatchdogSpec,
    now: float,
    desired: Mapping[str, int],
    brake: bool = False,
    drained: Mapping[str, bool] | None = None,
) -> Plan:
    """Decide this round's actions. `verdicts` is keyed by pod UID; `desired` is replicas per role;
    `brake`: the fleet brake is engaged, so nothing is performed (open remediations wait);
    `drained`: per quarantined pod's UID, whether its healthy requests are done (drain.py)."""
    drained = drained or {}
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
            if flight.last_outcome in RETRYING:
                state = _set_outcome(state, flight, Outcome.POD_GONE)
            continue
        if flight.last_outcome == Outcome.ERROR and flight.attempts >= MAX_ATTEMPTS:
            state = _set_outcome(state, flight, Outcome.FAILED)
            notices.append(
                Notice(
                    flight.pod,
                    "RemediationFailed",
                    f"gave up {flight.action} of {flight.role} pod {flight.pod} "
                    f"after {flight.attempts} attempts",
                    flight.action,
                    Outcome.FAILED,
                )
            )
            continue
        waiting = flight.not_before is not None and now < flight.not_before
        if flight.action == "drain":
            # deleted and not yet gone: nothing more to do but wait for it
            settled = flight.last_outcome not in RETRYING
            step, phase = (
                (None, None)
                if brake or waiting or settled
                else _drain_step(flight, pods, desired, drained, settings, now)
            )
            if phase is not None:
                state = _set_outcome(state, flight, phase, now)
                flight = replace(flight, last_outcome=phase)
                notices.append(_drain_notice(flight, phase, settings, now))
            kept.append(flight)
            if step is not None:
                actions.append(_resumed(flight, step))
            continue
        kept.append(flight)
        if flight.last_outcome in RETRYING and not brake and not waiting:
            actions.append(_resumed(flight, "evict" if flight.action == "evict" else "restart"))
    state = replace(state, in_flight=tuple(kept))

    # 2. The budget window.
    if state.window_start is not None and now - state.window_start >= settings.budget_window_seconds:
        state = replace(state, window_start=None, used=0, exhausted=False)

    # 3. Quarantined pods no open remediation knows of (an interrupted drain whose status was
    # lost): adopted, so that they are finished, never leaked. Already charged: no budget.
    for pod in sorted(pods, key=lambda p: p.name):
        if not pod.quarantined or pod.terminating or any(f.uid == pod.uid for f in state.in_flight):
            continue
        since = pod.quarantined_at if pod.quarantined_at is not None else now
        reason = "quarantined pod found with no open remediation"
        state = replace(
            state,
            in_flight=(
                *state.in_flight,
                InFlight(
                    pod.name,
                    pod.uid,
                    pod.role,
                    "drain",
                    since,
                    state.next_id,
                    reason,
                    attempts=1,
                    last_outcome=Outcome.QUARANTINED,
                    quarantined_at=since,
                ),
            ),
        ).with_remediation(
            Remediation(
                0,
                pod.name,
                pod.role,
                reason,
                "drain",
                since,
                Outcome.QUARANTINED,
                phases=((Outcome.QUARANTINED, now),),
            )
        )
        notices.append(
            Notice(
                pod.name,
                "QuarantinedPodAdopted",
                f"{pod.role} pod {pod.name} is quarantined with no open remediation: finishing its drain",
                "drain",
                None,
            )
        )

    # 4. New wedges.
    for pod in sorted(pods, key=lambda p: p.name):
        verdict = verdicts.get(pod.uid)
        if verdict is None or not verdict.wedged or pod.terminating or pod.quarantined:
            continue
        if any(f.uid == pod.uid for f in state.in_flight):
            continue
        if settings.action == "alert":
            flight = InFlight(
                pod.name,
                pod.uid,
                pod.role,
                "alert",
                now,
                state.next_id,
                verdict.reason,
                attempts=1,
                last_outcome=Outcome.ALERTED,
            )
            state = replace(state, in_flight=(*state.in_flight, flight)).with_remediation(
                Remediation(0, pod.name, pod.role, verdict.reason, "alert", now, Outcome.ALERTED)
            )
            actions.append(Action("alert", pod.name, pod.uid, pod.role, verdict.reason, now))
            continue

        skip: tuple[Outcome, str, str] | None = None
        if brake:
            skip = (
                Outcome.SKIPPED_BRAKE,
                "FleetBrakeEngaged",
                f"a brake is engaged (too many wedges or remediations in the namespace or the fleet); "
                f"not acting on wedged {pod.role} pod {pod.name}",
            )
        elif state.used >= settings.max_remediations:
            skip = (
                Outcome.SKIPPED_BUDGET,
                "RemediationBudgetExhausted",
                f"budget spent: {state.used}/{settings.max_remediations} remediations in "
                f"{settings.budget_window_seconds:g}s; not acting on wedged {pod.role} pod {pod.name}",
            )
            if not state.exhausted:
                state = replace(state, exhausted=True)
        elif now < state.cooldown_until.get(pod.role, 0.0):
            wait = state.cooldown_until[pod.role] - now
            skip = (
                Outcome.SKIPPED_COOLDOWN,
                "RemediationDeferred",
                f"cooldown after the last remediation for {wait:.0f}s more; wedged {pod.role} pod "
                f"{pod.name} waits",
            )
        else:
            down = _unavailable(pod.role, pods, state, desired)
            after = len(down) + (0 if pod.uid in down else 1)
            if after > settings.max_unavailable:
                skip = (
                    Outcome.SKIPPED_MAX_UNAVAILABLE,
                    "RemediationDeferred",
                    f"{len(down)} {pod.role} pod(s) already unavailable (maxUnavailable="
                    f"{settings.max_unavailable}); wedged pod {pod.name} waits",
                )
        if skip is not None:
            outcome, event_reason, message = skip
            last = _last_remediation(state, pod.name)
            if last is None or last.outcome != outcome:  # report each kind of refusal once per pod
                state = state.with_remediation(
                    Remediation(0, pod.name, pod.role, verdict.reason, settings.action, now, outcome)
                )
                notices.append(
                    Notice(pod.name, event_reason, f"{message} ({verdict.reason})", settings.action, outcome)
                )
            continue

        # A multi-node group is restarted whole (gangs.py): its ranks are not drained one by one,
        # so `drain` acts on a group as `evict` does.
        group = pod.uid.startswith(GROUP_UID_PREFIX)
        action = "evict" if settings.action == "drain" and group else settings.action
        window_start = state.window_start if state.window_start is not None else now
        used = state.used + 1
        state = replace(
            state,
            window_start=window_start,
            used=used,
            exhausted=used >= settings.max_remediations,
            cooldown_until={role: now + settings.cooldown_seconds for role in RUNTIME_ROLES},
            in_flight=(
                *state.in_flight,
                InFlight(pod.name, pod.uid, pod.role, action, now, state.next_id, verdict.reason),
            ),
        ).with_remediation(
            Remediation(
                0,
                pod.name,
                pod.role,
                verdict.reason,
                action,
                now,
                Outcome.PENDING,
                phases=((Outcome.PENDING, now),) if action == "drain" else (),
            )
        )
        actions.append(
            Action(
                "quarantine" if action == "drain" else action,
                pod.name,
                pod.uid,
                pod.role,
                verdict.reason,
                now,
                remediation_id=state.next_id - 1,
            )
        )
        if state.exhausted:
            notices.append(
                Notice(
                    None,
                    "RemediationBudgetExhausted",
                    f"remediation budget spent: {used}/{settings.max_remediations} in "
                    f"{settings.budget_window_seconds:g}s; further wedges are only reported",
                    settings.action,
                    None,
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


def apply_results(
    state: WatchdogState, results: Sequence[ActionResult], now: float | None = None
) -> WatchdogState:
    """Fold performed actions' outcomes into the state (in-flight entries and remediation entries)."""
    for result in results:
        action = result.action
        if action.kind == "alert":
            continue
        flights = list(state.in_flight)
        for i, flight in enumerate(flights):
            if flight.remediation_id != action.remediation_id:
                continue
            if result.outcome == Outcome.POD_GONE:
                del flights[i]
            else:
                # deleted or evicted: kept (and counted unavailable) until the pod is gone
                not_before = None
                if result.retry_after is not None and now is not None:
                    not_before = float(int(now + result.retry_after))
                # throttling is the API server's pacing, not a failed attempt
                attempts = flight.attempts + (0 if result.outcome == Outcome.THROTTLED else 1)
                quarantined_at = flight.quarantined_at
                if result.outcome == Outcome.QUARANTINED and quarantined_at is None:
                    quarantined_at = float(int(now if now is not None else action.started_at))
                flights[i] = replace(
                    flight,
                    attempts=attempts,
                    last_outcome=result.outcome,
                    not_before=not_before,
                    quarantined_at=quarantined_at,
                )
            state = _set_outcome(replace(state, in_flight=tuple(flights)), flight, result.outcome, now)
            break
    return state

"""The remediation ladder, as pure functions: verdicts + persisted state + spec + time -> plan.

`plan` decides; it performs nothing. Its new state already records every action it plans
(budget charged, cooldown set, an in-flight entry, a remediation entry with outcome
"pending"): the caller persists that state BEFORE performing the actions (intent first), so
a crash between the two leaves an in-flight entry that the next run resumes, not repeats.
`apply_results` then folds the performed actions' outcomes back in. Outcomes move only
along `outcome.TRANSITIONS`; an in-flight entry finds its remediation entry by its stable id.

A round is `STEPS` in order: settle or resume what is in flight, roll the budget window,
adopt quarantined pods no remediation knows of, act on new wedges. A new wedge passes
`GUARDS`, in order: the fleet brake (operator-wide: nothing is performed while it holds);
one remediation per pod at a time (in-flight entries); the budget (`maxRemediations` per
`budgetWindowSeconds`); the cooldown after an action (model-wide: a removed pod's peers of
the other role need time to let go of its rooms); never more than `maxUnavailable` pods of
one role down (not Ready, terminating, missing, or under remediation). `alert` only reports:
no budget, no cooldown, one alert per wedge episode, kept as an `Alert` of its own (never an
in-flight remediation, so it takes no slot).

The ladder acts on units (`verdict.Unit`): a pod, or a multi-node group restarted whole. The
first step of a remediation comes from `FIRST_STEP`, by `spec.watchdog.action` and the unit's
kind; an open restart or eviction is resumed by `RESUME_STEP`.

`drain` takes several rounds, one phase each (outcome.py; the next step: `DRAIN_PHASES`):
quarantine the pod (a `quarantine` action: its role label changes, so its ReplicaSet starts
a replacement and the router drops it); each later round, once its healthy requests are done
(drain.py) and the role has its desired Ready pods again, or once `drainSeconds` passed,
record DRAINED or DRAIN_DEADLINE and delete it (a `finish-drain` action), which aborts what
remains. A quarantined pod with no open remediation (found on start-up) is adopted and
finished the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from pdwarden_contract import RUNTIME_ROLES
from pdwarden_operator.resource.status_parts import MAX_REMEDIATIONS_KEPT
from pdwarden_operator.resource.watchdog import WatchdogAction, WatchdogSpec
from pdwarden_operator.watchdog.outcome import RETRYING, Outcome, advance
from pdwarden_operator.watchdog.state import Alert, InFlight, Remediation, WatchdogState
from pdwarden_operator.watchdog.verdict import PodView, Unit, UnitKind, Verdict

# An action the API refused with an error (not a disruption budget, not throttling) is
# retried this many times (once per round), then given up and reported.
MAX_ATTEMPTS = 5


ActionKind = Literal["alert", "restart", "evict", "quarantine", "finish-drain"]
DRAIN_STEPS: frozenset[str] = frozenset({"quarantine", "finish-drain"})

# (spec.watchdog.action, the unit's kind) -> (the remediation recorded, its first step). A
# multi-node group is restarted whole, never drained rank by rank: `drain` acts on it as `evict`.
FIRST_STEP: Mapping[tuple[WatchdogAction, UnitKind], tuple[WatchdogAction, ActionKind]] = {
    ("restart", "pod"): ("restart", "restart"),
    ("evict", "pod"): ("evict", "evict"),
    ("drain", "pod"): ("drain", "quarantine"),
    ("restart", "group"): ("restart", "restart"),
    ("evict", "group"): ("evict", "evict"),
    ("drain", "group"): ("evict", "evict"),
}
# An open restart or eviction the API refused or that errored: the step tried again (a drain's
# next step comes from DRAIN_PHASES).
RESUME_STEP: Mapping[str, ActionKind] = {"restart": "restart", "evict": "evict"}


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
    unit: Unit | None = None  # what is acted on; None: the pod `pod`/`uid`

    @property
    def target(self) -> Unit:
        """The unit this action acts on: the pod, or every rank of a group."""
        return self.unit if self.unit is not None else Unit("pod", self.pod, self.uid)

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
    kind: UnitKind = "pod"  # a group's notice goes on the model only (a group is no Pod)


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


@dataclass(frozen=True)
class _Round:
    """What one round sees; `pods` sorted by name, so that decisions come in a stable order."""

    verdicts: Mapping[str, Verdict]
    pods: Sequence[PodView]
    by_uid: Mapping[str, PodView]
    settings: WatchdogSpec
    now: float
    desired: Mapping[str, int]
    brake: bool
    drained: Mapping[str, bool]


@dataclass
class _Draft:
    """The plan being built: the state so far (intent recorded as it is decided), and what the
    round will perform and report."""

    state: WatchdogState
    actions: list[Action] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)

    def set_outcome(self, flight: InFlight, outcome: Outcome, now: float | None = None) -> None:
        self.state = _set_outcome(self.state, flight, outcome, now)

    def is_open(self, uid: str) -> bool:
        """An open remediation or alert episode: one at a time per unit."""
        return any(f.uid == uid for f in self.state.in_flight) or any(a.uid == uid for a in self.state.alerts)


# --- An open drain's phases: the first row whose condition holds gives the next step -----


def _not_quarantined_yet(flight: InFlight, rnd: _Round) -> bool:
    return flight.quarantined_at is None


def _decided_earlier(flight: InFlight, rnd: _Round) -> bool:
    # a phase recorded, then a crash or a failed deletion: delete again
    return flight.last_outcome in (Outcome.DRAINED, Outcome.DRAIN_DEADLINE)


def _drain_deadline_passed(flight: InFlight, rnd: _Round) -> bool:
    since = flight.quarantined_at
    return since is not None and rnd.now >= since + rnd.settings.drain_seconds


def _drained_and_replaced(flight: InFlight, rnd: _Round) -> bool:
    return rnd.drained.get(flight.uid, False) and _replacement_ready(flight.role, rnd.pods, rnd.desired)


# (condition, action to perform, phase reached or None); no row holds: wait for the next round.
DRAIN_PHASES: tuple[tuple[Callable[[InFlight, _Round], bool], ActionKind, Outcome | None], ...] = (
    (_not_quarantined_yet, "quarantine", None),
    (_decided_earlier, "finish-drain", None),
    (_drain_deadline_passed, "finish-drain", Outcome.DRAIN_DEADLINE),
    (_drained_and_replaced, "finish-drain", Outcome.DRAINED),
)


def _drain_step(flight: InFlight, rnd: _Round) -> tuple[ActionKind | None, Outcome | None]:
    """The next step of an open drain: (action to perform or None to wait, phase reached or None)."""
    for holds, action, phase in DRAIN_PHASES:
        if holds(flight, rnd):
            return action, phase
    return None, None


def _resumed(flight: InFlight, kind: ActionKind, unit: Unit) -> Action:
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
        unit=unit,
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


# --- The guards a new wedge passes before it is acted on, in order -----------------------


@dataclass(frozen=True)
class Skip:
    """A guard's refusal: the outcome recorded, the Event's reason and its message."""

    outcome: Outcome
    event_reason: str
    message: str


def _brake_engaged(rnd: _Round, state: WatchdogState, pod: PodView) -> Skip | None:
    if not rnd.brake:
        return None
    return Skip(
        Outcome.SKIPPED_BRAKE,
        "FleetBrakeEngaged",
        f"a brake is engaged (too many wedges or remediations in the namespace or the fleet); "
        f"not acting on wedged {pod.role} pod {pod.name}",
    )


def _budget_spent(rnd: _Round, state: WatchdogState, pod: PodView) -> Skip | None:
    settings = rnd.settings
    if state.used < settings.max_remediations:
        return None
    return Skip(
        Outcome.SKIPPED_BUDGET,
        "RemediationBudgetExhausted",
        f"budget spent: {state.used}/{settings.max_remediations} remediations in "
        f"{settings.budget_window_seconds:g}s; not acting on wedged {pod.role} pod {pod.name}",
    )


def _cooling_down(rnd: _Round, state: WatchdogState, pod: PodView) -> Skip | None:
    until = state.cooldown_until.get(pod.role, 0.0)
    if rnd.now >= until:
        return None
    return Skip(
        Outcome.SKIPPED_COOLDOWN,
        "RemediationDeferred",
        f"cooldown after the last remediation for {until - rnd.now:.0f}s more; wedged {pod.role} pod "
        f"{pod.name} waits",
    )


def _too_many_unavailable(rnd: _Round, state: WatchdogState, pod: PodView) -> Skip | None:
    down = _unavailable(pod.role, rnd.pods, state, rnd.desired)
    after = len(down) + (0 if pod.uid in down else 1)
    if after <= rnd.settings.max_unavailable:
        return None
    return Skip(
        Outcome.SKIPPED_MAX_UNAVAILABLE,
        "RemediationDeferred",
        f"{len(down)} {pod.role} pod(s) already unavailable (maxUnavailable="
        f"{rnd.settings.max_unavailable}); wedged pod {pod.name} waits",
    )


GUARDS: tuple[Callable[[_Round, WatchdogState, PodView], Skip | None], ...] = (
    _brake_engaged,
    _budget_spent,
    _cooling_down,
    _too_many_unavailable,
)


# --- The round's steps ----------------------------------------------------------------------


def _settle_alerts(rnd: _Round, draft: _Draft) -> None:
    """An alert episode ends once its pod is gone or its evidence shows health."""
    kept = []
    for alert in draft.state.alerts:
        pod, verdict = rnd.by_uid.get(alert.uid), rnd.verdicts.get(alert.uid)
        over = pod is None or pod.terminating or (verdict is not None and verdict.cleared)
        if not over:
            kept.append(alert)
    draft.state = replace(draft.state, alerts=tuple(kept))


def _settle_in_flight(rnd: _Round, draft: _Draft) -> None:
    """Settle or resume what is already in flight."""
    kept: list[InFlight] = []
    for flight in draft.state.in_flight:  # (the tuple as the round found it)
        settled = _settle(rnd, draft, flight)
        if settled is not None:
            kept.append(settled)
    draft.state = replace(draft.state, in_flight=tuple(kept))


def _settle(rnd: _Round, draft: _Draft, flight: InFlight) -> InFlight | None:
    """One open remediation: None once it is over, else the entry kept (and its next action
    planned, unless the brake holds it or a Retry-After has not passed)."""
    pod = rnd.by_uid.get(flight.uid)
    if pod is None or pod.terminating:
        if flight.last_outcome in RETRYING:
            draft.set_outcome(flight, Outcome.POD_GONE)
        return None
    if flight.last_outcome == Outcome.ERROR and flight.attempts >= MAX_ATTEMPTS:
        draft.set_outcome(flight, Outcome.FAILED)
        draft.notices.append(
            Notice(
                flight.pod,
                "RemediationFailed",
                f"gave up {flight.action} of {flight.role} pod {flight.pod} after {flight.attempts} attempts",
                flight.action,
                Outcome.FAILED,
                pod.unit.kind,
            )
        )
        return None
    held = rnd.brake or (flight.not_before is not None and rnd.now < flight.not_before)
    # a drain deleted and not yet gone, or a restart or eviction done: wait for the pod to go
    if held or flight.last_outcome not in RETRYING:
        return flight
    if flight.action in RESUME_STEP:
        draft.actions.append(_resumed(flight, RESUME_STEP[flight.action], pod.unit))
        return flight
    step, phase = _drain_step(flight, rnd)
    if phase is not None:
        draft.set_outcome(flight, phase, rnd.now)
        flight = replace(flight, last_outcome=phase)
        draft.notices.append(_drain_notice(flight, phase, rnd.settings, rnd.now))
    if step is not None:
        draft.actions.append(_resumed(flight, step, pod.unit))
    return flight


def _roll_budget_window(rnd: _Round, draft: _Draft) -> None:
    """A new budget window once the last one has passed."""
    state = draft.state
    if state.window_start is not None and rnd.now - state.window_start >= rnd.settings.budget_window_seconds:
        draft.state = replace(state, window_start=None, used=0, exhausted=False)


def _adopt_quarantined(rnd: _Round, draft: _Draft) -> None:
    """Quarantined pods no open remediation knows of (an interrupted drain whose status was
    lost): adopted, so that they are finished, never leaked. Already charged: no budget."""
    for pod in rnd.pods:
        if not pod.quarantined or pod.terminating or draft.is_open(pod.uid):
            continue
        since = pod.quarantined_at if pod.quarantined_at is not None else rnd.now
        reason = "quarantined pod found with no open remediation"
        flight = InFlight(
            pod.name,
            pod.uid,
            pod.role,
            "drain",
            since,
            draft.state.next_id,
            reason,
            attempts=1,
            last_outcome=Outcome.QUARANTINED,
            quarantined_at=since,
        )
        entry = Remediation(
            0,
            pod.name,
            pod.role,
            reason,
            "drain",
            since,
            Outcome.QUARANTINED,
            phases=((Outcome.QUARANTINED, rnd.now),),
        )
        draft.state = replace(draft.state, in_flight=(*draft.state.in_flight, flight)).with_remediation(entry)
        draft.notices.append(
            Notice(
                pod.name,
                "QuarantinedPodAdopted",
                f"{pod.role} pod {pod.name} is quarantined with no open remediation: finishing its drain",
                "drain",
                None,
            )
        )


def _act_on_new_wedges(rnd: _Round, draft: _Draft) -> None:
    """Each wedged pod with no open remediation: alerted, refused by the first guard that
    holds, or acted on (budget charged, cooldown set, intent recorded)."""
    for pod in rnd.pods:
        verdict = rnd.verdicts.get(pod.uid)
        if verdict is None or not verdict.wedged or pod.terminating or pod.quarantined:
            continue
        if draft.is_open(pod.uid):
            continue
        if rnd.settings.action == "alert":
            _alert(rnd, draft, pod, verdict)
            continue
        skip = next((found for guard in GUARDS if (found := guard(rnd, draft.state, pod)) is not None), None)
        if skip is not None:
            _refuse(rnd, draft, pod, verdict, skip)
        else:
            _start(rnd, draft, pod, verdict)


def _alert(rnd: _Round, draft: _Draft, pod: PodView, verdict: Verdict) -> None:
    """`alert` only reports: no budget, no cooldown, one alert per wedge episode (an `Alert`
    record until the episode ends); the report is an action that touches no pod."""
    now, entry_id = rnd.now, draft.state.next_id
    alert = Alert(pod.name, pod.uid, pod.role, now, entry_id, verdict.reason)
    draft.state = replace(draft.state, alerts=(*draft.state.alerts, alert)).with_remediation(
        Remediation(0, pod.name, pod.role, verdict.reason, "alert", now, Outcome.ALERTED)
    )
    draft.actions.append(
        Action("alert", pod.name, pod.uid, pod.role, verdict.reason, now, entry_id, unit=pod.unit)
    )


def _refuse(rnd: _Round, draft: _Draft, pod: PodView, verdict: Verdict, skip: Skip) -> None:
    """Record a guard's refusal, each kind once per pod (not every round)."""
    if skip.outcome is Outcome.SKIPPED_BUDGET and not draft.state.exhausted:
        draft.state = replace(draft.state, exhausted=True)
    last = _last_remediation(draft.state, pod.name)
    if last is not None and last.outcome == skip.outcome:
        return
    action = rnd.settings.action
    draft.state = draft.state.with_remediation(
        Remediation(0, pod.name, pod.role, verdict.reason, action, rnd.now, skip.outcome)
    )
    draft.notices.append(
        Notice(
            pod.name,
            skip.event_reason,
            f"{skip.message} ({verdict.reason})",
            action,
            skip.outcome,
            pod.unit.kind,
        )
    )


def _start(rnd: _Round, draft: _Draft, pod: PodView, verdict: Verdict) -> None:
    """Charge the budget, set the cooldown and record the intent, then plan the first action."""
    settings, now, state = rnd.settings, rnd.now, draft.state
    action, first = FIRST_STEP[(settings.action, pod.unit.kind)]
    used = state.used + 1
    state = replace(
        state,
        window_start=state.window_start if state.window_start is not None else now,
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
    draft.state = state
    draft.actions.append(
        Action(
            first,
            pod.name,
            pod.uid,
            pod.role,
            verdict.reason,
            now,
            remediation_id=state.next_id - 1,
            unit=pod.unit,
        )
    )
    if state.exhausted:
        draft.notices.append(
            Notice(
                None,
                "RemediationBudgetExhausted",
                f"remediation budget spent: {used}/{settings.max_remediations} in "
                f"{settings.budget_window_seconds:g}s; further wedges are only reported",
                settings.action,
                None,
            )
        )


# The round's steps, in order: each reads the round and extends the draft.
STEPS: tuple[Callable[[_Round, _Draft], None], ...] = (
    _settle_alerts,
    _settle_in_flight,
    _roll_budget_window,
    _adopt_quarantined,
    _act_on_new_wedges,
)


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
    rnd = _Round(
        verdicts=verdicts,
        pods=sorted(pods, key=lambda p: p.name),
        by_uid={p.uid: p for p in pods},
        settings=settings,
        now=float(int(now)),  # whole seconds: the status stores RFC 3339 to the second
        desired=desired,
        brake=brake,
        drained=drained or {},
    )
    draft = _Draft(state)
    for step in STEPS:
        step(rnd, draft)
    return Plan(state=draft.state, actions=tuple(draft.actions), notices=tuple(draft.notices))


def _unavailable(
    role: str, pods: Sequence[PodView], state: WatchdogState, desired: Mapping[str, int]
) -> set[str]:
    """UIDs (or placeholders for missing replicas) of the role's pods that are down or about to be."""
    role_pods = [p for p in pods if p.role == role]
    down = {p.uid for p in role_pods if not p.ready or p.terminating}
    down |= {f.uid for f in state.in_flight if f.role == role}
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

"""Remediation outcomes and their allowed transitions: the one table of the ladder's states.

Every `status.remediations` entry has an outcome; an entry is created in one of `OPENING`
and moves only along `TRANSITIONS` (a repeated refusal, throttle or error is a move to
itself). `advance` is the only way to change an outcome and raises `OutcomeTransitionError`
for a move the table does not allow. The values are also the `outcome` label of
pdwarden_operator_remediations_total and what `status.remediations[].outcome` shows.
"""

from __future__ import annotations

import enum
from typing import Final


class Outcome(enum.StrEnum):
    PENDING = "pending"  # intent persisted, the action not yet performed
    ALERTED = "alerted"
    DELETED = "deleted"
    EVICTED = "evicted"
    REFUSED_BY_PDB = "refused-by-pdb"  # the Eviction API's 429 naming a disruption budget
    THROTTLED = "throttled"  # any other 429: the API server asks to come back later
    ERROR = "error"
    FAILED = "failed"  # given up after repeated errors
    POD_GONE = "pod-gone"
    SKIPPED_BUDGET = "skipped-budget"
    SKIPPED_COOLDOWN = "skipped-cooldown"
    SKIPPED_MAX_UNAVAILABLE = "skipped-max-unavailable"
    SKIPPED_BRAKE = "skipped-brake"  # the fleet brake is engaged
    # action drain's phases, in order: out of the selector, then drained or out of time, then deleted
    QUARANTINED = "quarantined"  # role label changed: its ReplicaSet starts a replacement
    DRAINED = "drained"  # its healthy requests finished and the replacement is Ready
    DRAIN_DEADLINE = "drain-deadline"  # drainSeconds passed: what remains is aborted


_O = Outcome
# What an action on a pod may come to, from any state where it is still to be (re)tried.
_PERFORMED: Final = frozenset(
    {_O.DELETED, _O.EVICTED, _O.REFUSED_BY_PDB, _O.THROTTLED, _O.ERROR, _O.POD_GONE}
)

# The drain's phases after the quarantine: each leads to the deletion.
_DRAIN_ENDS: Final = frozenset({_O.DRAINED, _O.DRAIN_DEADLINE})
_DELETION: Final = frozenset({_O.DELETED, _O.POD_GONE, _O.ERROR})

# The outcomes a new entry may start with (QUARANTINED: a quarantined pod found with no open
# remediation, adopted so that its drain is finished, never leaked).
OPENING: Final = frozenset(
    {
        _O.PENDING,
        _O.QUARANTINED,
        _O.ALERTED,
        _O.SKIPPED_BUDGET,
        _O.SKIPPED_COOLDOWN,
        _O.SKIPPED_MAX_UNAVAILABLE,
        _O.SKIPPED_BRAKE,
    }
)

TRANSITIONS: Final[dict[Outcome, frozenset[Outcome]]] = {
    _O.PENDING: _PERFORMED | {_O.QUARANTINED},
    _O.REFUSED_BY_PDB: _PERFORMED,
    _O.THROTTLED: _PERFORMED,
    # an error is retried from the phase it interrupted
    _O.ERROR: _PERFORMED | {_O.FAILED, _O.QUARANTINED} | _DRAIN_ENDS,
    _O.QUARANTINED: _DRAIN_ENDS | {_O.POD_GONE, _O.ERROR},
    _O.DRAINED: _DELETION,
    _O.DRAIN_DEADLINE: _DELETION,
    _O.SKIPPED_BRAKE: frozenset(),
    _O.ALERTED: frozenset(),
    _O.DELETED: frozenset(),
    _O.EVICTED: frozenset(),
    _O.FAILED: frozenset(),
    _O.POD_GONE: frozenset(),
    _O.SKIPPED_BUDGET: frozenset(),
    _O.SKIPPED_COOLDOWN: frozenset(),
    _O.SKIPPED_MAX_UNAVAILABLE: frozenset(),
}

# Outcomes whose remediation is still open: the ladder resumes it next round.
RETRYING: Final = frozenset(o for o, targets in TRANSITIONS.items() if targets)
# Outcomes of a remediation that spent budget (everything decided to act, not a skip or an alert).
CHARGED: Final = frozenset(
    {_O.PENDING, _O.DELETED, _O.EVICTED, _O.REFUSED_BY_PDB, _O.THROTTLED, _O.ERROR, _O.FAILED, _O.POD_GONE}
    | {_O.QUARANTINED}
    | _DRAIN_ENDS
)


class OutcomeTransitionError(ValueError):
    """A move the table does not allow; the message names both outcomes."""

    def __init__(self, origin: Outcome, target: Outcome) -> None:
        super().__init__(f"remediation outcome {origin.value!r} cannot move to {target.value!r}")
        self.origin, self.target = origin, target


def advance(origin: Outcome, target: Outcome) -> Outcome:
    """`target` when the table allows origin -> target; else OutcomeTransitionError."""
    if target not in TRANSITIONS[origin]:
        raise OutcomeTransitionError(origin, target)
    return target


def parse(value: object, default: Outcome = _O.PENDING) -> Outcome:
    """An outcome read back from status; unknown values fall back to `default`."""
    try:
        return Outcome(str(value))
    except ValueError:
        return default


assert set(TRANSITIONS) == set(Outcome), "every outcome has a row"
assert set(Outcome) >= OPENING

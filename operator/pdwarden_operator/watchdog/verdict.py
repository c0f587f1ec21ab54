"""What the watchdog knows of a runtime pod and what it judged of it: the types the wedge rule
(rule.py), pair-aware blame (blame.py), groups (group_health.py), the ladder (ladder.py) and the
autoscaler (scaler.py) share. They live here, below all of those, so none imports another for
a type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

UnitKind = Literal["pod", "group"]
# How a group's key is told from a pod's uid where both share one namespace of keys (verdicts,
# views, `status.watchdog.inFlight[].uid`): only `Unit.key` and `Unit.of_key` write or read it.
_GROUP_KEY_MARK = "group:"


class VerdictState(StrEnum):
    OK = "ok"
    WEDGED = "wedged"
    UNOBSERVED = "unobserved"  # the latest scrape failed, or none yet: never acted on


@dataclass(frozen=True)
class Unit:
    """What the ladder remediates: one pod, or a multi-node group acted on whole (group_health.py)."""

    kind: UnitKind
    name: str  # the pod's name; a group's name
    uid: str  # the pod's uid; a group's leader's (rank 0) pod uid, so a restarted group is a new unit
    ranks: tuple[tuple[str, str], ...] = ()  # a group's pods (name, uid), leader first

    @property
    def key(self) -> str:
        """The unit's key in verdicts, views and the status's in-flight entries."""
        return self.uid if self.kind == "pod" else _GROUP_KEY_MARK + self.uid

    @staticmethod
    def kind_of_key(key: str) -> UnitKind:
        """The kind of unit a stored key names (a status written by an earlier round)."""
        return "group" if key.startswith(_GROUP_KEY_MARK) else "pod"


@dataclass(frozen=True)
class PodView:
    """What the ladder needs to know about a runtime pod."""

    name: str
    uid: str
    role: str
    ready: bool
    terminating: bool
    ip: str = ""  # status.podIP: how the runtimes' per-peer figures name this pod
    quarantined: bool = False  # out of its Deployment's selector (action drain); `role` is the one it served
    quarantined_at: float | None = None  # from the pod's annotation
    group: Unit | None = None  # set on a group's folded view (group_health.fold): its ranks act together

    @property
    def unit(self) -> Unit:
        """The unit the ladder acts on for this entry."""
        return self.group if self.group is not None else Unit("pod", self.name, self.uid)


@dataclass(frozen=True)
class Pointer:
    """One pod's evidence against a peer over its pointing span."""

    pod: str
    role: str
    bad: float  # rooms with the peer that failed or hit a deadline over the span
    inflight: float  # rooms with the peer in flight at the latest scrape
    seconds: float  # how long it has pointed at the peer
    held: float = 0.0  # decode pages held for the peer at the latest scrape


@dataclass(frozen=True)
class Blame:
    """The decision: which pod is remediated, which side it is, who pointed at it, the figures."""

    pod: str
    uid: str
    role: str
    ip: str
    pointers: tuple[Pointer, ...]
    reporters: int  # pods that reported figures for this peer

    def reason(self) -> str:
        sides = ", ".join(
            f"{p.pod} (failed/deadline {p.bad:g}, in flight {p.inflight:g}"
            + (f", pages held {p.held:g}" if p.held else "")
            + f", {p.seconds:.0f}s)"
            for p in self.pointers
        )
        pointing_role = self.pointers[0].role if self.pointers else "peer"
        return (
            f"pair-aware blame: {self.role} pod {self.pod} ({self.ip}) stalls "
            f"{len(self.pointers)}/{self.reporters} {pointing_role} pods that move KV with it, "
            f"none of whose rooms with it succeeded: {sides}"
        )

    def figures(self) -> dict[str, float]:
        return {
            "pointingPods": float(len(self.pointers)),
            "reportingPods": float(self.reporters),
            "peerFailedOrDeadline": sum(p.bad for p in self.pointers),
            "peerInflight": sum(p.inflight for p in self.pointers),
            "peerPagesHeld": sum(p.held for p in self.pointers),
        }


@dataclass(frozen=True)
class Verdict:
    state: VerdictState
    reason: str
    figures: dict[str, float] = field(default_factory=dict)
    # True when the evidence shows health (idle, or a transfer finished while observed), which
    # ends an alert episode; False for "busy, not yet long enough" or too little history.
    cleared: bool = False
    # Stalled for half of stuckAfterSeconds (no progress, or a room held in Transferring): on
    # its way to wedged. The fleet brake counts these with the wedged ones (brake.py).
    stalling: bool = False
    # Set when pair-aware blame (blame.py) made this pod wedged on its peers' evidence.
    blame: Blame | None = None

    @property
    def wedged(self) -> bool:
        return self.state is VerdictState.WEDGED

    @property
    def troubled(self) -> bool:
        return self.wedged or self.stalling

"""Pair-aware blame (docs: wedges.md "Pair-aware blame"), as a pure function.

In a PD pair a stalled peer makes the pods sending to (or reading from) it look stuck:
restarting them spends the budget and fixes nothing. This rule reads the per-peer figures
(``pdwarden_kv_peer_inflight``, ``pdwarden_kv_peer_transfers_total``; a peer is named by
its pod IP) and moves the blame to the peer when the evidence of several pods agrees.

A pod **points at** peer X when, going back from its latest scrape over the intervals
between consecutive scrapes, no room of it with X succeeded for at least ``stuck_after``
seconds (an interval without traffic to X is neutral; a success ends the case), and at
least two of those intervals, one of them among the latest two, hold evidence: a room with
X that failed or ended at a deadline, rooms with X in flight, or (decode) pages held for X,
which X keeps hostage by neither draining nor being gone. A pod that points at every
one of its two or more peers is suspect itself (its own transfer side, not theirs): its
pointing counts for nothing.

X is **blamed** when at least ``MIN_POINTERS`` (2) pods point at it and they are a strict
majority of the pods that reported figures for X, and X's IP is the IP of exactly one live
runtime pod of the other role. X then gets a wedged verdict naming the pods that pointed at
it and their figures; a pointing pod that was itself judged wedged is cleared of it (it is
waiting on X). A pod whose own queue is stuck with no common peer keeps its verdict. Pods
without trustworthy per-peer figures (absent, garbage, a counter that went down) give no
evidence: nothing changes for them, so such metrics can never trigger an action. Only peers
that are pods of the model (of the other role, by IP) count at all, as pointers, reporters or
"every one of its peers": a peer a pod names that the model does not have is not counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, replace
from typing import Final

from pdwarden_contract import OUTCOME_DEADLINE, OUTCOME_FAILED, OUTCOME_SUCCESS, PEER_OTHER, RUNTIME_ROLES
from pdwarden_operator.watchdog.history import PodScrape
from pdwarden_operator.watchdog.parse import PeerFigures
from pdwarden_operator.watchdog.verdict import Blame, PodView, Pointer, Verdict, VerdictState

MIN_POINTERS: Final = 2
# Intervals with evidence against a peer that one pod needs (one could be a blip).
MIN_EVIDENCE: Final = 2
_BAD_OUTCOMES: Final = (OUTCOME_FAILED, OUTCOME_DEADLINE)


@dataclass(frozen=True)
class Attribution:
    verdicts: dict[str, Verdict]  # by pod UID, the blame applied
    blames: tuple[Blame, ...]


def _peer_run(observations: Sequence[PodScrape]) -> list[tuple[float, PeerFigures]]:
    """The latest consecutive samples that carry per-peer figures; oldest first."""
    run: list[tuple[float, PeerFigures]] = []
    for obs in reversed(observations):
        if obs.sample is None or obs.sample.peers is None:
            break
        run.append((obs.at, obs.sample.peers))
    run.reverse()
    return run


def _count(figures: PeerFigures, peer: str, outcomes: Sequence[str]) -> float:
    by_outcome = figures.outcomes.get(peer, {})
    return sum(by_outcome.get(o, 0.0) for o in outcomes)


@dataclass(frozen=True)
class _Step:
    """One interval between consecutive scrapes, for one peer."""

    good: float  # rooms with the peer that succeeded
    bad: float  # rooms with the peer that failed or hit a deadline
    inflight: float  # rooms with the peer in flight at the interval's end
    held: float = 0.0  # decode pages held for the peer at the interval's end

    @property
    def evidence(self) -> bool:
        return self.bad > 0 or self.inflight > 0 or self.held > 0


def _step(before: PeerFigures, after: PeerFigures, peer: str) -> _Step | None:
    """None: no usable evidence (a counter went down: the runtime restarted or forgot the peer)."""
    good = _count(after, peer, (OUTCOME_SUCCESS,)) - _count(before, peer, (OUTCOME_SUCCESS,))
    bad = _count(after, peer, _BAD_OUTCOMES) - _count(before, peer, _BAD_OUTCOMES)
    if good < 0 or bad < 0:
        return None
    return _Step(good, bad, after.inflight.get(peer, 0.0), after.held.get(peer, 0.0))


def _pointer(
    pod: PodView, run: list[tuple[float, PeerFigures]], peer: str, stuck_after: float
) -> Pointer | None:
    """The pod's case against the peer: back from now, intervals in which no room with the
    peer succeeded (an interval without traffic to it is neutral), spanning stuck_after, with
    evidence (a failed room, or rooms in flight) in at least two of them and in one of the
    latest two."""
    now = run[-1][0]
    bad_total, evidence, recent, start = 0.0, 0, False, len(run) - 1
    while start > 0:
        step = _step(run[start - 1][1], run[start][1], peer)
        if step is None or step.good > 0:
            break
        if step.evidence:
            evidence += 1
            recent = recent or start >= len(run) - 2
        bad_total += step.bad
        start -= 1
    span = now - run[start][0]
    if evidence < MIN_EVIDENCE or not recent or span < stuck_after:
        return None
    latest = run[-1][1]
    inflight, held = latest.inflight.get(peer, 0.0), latest.held.get(peer, 0.0)
    return Pointer(pod.name, pod.role, bad_total, inflight, span, held)


def _pointers_of(
    pod: PodView, run: list[tuple[float, PeerFigures]], stuck_after: float, known: Set[str]
) -> tuple[dict[str, Pointer], set[str]]:
    """The peers this pod points at, and every peer it reported, among the `known` ones (the
    IPs of the model's pods of the other role)."""
    if len(run) < 2:
        return {}, set()
    latest = run[-1][1]
    reported = {
        p for p in (*latest.inflight, *latest.outcomes, *latest.held) if p != PEER_OTHER and p in known
    }
    found = {peer: ptr for peer in reported if (ptr := _pointer(pod, run, peer, stuck_after)) is not None}
    if len(reported) >= 2 and set(found) == reported:
        return {}, reported  # points at everyone: the pod's own side is the suspect
    return found, reported


def attribute(
    *,
    pods: Sequence[PodView],
    observations: Mapping[str, Sequence[PodScrape]],
    verdicts: Mapping[str, Verdict],
    stuck_after: float,
) -> Attribution:
    """Apply pair-aware blame to this round's verdicts (keyed by pod UID)."""
    live = [p for p in pods if not p.terminating]
    known: dict[str, set[str]] = {}  # role -> the IPs of the model's pods of that role
    for pod in pods:
        if pod.ip:
            known.setdefault(pod.role, set()).add(pod.ip)
    by_ip: dict[tuple[str, str], list[PodView]] = {}
    for pod in live:
        if pod.ip:
            by_ip.setdefault((pod.role, pod.ip), []).append(pod)
    pointed: dict[tuple[str, str], list[Pointer]] = {}
    reporters: dict[tuple[str, str], int] = {}
    pointer_uids: dict[tuple[str, str], list[str]] = {}
    for pod in live:
        run = _peer_run(observations.get(pod.uid, ()))
        other = next((r for r in RUNTIME_ROLES if r != pod.role), "")
        found, reported = _pointers_of(pod, run, stuck_after, known.get(other, set()))
        for peer in reported:
            reporters[(other, peer)] = reporters.get((other, peer), 0) + 1
        for peer, pointer in found.items():
            pointed.setdefault((other, peer), []).append(pointer)
            pointer_uids.setdefault((other, peer), []).append(pod.uid)

    out = dict(verdicts)
    blames: list[Blame] = []
    for key, pointers in sorted(pointed.items()):
        role, ip = key
        targets = by_ip.get(key, [])
        if len(pointers) < MIN_POINTERS or 2 * len(pointers) <= reporters.get(key, 0) or len(targets) != 1:
            continue
        target = targets[0]
        blame = Blame(
            target.name,
            target.uid,
            role,
            ip,
            tuple(sorted(pointers, key=lambda p: p.pod)),
            reporters.get(key, 0),
        )
        blames.append(blame)
        own = out.get(target.uid)
        reason = blame.reason() if own is None or not own.wedged else f"{own.reason}; {blame.reason()}"
        base = own.figures if own is not None else {}
        out[target.uid] = Verdict(
            VerdictState.WEDGED, reason, base | blame.figures(), stalling=True, blame=blame
        )
        for uid in pointer_uids[key]:
            mine = out.get(uid)
            if mine is not None and mine.wedged and mine.blame is None:
                out[uid] = replace(
                    mine,
                    state=VerdictState.OK,
                    reason=f"waiting on {role} pod {target.name} (blamed): {mine.reason}",
                    cleared=False,
                    stalling=True,
                )
    return Attribution(out, tuple(blames))

"""The wedge rule (docs: wedges.md "Wedge: definition and remediation"), as a pure function.

A pod is wedged when, for at least `stuckAfterSeconds` and two consecutive scrapes, it has
rooms in flight that it must move itself (waiting for or moving KV: rooms still waiting for
bootstrap wait on their peer) and its finished-transfer counter did not move; or when its oldest room in
the Transferring state has been in that state longer than `stuckAfterSeconds` on two
consecutive scrapes (the same room, still ageing). Rooms waiting for bootstrap or for their
forward pass are queueing, not stuck: a busy pod that keeps finishing transfers is never
wedged. A pod that does not export the per-state age is judged by the progress clause alone.
A failed latest scrape makes it *unobserved*, never wedged. A counter that went down means
the process restarted: evidence before that point is discarded. Abandoned rooms (a request
that ended, held for a write that may still land) are named in the verdict, never judged.

Separately, a pod is wedged when an essential thread of its runtime (SGLang's NIXL
bootstrap thread, transfer workers, decode listener, heartbeat; pdwarden's own) is dead on
two consecutive scrapes: SGLang never restarts them, so the pod cannot recover by itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pdwarden_operator.watchdog.history import PodScrape
from pdwarden_operator.watchdog.parse import STUCK_STATE, PodSample
from pdwarden_operator.watchdog.verdict import Verdict, VerdictState

# The oldest Transferring room's age must grow by at least this fraction of the time between two
# scrapes for the two readings to count as the same stuck request.
AGEING_FRACTION = 0.5


def _trusted_run(observations: Sequence[PodScrape]) -> list[tuple[float, PodSample]]:
    """The latest consecutive successful samples, cut at a counter reset; oldest first."""
    run: list[tuple[float, PodSample]] = []
    for obs in reversed(observations):
        if obs.sample is None:
            break
        if run and obs.sample.transfers > run[-1][1].transfers:
            break  # the counter went down after this sample: a restart; older evidence is void
        run.append((obs.at, obs.sample))
    run.reverse()
    return run


def _dead_threads_clause(run: list[tuple[float, PodSample]], figures: dict[str, float]) -> Verdict | None:
    """Wedged when the same thread kind is short of its expected alive count on the last
    two consecutive scrapes (one reading could catch a runtime starting or stopping)."""
    if len(run) < 2:
        return None
    latest, previous = run[-1][1], run[-2][1]
    earlier = {kind for kind, _, _ in previous.dead_threads}
    dead = [(kind, alive, want) for kind, alive, want in latest.dead_threads if kind in earlier]
    if not dead:
        return None
    listed = ", ".join(f"{kind} {alive:g}/{want:g} alive" for kind, alive, want in dead)
    return Verdict(
        VerdictState.WEDGED,
        f"essential thread dead on 2 consecutive scrapes: {listed}",
        figures | {"deadThreadKinds": float(len(dead))},
    )


def judge(observations: Sequence[PodScrape], stuck_after: float) -> Verdict:
    """Verdict for one pod from its observations (oldest first)."""
    if not observations:
        return Verdict(VerdictState.UNOBSERVED, "not scraped yet")
    last = observations[-1]
    if last.sample is None:
        return Verdict(VerdictState.UNOBSERVED, f"scrape failed: {last.error or 'unknown error'}")

    run = _trusted_run(observations)
    latest = run[-1][1]
    figures = {
        "inflight": latest.inflight,
        "oldestAgeSeconds": latest.oldest_age,
        "transfersTotal": latest.transfers,
    }
    if latest.bootstrapping is not None:
        figures["bootstrapping"] = latest.bootstrapping
    if latest.abandoned is not None:
        figures["abandonedRooms"] = latest.abandoned
    if latest.peers is not None and latest.peers.held:
        figures["pagesHeld"] = sum(latest.peers.held.values())
    verdict = _judge_run(run, figures, stuck_after)
    return _naming_abandoned(verdict, latest)


def _naming_abandoned(verdict: Verdict, latest: PodSample) -> Verdict:
    """The verdict, its reason naming the rooms the pod holds for requests that ended, the
    rooms that wait on a peer and a pool made low by held pages: none of them is what made it
    wedged (or ok); the writer that holds the pages is blame.py's to find."""
    notes = []
    low = _pool_low_note(latest)
    if low:
        notes.append(low)
    if latest.bootstrapping:
        notes.append(f"{latest.bootstrapping:g} waiting on a peer to bootstrap")
    if latest.abandoned:
        notes.append(f"{latest.abandoned:g} abandoned (request ended, held for a write that may land)")
    if not notes:
        return verdict
    return replace(verdict, reason=f"{verdict.reason}; rooms not judged: {', '.join(notes)}")


# Held pages above this share of the pool make the verdict say the pool runs low because of them.
POOL_LOW_SHARE = 0.5


def _pool_low_note(latest: PodSample) -> str | None:
    """A decode whose KV pool runs low because of pages held for writers that did not drain."""
    held = latest.peers.held if latest.peers is not None else {}
    total = sum(held.values())
    if not held or not latest.pool_pages or total < POOL_LOW_SHARE * latest.pool_pages:
        return None
    writers = ", ".join(f"{peer} {pages:g}" for peer, pages in sorted(held.items(), key=lambda kv: -kv[1]))
    return (
        f"KV pool low: {total:g} of {latest.pool_pages:g} pages held for writers that neither drained "
        f"nor are gone ({writers})"
    )


def _judge_run(run: list[tuple[float, PodSample]], figures: dict[str, float], stuck_after: float) -> Verdict:
    now, latest = run[-1]

    dead = _dead_threads_clause(run, figures)
    if dead is not None:
        return dead

    # (1) no progress while busy: walk back over samples busy with the same counter value
    start = len(run) - 1
    while start > 0 and run[start - 1][1].working > 0 and run[start - 1][1].transfers == latest.transfers:
        start -= 1
    scrapes = len(run) - start
    stalled_for = now - run[start][0]
    if latest.working > 0 and scrapes >= 2 and stalled_for >= stuck_after:
        figures |= {"stalledSeconds": stalled_for, "scrapes": float(scrapes)}
        return Verdict(
            VerdictState.WEDGED,
            f"no progress for {stalled_for:.0f}s over {scrapes} scrapes: inflight={latest.inflight:g}, "
            f"transfers_total stayed {latest.transfers:g}, oldest age {latest.oldest_age:.0f}s "
            f"(stuckAfterSeconds={stuck_after:g})",
            figures,
        )

    # (2) a room held in Transferring (where only a transfer fault holds it) that keeps ageing
    # on two consecutive scrapes: the same room, so its age grew with the time between the
    # scrapes (half of it, for scrape-timing jitter). Time spent queueing before Transferring
    # does not count, so a busy pod with a deep queue is not wedged by this clause.
    if len(run) >= 2:
        prev_at, prev = run[-2]
        age, prev_age = latest.transferring_age, prev.transferring_age
        if (
            age is not None
            and prev_age is not None
            and latest.inflight > 0
            and prev_age > stuck_after
            and age > stuck_after
            and age - prev_age >= AGEING_FRACTION * (now - prev_at)
        ):
            figures |= {"scrapes": 2.0, "transferringSeconds": age}
            return Verdict(
                VerdictState.WEDGED,
                f"oldest room in state {STUCK_STATE} for {age:.0f}s "
                f"(previous scrape {prev_age:.0f}s) > stuckAfterSeconds={stuck_after:g}: "
                f"inflight={latest.inflight:g}, transfers_total={latest.transfers:g}",
                figures,
            )

    if latest.working == 0:
        return Verdict(VerdictState.OK, "idle", figures, cleared=True)
    half = stuck_after / 2
    stalling = (scrapes >= 2 and stalled_for >= half) or (
        latest.transferring_age is not None and latest.transferring_age >= half
    )
    if start > 0:  # an earlier sample in the trusted run had a lower counter: progress seen
        return Verdict(
            VerdictState.OK,
            f"progressing: transfers_total {run[0][1].transfers:g} -> {latest.transfers:g}",
            figures,
            cleared=True,
            stalling=stalling,
        )
    return Verdict(
        VerdictState.OK,
        f"busy, no progress seen for {stalled_for:.0f}s of {stuck_after:g}s allowed",
        figures,
        stalling=stalling,
    )

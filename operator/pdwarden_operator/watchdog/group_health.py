"""Multi-node replicas as the unit of health: a group's pods folded into one ladder entry. Pure.

A group (one StatefulSet, `nodesPerReplica` pods, rank 0 the leader) serves only while every
rank runs in the same incarnation: SGLang's ranks cannot take back a restarted peer. So the
watchdog judges and remediates groups, never their pods one by one. A group is **broken**
when one of its ranks crashed (a container restarted), is missing while the others run, or
was replaced alone (created well after the rest of its group); it is **wedged** when one
of its ranks is. `fold` hands the ladder one `PodView` and one `Verdict` per group, so its
budget, cooldown and `maxUnavailable` count groups; the executor then restarts every pod of
the group together (`members`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pdwarden_contract as contract
from pdwarden_operator.timestamps import from_rfc3339
from pdwarden_operator.watchdog.verdict import PodView, Unit, Verdict, VerdictState

# Ranks of one incarnation start together (podManagementPolicy Parallel); a rank created this
# much later than the oldest one of its group replaced a lost rank alone.
REPLACED_ALONE_AFTER_S = 60.0
# A rank missing this long while another rank of its group runs is lost, not still starting.
MISSING_AFTER_S = 60.0


@dataclass(frozen=True)
class Rank:
    pod: PodView
    rank: int
    created: float  # epoch seconds
    restarts: int  # container restarts, plus 1 while a container is down (terminated)
    last_exit: str  # the last terminated state's reason and exit code, "" when none
    exited_at: float = 0.0  # when that happened (epoch seconds; 0 unknown)
    signalled: bool = False  # that exit was a signal's (code >= 128: killed, OOM), not its own error


@dataclass(frozen=True)
class Group:
    name: str
    role: str
    nodes: int
    ranks: tuple[Rank, ...]  # by rank

    @property
    def unit(self) -> Unit:
        """The ladder's unit: named by its leader's pod, its ranks acted on together."""
        ranks = tuple((r.pod.name, r.pod.uid) for r in self.ranks)
        return Unit("group", self.name, self.ranks[0].pod.uid, ranks)

    @property
    def uid(self) -> str:
        return self.unit.key

    def view(self) -> PodView:
        live = [r for r in self.ranks if not r.pod.terminating]
        unit = self.unit
        return PodView(
            name=self.name,
            uid=unit.key,
            role=self.role,
            ready=len(live) == self.nodes and all(r.pod.ready for r in live),
            terminating=len(live) < len(self.ranks),
            group=unit,
        )


def _epoch(stamp: Any) -> float:
    return from_rfc3339(stamp) or 0.0


def _restarts(pod: Mapping[str, Any]) -> tuple[int, str, float, bool]:
    count, last, at, signalled = 0, "", 0.0, False
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        count += int(status.get("restartCount") or 0)
        now = (status.get("state") or {}).get("terminated") or {}
        count += 1 if now else 0
        term = now or (status.get("lastState") or {}).get("terminated") or {}
        if term:
            last = f"{term.get('reason') or 'exited'}, exit code {term.get('exitCode')}"
            at = _epoch(term.get("finishedAt"))
            code = term.get("exitCode")
            signalled = isinstance(code, int) and code >= 128
    return count, last, at, signalled


def _rank(pod: Mapping[str, Any]) -> int | None:
    meta = pod.get("metadata") or {}
    raw = (meta.get("labels") or {}).get(contract.LABEL_POD_INDEX)
    if raw is None:
        raw = str(meta.get("name", "")).rpartition("-")[2]
    try:
        return int(raw)
    except ValueError:
        return None


def groups_of(
    pods: Sequence[tuple[PodView, Mapping[str, Any]]], model: str, nodes: Mapping[str, int]
) -> dict[str, Group]:
    """The groups of the roles with `nodes[role]` > 1, from (view, pod object) pairs."""
    members: dict[tuple[str, str], list[Rank]] = {}
    for view, obj in pods:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        group, rank = labels.get(contract.LABEL_GROUP), _rank(obj)
        if nodes.get(view.role, 1) <= 1 or group is None or rank is None:
            continue
        restarts, last_exit, exited_at, signalled = _restarts(obj)
        created = _epoch((obj.get("metadata") or {}).get("creationTimestamp"))
        members.setdefault((view.role, str(group)), []).append(
            Rank(view, rank, created, restarts, last_exit, exited_at, signalled)
        )
    out = {}
    for (role, group), ranks in members.items():
        name = f"{model}-{role}-{group}"
        out[name] = Group(name, role, nodes[role], tuple(sorted(ranks, key=lambda r: (r.rank, r.pod.name))))
    return out


def broken(group: Group, now: float) -> tuple[int, str] | None:
    """(rank, why) when the group cannot serve as it is; None when it is whole (or starting)."""
    live = [r for r in group.ranks if not r.pod.terminating]
    # The rank that went down first is the cause: the others follow it (a leader exits when a
    # rank leaves, a worker when its leader goes). Exit times have whole seconds: within one,
    # a rank ended by a signal (killed, OOM) came before one that exited on its own on seeing it.
    crashed = sorted(
        (r for r in live if r.restarts > 0),
        key=lambda r: (r.exited_at or float("inf"), not r.signalled, r.rank),
    )
    if crashed:
        r = crashed[0]
        why = f" ({r.last_exit})" if r.last_exit else ""
        return r.rank, f"rank {r.rank} (pod {r.pod.name}) crashed{why}"
    if live:
        oldest = min(r.created for r in live)
        for r in live:
            if r.created - oldest > REPLACED_ALONE_AFTER_S:
                return r.rank, (
                    f"rank {r.rank} (pod {r.pod.name}) was replaced alone, "
                    f"{r.created - oldest:.0f}s after the rest of its group"
                )
        present = {r.rank for r in live}
        missing = sorted(set(range(group.nodes)) - present)
        if missing and now - oldest > MISSING_AFTER_S:
            return missing[0], f"rank {missing[0]} is missing while the rest of its group runs"
    return None


def fold(
    views: Mapping[str, PodView], verdicts: Mapping[str, Verdict], groups: Mapping[str, Group], now: float
) -> tuple[dict[str, PodView], dict[str, Verdict]]:
    """The ladder's inputs with every group's pods replaced by one entry for the group."""
    in_groups = {r.pod.uid for g in groups.values() for r in g.ranks}
    out_views = {uid: v for uid, v in views.items() if uid not in in_groups}
    out_verdicts = {uid: v for uid, v in verdicts.items() if uid not in in_groups}
    for group in groups.values():
        out_views[group.uid] = group.view()
        out_verdicts[group.uid] = _group_verdict(group, verdicts, now)
    return out_views, out_verdicts


def _group_verdict(group: Group, verdicts: Mapping[str, Verdict], now: float) -> Verdict:
    why = broken(group, now)
    if why is not None:
        rank, reason = why
        return Verdict(VerdictState.WEDGED, f"group {group.name}: {reason}", {"rank": float(rank)})
    of_ranks = [(r, verdicts.get(r.pod.uid)) for r in group.ranks]
    for r, v in of_ranks:
        if v is not None and v.wedged:
            return Verdict(
                VerdictState.WEDGED,
                f"group {group.name}: rank {r.rank} (pod {r.pod.name}) is wedged: {v.reason}",
                {**v.figures, "rank": float(r.rank)},
            )
    seen = [v for _, v in of_ranks if v is not None]
    if not seen:
        return Verdict(VerdictState.UNOBSERVED, "not scraped yet")
    unobserved = [v for v in seen if v.state == VerdictState.UNOBSERVED]
    if unobserved:
        return Verdict(VerdictState.UNOBSERVED, unobserved[0].reason)
    return Verdict(
        VerdictState.OK,
        "every rank ok",
        cleared=all(v.cleared for v in seen),
        stalling=any(v.stalling for v in seen),
    )


def members(groups: Mapping[str, Group]) -> dict[str, tuple[tuple[str, str], ...]]:
    """Group uid -> (pod name, pod uid) of each rank, leader first: what a group action acts on."""
    return {g.uid: g.unit.ranks for g in groups.values()}


def unlabelled_ranks(pods: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    """(pod name, uid, rank) of group pods whose `pdwarden.io/rank` label is missing or wrong.
    A StatefulSet's template is the same for every ordinal, so the operator adds the rank label
    (the pod-index label's value) to each pod once."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        index = labels.get(contract.LABEL_POD_INDEX)
        if contract.LABEL_GROUP not in labels or index is None or meta.get("deletionTimestamp"):
            continue
        if labels.get(contract.LABEL_RANK) != index and meta.get("name") and meta.get("uid"):
            out.append((str(meta["name"]), str(meta["uid"]), str(index)))
    return out

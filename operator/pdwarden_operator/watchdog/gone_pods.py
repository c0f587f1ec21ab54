"""The model's runtime pods whose processes are gone, for the decodes that hold pages. Pure.

A decode frees pages held for a prefill that may still write them only on that prefill's
drain ACK or on proof that it cannot write any more (``pdwarden_runtime.hardening.
writer_watch``). A pod whose deletion completed (the kubelet stopped its containers, then the
API server removed it) or that ended (phase Failed or Succeeded) has no process left: the
watchdog lists such pods by UID in a ConfigMap the runtime pods mount. A pod merely missing
from the label-selected list proves nothing (someone may have relabelled a live pod): it is
gone only once a read by name finds no pod, or another pod, under that name. Each entry says
when the pod was last seen alive: a decode takes the pod as the writer of rooms published
before that (``writer_watch``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import pdwarden_contract as contract
from pdwarden_operator.cache import controlled_by
from pdwarden_operator.timestamps import from_rfc3339, to_rfc3339

KEEP_SECONDS: Final = 3600.0  # longer than any page stays held for a writer being remediated
MAX_ENTRIES: Final = 256
ENDED_PHASES: Final = ("Failed", "Succeeded")


@dataclass(frozen=True)
class GonePod:
    uid: str
    name: str
    ip: str
    gone_at: float  # wall clock
    last_seen: float  # wall clock: the last round that listed it alive


@dataclass(frozen=True)
class Seen:
    """A runtime pod as the watchdog saw it."""

    uid: str
    name: str
    ip: str
    ended: bool  # phase Failed or Succeeded: its containers will not run again


def seen(pod: Mapping[str, Any]) -> Seen | None:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if not meta.get("uid") or not meta.get("name"):
        return None
    ended = status.get("phase") in ENDED_PHASES
    return Seen(str(meta["uid"]), str(meta["name"]), str(status.get("podIP") or ""), ended)


class GonePods:
    """What one model's watchdog knows of its gone runtime pods (rebuilt from the ConfigMap
    after a restart; pods deleted while no operator ran are not known)."""

    def __init__(self, entries: Iterable[GonePod] = ()) -> None:
        self._gone: dict[str, GonePod] = {e.uid: e for e in entries}
        self._alive: dict[str, tuple[Seen, float]] = {}  # and when last listed alive

    def missing(self, listed: Iterable[Seen]) -> list[Seen]:
        """Pods seen alive before and not in this list: to be read by name (``confirm``)."""
        now_uids = {s.uid for s in listed}
        return [s for uid, (s, _) in self._alive.items() if uid not in now_uids]

    def observe(self, listed: Iterable[Seen], confirmed_gone: Iterable[str], now: float) -> bool:
        """This round's list, and the missing pods a read by name found gone; True when the
        list of gone pods changed."""
        before = set(self._gone)
        listed = list(listed)
        for uid in confirmed_gone:
            alive = self._alive.pop(uid, None)
            if alive is not None:
                pod, last_seen = alive
                self._gone[uid] = GonePod(uid, pod.name, pod.ip, now, last_seen)
        for pod in listed:
            if pod.ended:
                _, last_seen = self._alive.pop(pod.uid, (pod, 0.0))
                if pod.uid not in self._gone:
                    self._gone[pod.uid] = GonePod(pod.uid, pod.name, pod.ip, now, last_seen)
            elif pod.uid not in self._gone:
                self._alive[pod.uid] = (pod, now)
        for uid, entry in list(self._gone.items()):
            if now - entry.gone_at > KEEP_SECONDS:
                del self._gone[uid]
        while len(self._gone) > MAX_ENTRIES:
            del self._gone[min(self._gone.values(), key=lambda e: e.gone_at).uid]
        return set(self._gone) != before

    def entries(self) -> list[GonePod]:
        return sorted(self._gone.values(), key=lambda e: (e.gone_at, e.uid))


def to_json(entries: Iterable[GonePod]) -> str:
    """The ConfigMap's document (the runtime's ``writer_watch.read_gone_pods`` reads it)."""
    gone = [
        {"uid": e.uid, "pod": e.name, "ip": e.ip, "goneAt": to_rfc3339(e.gone_at), "lastSeen": e.last_seen}
        for e in entries
    ]
    return json.dumps({"gone": gone}, sort_keys=True)


def from_json(text: str | None) -> list[GonePod]:
    """Entries of a document written by ``to_json``; garbage gives none (never an error)."""
    try:
        body = json.loads(text or "")
    except ValueError:
        return []
    items = body.get("gone") if isinstance(body, dict) else None
    out = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("uid"), str):
            continue
        at, seen = from_rfc3339(item.get("goneAt")), item.get("lastSeen")
        if at is not None and isinstance(seen, (int, float)) and not isinstance(seen, bool):
            name, ip = str(item.get("pod") or ""), str(item.get("ip") or "")
            out.append(GonePod(item["uid"], name, ip, at, float(seen)))
    return out


def published(configmap: Mapping[str, Any] | None, model_uid: str) -> tuple[bool, str | None]:
    """(whether the watchdog may write the model's list, the document it holds now). A
    ConfigMap of that name that the model does not control is someone else's, never read
    (a list forged there would free pages) nor written over: the rule of every child, whose
    NameTaken reconcile reports."""
    if configmap is None:
        return True, None
    if not controlled_by(configmap, model_uid):
        return False, None
    return True, (configmap.get("data") or {}).get(contract.GONE_PODS_KEY)

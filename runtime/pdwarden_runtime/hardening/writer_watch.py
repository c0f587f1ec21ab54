"""Proof that the writer of held decode pages is gone, never a clock.

Held pages (``held_pages``) are freed on the prefill's drain ACK, or once the prefill that
may write them provably cannot any more:

- **its process is gone**: the prefill's bootstrap endpoint, asked after the pages were
  held, answered ``INCARNATION_PATH`` with one incarnation and later with another (a new
  process at that address: the old one, and the NIXL agent that held the write, are gone; a
  restarted container keeps its pod's address, so this is how a restart in place is seen);
- **its pod is deleted**: the operator lists, in a file the runtime pods mount
  (``ENV_GONE_PODS_FILE``), the model's runtime pods whose deletion completed, by pod UID,
  with the last time it saw each alive. The writer of a room is the pod that answered at the
  prefill's address before the room's metadata went out; seen alive *after* that (by more
  than ``CLOCK_SKEW_S``), it still held the address when the metadata went out (an address
  belongs to one live pod), so it is the writer, and its deletion ends every write.

A timeout, a failed heartbeat or a refused connection prove nothing: a partitioned prefill
looks the same, and its writes land when the path heals. So none of them frees a page; the
watchdog sees the held pages instead (``pdwarden_kv_pages_held``) and remediates the writer.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final, Protocol

from pdwarden_contract import ENV_GONE_PODS_FILE, ENV_POD_UID

log = logging.getLogger(__name__)

# Served by the prefill's bootstrap server (the hardened one): who is writing from there.
INCARNATION_PATH: Final = "/pdwarden/incarnation"
# This process's incarnation: a new one per process start.
INCARNATION: Final = uuid.uuid4().hex
PROBE_S: Final = 2.0
FETCH_TIMEOUT_S: Final = 2.0
# Prefills asked at once in a probe (one that does not answer holds one fetch, not the rest),
# and the most a probe asks: a decode reads from its model's prefills, a few dozen at most.
FETCH_CONCURRENCY: Final = 8
MAX_PROBED: Final = 256
# The operator's clock and this pod's may differ by this much (NTP keeps a cluster within
# milliseconds; this is the margin the pod-deleted proof leaves).
CLOCK_SKEW_S: Final = 5.0

# Why held pages were freed (``HeldPages`` records it per room).
FREED_DRAINED: Final = "drained"  # the prefill's drain ACK
GONE_NEW_INCARNATION: Final = "new-incarnation"
GONE_POD_DELETED: Final = "pod-deleted"


@dataclass(frozen=True)
class WriterIdentity:
    """A prefill process as its bootstrap endpoint describes itself."""

    incarnation: str
    pod_uid: str | None = None


@dataclass(frozen=True)
class GonePod:
    """A runtime pod of the model whose deletion completed, and when it was last seen alive
    (wall clock, the operator's)."""

    uid: str
    last_seen: float


def incarnation_body() -> dict[str, str | None]:
    return {"incarnation": INCARNATION, "pod_uid": os.environ.get(ENV_POD_UID) or None}


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A bootstrap endpoint answers itself or not at all: a redirect would have this decode
    fetch an address of the answerer's choosing."""

    def redirect_request(self, *_: object, **__: object) -> None:
        return None


_OPENER: Final = urllib.request.build_opener(_NoRedirects)
# An incarnation is this module's uuid4 hex, a pod UID a UUID: anything else is not an answer
# of pdwarden's (and never reaches a log line as it came).
_INCARNATION: Final = re.compile(r"[0-9a-f]{1,64}")
_POD_UID: Final = re.compile(r"[0-9a-f-]{1,64}")


def fetch_identity(bootstrap_addr: str, timeout: float = FETCH_TIMEOUT_S) -> WriterIdentity | None:
    """What the bootstrap endpoint at host:port says it is; None when it does not answer,
    answers garbage or a redirect, or is not pdwarden's (a stock prefill): no identity, no
    proof."""
    try:
        with _OPENER.open(f"http://{bootstrap_addr}{INCARNATION_PATH}", timeout=timeout) as resp:
            body = json.loads(resp.read(4096))
    except (urllib.error.URLError, OSError, ValueError):
        return None
    if not isinstance(body, dict):
        return None
    incarnation, pod_uid = body.get("incarnation"), body.get("pod_uid")
    if not isinstance(incarnation, str) or not _INCARNATION.fullmatch(incarnation):
        return None
    uid = pod_uid if isinstance(pod_uid, str) and _POD_UID.fullmatch(pod_uid) else None
    return WriterIdentity(incarnation, uid)


def read_gone_pods(path: str) -> list[GonePod]:
    """The operator's list; empty when the file is absent or not valid (nothing is proven)."""
    try:
        with open(path, encoding="utf-8") as f:
            body = json.load(f)
    except (OSError, ValueError):
        return []
    entries = body.get("gone") if isinstance(body, dict) else None
    out = []
    for entry in entries[:4096] if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("uid"), str):
            continue
        seen = entry.get("lastSeen")
        if isinstance(seen, (int, float)) and not isinstance(seen, bool):
            out.append(GonePod(entry["uid"], float(seen)))
    return out


class Observer(Protocol):
    """What turns the watch's answers into proofs (``held_pages.HeldPages``)."""

    def held_addresses(self) -> list[str]: ...

    def observe(self, addr: str, identity: WriterIdentity, asked_at: float) -> None: ...

    def observe_gone_pods(self, gone: Iterable[GonePod]) -> None: ...


class WriterWatch:
    """A daemon thread that asks the prefills this decode reads from who they are: the
    identity each room's metadata goes to (``identity``, no request of its own), and, while
    pages are held, the answers ``HeldPages`` turns into proofs; it reads the operator's list
    of deleted pods. A prefill found to be a new process is reported (``restarted``): what
    the decode knew of the old one (its ranks' addresses) is stale."""

    def __init__(
        self,
        held: Observer,
        prefills: Callable[[], Iterable[str]],
        fetch: Callable[[str], WriterIdentity | None] = fetch_identity,
        gone_pods_file: str | None = None,
        probe_s: float = PROBE_S,
        clock: Callable[[], float] = time.monotonic,
        restarted: Callable[[str], None] | None = None,
    ) -> None:
        self._held = held
        self._prefills = prefills
        self._restarted = restarted
        self._fetch = fetch
        self._gone_file = gone_pods_file if gone_pods_file is not None else os.environ.get(ENV_GONE_PODS_FILE)
        self._probe_s = probe_s
        self._clock = clock
        self._lock = threading.Lock()
        self._known: dict[str, WriterIdentity] = {}
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(FETCH_CONCURRENCY, thread_name_prefix="pdwarden-writer-fetch")
        self.thread = threading.Thread(target=self._run, name="pdwarden-writer-watch", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def identity(self, addr: str) -> WriterIdentity | None:
        """The latest answer of the prefill at ``addr`` (None: none yet)."""
        with self._lock:
            return self._known.get(addr)

    def probe_once(self) -> None:
        """Ask every prefill (those holding pages and those rooms go to) who writes from there,
        side by side, and read the operator's list when pages are held."""
        held = set(self._held.held_addresses())
        addrs = sorted(held | set(self._prefills()))[:MAX_PROBED]
        answers = list(self._pool.map(self._ask, addrs))
        for addr, (started, found) in zip(addrs, answers, strict=True):
            if found is None:
                continue  # no answer proves nothing
            with self._lock:
                before = self._known.get(addr)
                self._known[addr] = found
            if before is not None and before.incarnation != found.incarnation:
                log.warning("the prefill at %s is a new process (was %s)", addr, before.incarnation)
                if self._restarted is not None:
                    self._restarted(addr)
            if addr in held:
                self._held.observe(addr, found, started)
        if self._gone_file and held:
            self._held.observe_gone_pods(read_gone_pods(self._gone_file))

    def _ask(self, addr: str) -> tuple[float, WriterIdentity | None]:
        started = self._clock()
        return started, self._fetch(addr)

    def _run(self) -> None:
        while not self._stop.wait(self._probe_s):
            try:
                self.probe_once()
            except Exception:  # the watch must outlive any one bad answer
                log.exception("writer watch: a probe failed")

"""When a quarantined pod holds no healthy request any more (action drain), as a pure function.

Once quarantined, a pod gets no new requests (neither its Deployment's selector nor the
router's discovery matches it), so its healthy requests finish and its finished-transfer
counter moves; a room held by a fault does not. The pod is drained when its latest scrape
shows nothing in flight, or when two consecutive scrapes taken after the quarantine show the
same rooms in flight and the same finished-transfer counter: nothing it still holds moved for
a scrape interval, so what remains is stuck (it is aborted with the pod). `drainSeconds`
bounds the wait either way (ladder.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from pdwarden_operator.watchdog.history import PodScrape
from pdwarden_operator.watchdog.parse import PodSample


def healthy_requests_done(observations: Sequence[PodScrape], since: float) -> bool:
    """`observations` oldest first, `since` on the same (monotonic) clock as their `at`."""
    run: list[PodSample] = []
    for obs in reversed(observations):
        if obs.at < since or obs.sample is None:
            break  # only the latest unbroken run of scrapes after the quarantine counts
        run.append(obs.sample)
    if not run:
        return False
    latest = run[0]
    if latest.inflight == 0:
        return True
    if len(run) < 2:
        return False
    previous = run[1]
    return previous.inflight == latest.inflight and previous.transfers == latest.transfers

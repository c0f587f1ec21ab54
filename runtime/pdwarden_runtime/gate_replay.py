"""A request smg answered without sending it to any worker, sent again by the router's gate.

smg's circuit breaker opens a worker for `ROUTER_BREAKER_OPEN_S` after failed attempts, and it
counts a PD attempt's failure against both of its workers: a burst of failures through one
wedged prefill can open every decode at once. While every worker of a role is open, smg answers
503 `no_available_workers` at once, without retrying and without having sent the request
anywhere (no worker saw it, no KV was written for it). The gate keeps a copy of a small body
(`Replay`, up to `REPLAYABLE_BODY_BYTES`, the size smg itself keeps to retry a request) and, on
that answer, sends the request again after `NO_WORKERS_RETRY_DELAYS_S`: long enough for the
breakers to let a trial request through twice. Any other answer, and a body too large to keep,
passes to the client as smg gave it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Final

import pdwarden_contract as c

# smg's code for "every worker of a role is open or unhealthy".
NO_WORKERS_CODE: Final = "no_available_workers"
NO_WORKERS_STATUS: Final = 503
# smg keeps a body up to this size to retry it (its --max-buffered-request-bytes default).
REPLAYABLE_BODY_BYTES: Final = 1024 * 1024
# An error answer read whole to see its code; a longer one is not smg's "no available workers".
ERROR_BODY_READ_BYTES: Final = 16 * 1024
# Waits before each new send: the breaker's open time twice over (a trial that fails opens it
# again), in growing steps so a breaker that closes early costs little.
NO_WORKERS_RETRY_DELAYS_S: Final = (
    0.25 * c.ROUTER_BREAKER_OPEN_S,
    0.5 * c.ROUTER_BREAKER_OPEN_S,
    c.ROUTER_BREAKER_OPEN_S,
    c.ROUTER_BREAKER_OPEN_S,
)


class Replay:
    """A copy of a request body as it streams through (`tee`), kept while it is no larger than
    `limit`: `body()` is the whole body once it has all passed, or None (too large, or not all
    sent)."""

    def __init__(self, limit: int = REPLAYABLE_BODY_BYTES) -> None:
        self.limit = limit
        self._chunks: list[bytes] = []
        self._size = 0
        self._kept = True
        self._complete = False

    @classmethod
    def empty(cls) -> Replay:
        """The replay of a request without a body."""
        replay = cls()
        replay._complete = True
        return replay

    async def tee(self, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for chunk in body:
            if self._kept:
                self._size += len(chunk)
                if self._size > self.limit:
                    self._kept = False
                    self._chunks.clear()
                else:
                    self._chunks.append(chunk)
            yield chunk
        self._complete = True

    def body(self) -> bytes | None:
        if not (self._complete and self._kept):
            return None
        return b"".join(self._chunks)


def may_be_no_workers_answer(status: int, headers: Mapping[str, str]) -> bool:
    """Whether an answer is worth reading whole to see if it is smg's "no available workers":
    a 503 with a small, sized body."""
    length = headers.get("Content-Length", "")
    return status == NO_WORKERS_STATUS and length.isdigit() and int(length) <= ERROR_BODY_READ_BYTES


def is_no_workers_answer(body: bytes) -> bool:
    """Whether a 503's body is smg's "no available workers" (OpenAI's error shape)."""
    try:
        answer = json.loads(body)
    except ValueError:
        return False
    if not isinstance(answer, dict):
        return False
    error = answer.get("error")
    return isinstance(error, dict) and error.get("code") == NO_WORKERS_CODE

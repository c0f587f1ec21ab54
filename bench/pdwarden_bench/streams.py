"""Streamed chat clients for the benchmarks: OpenAI's ``/v1/chat/completions`` with
``"stream": true``, read event by event as server-sent events, each token's arrival timed; a
client may hang up after so many events (mid-answer: it closes its connection).

SGLang's chat stream (the synthetic engine's too): a first chunk with the role alone, one chunk
per token whose ``delta.content`` is not empty, a chunk with the finish reason, then
``data: [DONE]``. Time to first token is the arrival of the first event carrying content;
inter-token latency the gaps between consecutive ones.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import aiohttp

CHAT_PATH: Final = "/v1/chat/completions"
# The synthetic runtime's served name by default (`pdwarden runtime serve --model`).
SYNTHETIC_MODEL: Final = "pdwarden/synthetic"
OK, FAILED, HUNG_UP, TIMED_OUT = "ok", "failed", "cancelled", "timed-out"
DONE: Final = b"[DONE]"
DETAIL_BYTES: Final = 200  # of a failed answer, kept to say why


@dataclass(frozen=True)
class StreamAnswer:
    """What one streamed request's client saw."""

    outcome: str  # OK (its [DONE] came), HUNG_UP, FAILED or TIMED_OUT
    seconds: float  # from the request to its end (or the hang-up)
    events: int = 0  # data events read, [DONE] aside
    token_times: tuple[float, ...] = ()  # seconds from the request to each event carrying content
    status: int | None = None
    detail: str = ""  # why it failed: the start of an error's answer or event


def chat_body(text: str, max_tokens: int, model: str = SYNTHETIC_MODEL) -> dict[str, Any]:
    """A streamed chat request: one user message, ``max_tokens`` new tokens, greedy."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
    }


def event_data(line: bytes) -> bytes | None:
    """The payload of a server-sent event's ``data:`` line; None for any other line (blank
    separators, comments, other fields)."""
    stripped = line.strip()
    if not stripped.startswith(b"data:"):
        return None
    return stripped[len(b"data:") :].strip()


def carries_content(event: Any) -> bool:
    """A chat chunk whose delta holds text: a token (the role chunk's content is empty)."""
    if not isinstance(event, dict):
        return False
    for choice in event.get("choices") or ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict) and delta.get("content"):
            return True
    return False


def first_token_and_gaps(token_times: Sequence[float]) -> tuple[float | None, list[float]]:
    """Time to first token and the inter-token gaps of one stream (its token arrivals, in
    order); (None, []) for a stream that carried no token."""
    if not token_times:
        return None, []
    return token_times[0], [later - earlier for earlier, later in itertools.pairwise(token_times)]


async def stream_chat(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    *,
    hangup_after: int | None = None,
    timeout: float = 60.0,
    headers: dict[str, str] | None = None,
) -> StreamAnswer:
    """Send one streamed chat request and read its events; ``hangup_after``: close the
    connection once that many data events came (before its [DONE]). A non-200 answer, an error
    event, a stream that ends without [DONE] or an error is FAILED; no end within ``timeout``
    seconds TIMED_OUT."""
    start = time.perf_counter()
    events = 0
    token_times: list[float] = []

    def answer(outcome: str, status: int | None = None, detail: str = "") -> StreamAnswer:
        return StreamAnswer(outcome, time.perf_counter() - start, events, tuple(token_times), status, detail)

    try:
        async with session.post(
            url, json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as resp:
            if resp.status != 200:
                raw = await resp.read()
                return answer(FAILED, resp.status, raw[:DETAIL_BYTES].decode(errors="replace"))
            async for line in resp.content:
                data = event_data(line)
                if data is None:
                    continue
                if data == DONE:
                    return answer(OK, resp.status)
                at = time.perf_counter() - start
                events += 1
                try:
                    event = json.loads(data)
                except ValueError:
                    return answer(FAILED, resp.status, data[:DETAIL_BYTES].decode(errors="replace"))
                if isinstance(event, dict) and "error" in event:
                    return answer(FAILED, resp.status, json.dumps(event["error"])[:DETAIL_BYTES])
                if carries_content(event):
                    token_times.append(at)
                if hangup_after is not None and events >= hangup_after:
                    resp.close()  # the client walks away mid-answer: its connection closes
                    return answer(HUNG_UP, resp.status)
            return answer(FAILED, resp.status, "the stream ended without data: [DONE]")
    except TimeoutError:
        return answer(TIMED_OUT)
    except (aiohttp.ClientError, OSError) as err:
        return answer(FAILED, None, repr(err)[:DETAIL_BYTES])

"""The synthetic engine speaks SGLang's HTTP surface, for real: OpenAI's SDK and SGLang's native
API through the model's front door (the gate, smg in PD mode) to a synthetic prefill and decode
as processes, streamed and not; a stream whose client hangs up ends its decode request at once.

Decode paces its tokens (``--token-interval-ms``) so a stream lasts long enough to be read and
cancelled mid-answer. The shapes themselves are checked against SGLang's models in
tests/unit/test_synthetic_api_shapes.py.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest

from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.runtime_procs import Fleet, Router, Runtime, serve_flags, wait_healthy, wait_router

pytestmark = pytest.mark.integration

TOKEN_INTERVAL_MS = 20
FLAGS = serve_flags(inflight_deadline=120, token_interval_ms=TOKEN_INTERVAL_MS)
ENV = {"UCX_TLS": "tcp,self"}  # UCX over TCP, as between pods on different nodes
MODEL = "pdwarden/synthetic"  # the served model name (the runtime's --model default)


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Runtime, Runtime, Router]]:
    with Fleet() as fleet:
        prefill = fleet.runtime("prefill", extra=FLAGS, env=ENV)
        decode = fleet.runtime("decode", extra=FLAGS, env=ENV)
        wait_healthy([prefill, decode], timeout=300)
        router = fleet.router([prefill], [decode], gated=True)
        wait_router(router, timeout=240)
        yield prefill, decode, router


@pytest.fixture(scope="module")
def client(pair: tuple[Runtime, Runtime, Router]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{pair[2].url}/v1", api_key="unused", max_retries=0, timeout=60)


def _events(lines: Iterator[bytes]) -> Iterator[Any]:
    """The JSON events of a server-sent event stream, up to its [DONE] (which must come)."""
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        assert line.startswith(b"data: "), line
        data = line[len(b"data: ") :]
        if data == b"[DONE]":
            return
        yield json.loads(data)
    raise AssertionError("the stream ended without data: [DONE]")


def test_an_openai_completion_and_chat_through_the_router(client: openai.OpenAI) -> None:
    completion = client.completions.create(model=MODEL, prompt="hello there", max_tokens=4)
    assert completion.object == "text_completion" and completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 4
    assert completion.usage.prompt_tokens == len("hello there")
    assert completion.choices[0].text.count(" t") == 4
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
    assert chat.usage is not None and chat.usage.completion_tokens == 3
    assert (chat.choices[0].message.content or "").count(" t") == 3


def test_a_streamed_chat_through_the_router(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.count(" t") == 5
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5


def test_a_native_stream_without_a_model_through_the_router(pair: tuple[Runtime, Runtime, Router]) -> None:
    body = {"text": "native", "sampling_params": {"max_new_tokens": 4}, "stream": True}
    request = urllib.request.Request(
        f"{pair[2].url}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        events = list(_events(iter(resp.readline, b"")))
    # SGLang's native stream: cumulative text and ids, the finish reason on the last output
    assert [len(e["output_ids"]) for e in events] == [1, 2, 3, 4]
    assert events[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert events[-1]["meta_info"]["prompt_tokens"] == len("native")
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])


def _settled(decode: Runtime) -> dict[str, Any] | None:
    state = decode.state()
    clean = (
        state["pending_requests"] == 0
        and not state["rooms"]
        and state["free_pages"] == state["total_pages"]
        and state["free_aux"] == state["total_aux"]
        and state["background_tasks"] == 0
    )
    return state if clean else None


async def test_a_streamed_chat_whose_client_hangs_up_ends_its_decode_request(
    pair: tuple[Runtime, Runtime, Router],
) -> None:
    _, decode, router = pair
    before = decode.state()
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "a long answer, please"}],
        "max_tokens": 1000,  # 20 s at the decode's pace: it must not run to the end
        "stream": True,
    }
    events: list[Any] = []
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
        session.post(f"{router.url}/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status == 200
        async for raw in resp.content:
            if raw.strip():
                events.append(json.loads(raw.strip()[len(b"data: ") :]))
            if len(events) == 3:
                break
        resp.close()  # hang up mid-answer
    hung_up = time.monotonic()
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    state = wait_for(lambda: _settled(decode), 10, "decode to drop the request its client left", 0.1)
    assert time.monotonic() - hung_up < 5, "decode went on with a request whose client had left"
    time.sleep(2 * TOKEN_INTERVAL_MS / 1000)  # one more step of the decode's pace
    after = decode.state()
    assert after["tokens_after_hangup"] == before["tokens_after_hangup"] == 0
    assert after["hangups"] == before["hangups"] + 1
    assert after["tokens_produced"] == state["tokens_produced"] < before["tokens_produced"] + 1000

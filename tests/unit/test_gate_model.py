"""The router gate names the model's served name in a native /generate body that names none
(smg under discovery refuses one without a model), streaming: no body is held back."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from pdwarden_runtime.gate_model import STEP_BUDGET, ModelFill, wants_model
from pdwarden_runtime.router_gate import Gate
from pdwarden_testkit.ports import free_port

pytestmark = pytest.mark.unit

NAME = "team/served-name"


def _fill(body: bytes, seed: int | None = None) -> tuple[bytes, bool]:
    """`body` through a ModelFill whole, or (with `seed`) in random chunks of 1 to 9 bytes."""
    fill = ModelFill(NAME)
    if seed is None:
        return fill.feed(body), fill.filled
    rng, out, i = random.Random(seed), b"", 0
    while i < len(body):
        k = rng.randint(1, 9)
        out += fill.feed(body[i : i + k])
        i += k
    return out, fill.filled


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"text":"hi"}', b'{"text":"hi","model":"team/served-name"}'),
        (b"{}", b'{"model":"team/served-name"}'),
        (b" \n{ } \n", b' \n{ "model":"team/served-name"} \n'),
        # "model" inside strings, deeper objects, or as part of a longer key is not the member
        (
            b'{"text":"a \\"model\\": x","x":{"model":1},"modelx":[{"b":"}]"}]}',
            b'{"text":"a \\"model\\": x","x":{"model":1},"modelx":[{"b":"}]"}],"model":"team/served-name"}',
        ),
        (b'{"\\\\model":1}', b'{"\\\\model":1,"model":"team/served-name"}'),
        (b'{"text":"\xc3\xa9 {\\\\"}', b'{"text":"\xc3\xa9 {\\\\","model":"team/served-name"}'),
    ],
)
def test_a_body_without_a_model_gets_the_served_name_before_its_closing_brace(
    body: bytes, expected: bytes
) -> None:
    for seed in (None, 1, 2, 3):
        assert _fill(body, seed) == (expected, True), seed


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"another","text":"}"}',
        b'{"text":"x","mod\\u0065l":"spelled with an escape"}',
        b'{"input_ids":[1,2],"model":null}',  # smg's answer to a null model is smg's
        b'[{"text":"not an object"}]',
        b"not json",
        b"",
        b'{"text":"cut short',
    ],
)
def test_a_body_that_names_a_model_or_is_no_object_passes_untouched(body: bytes) -> None:
    for seed in (None, 1, 2):
        assert _fill(body, seed) == (body, False), seed


def _value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 3 or roll < 0.4:
        return rng.choice([1, -2.5e3, "s", 'a"b\\', "}{][,:", None, True, "model", "\u00e9\u4e2d"])
    if roll < 0.7:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    keys = ["model", "m", 'x"', "mode", "\\", "model "]
    return {rng.choice(keys): _value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def test_any_json_object_comes_out_as_itself_with_the_model_named_once() -> None:
    for seed in range(1500):
        rng = random.Random(seed)
        obj = {rng.choice(["model", "text", "m\u00e9", "sampling_params"]): _value(rng) for _ in range(4)}
        body = json.dumps(obj, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1])).encode()
        out, filled = _fill(body, seed)
        assert filled == ("model" not in obj), body
        assert json.loads(out) == {**obj, "model": obj.get("model", NAME)}, body


def test_a_body_built_to_cost_the_gate_passes_untouched_after_its_step_budget() -> None:
    """A real request takes tens of steps (long strings and token lists are skipped whole); one
    of millions of brackets or members stops being read, and smg answers it as it would."""
    for body in (
        b'{"a":[' + b"[]," * STEP_BUDGET + b"[]]}",
        b"{" + b'"a":1,' * STEP_BUDGET + b'"b":1}',
    ):
        fill = ModelFill(NAME)
        out = b"".join(fill.feed(body[i : i + 65536]) for i in range(0, len(body), 65536))
        assert (out, fill.filled) == (body, False)
    long = json.dumps({"text": 'word "q" ' * 100_000, "input_ids": list(range(100_000))}).encode()
    fill = ModelFill(NAME)
    out = b"".join(fill.feed(long[i : i + 4096]) for i in range(0, len(long), 4096))
    assert fill.filled and json.loads(out)["model"] == NAME


@pytest.mark.parametrize(
    ("method", "path", "content_type", "encoding", "wanted"),
    [
        ("POST", "/generate", "application/json", None, True),
        ("post", "/generate", "application/vnd.api+json", "identity", True),
        ("POST", "/generate", "text/plain", None, False),
        ("POST", "/generate", "application/json", "gzip", False),
        ("POST", "/v1/completions", "application/json", None, False),  # OpenAI's routes need one
        ("POST", "/v1/chat/completions", "application/json", None, False),
        ("GET", "/generate", "application/json", None, False),
    ],
)
def test_only_a_native_generate_json_body_is_named(
    method: str, path: str, content_type: str, encoding: str | None, wanted: bool
) -> None:
    assert wants_model(method, path, content_type, encoding) is wanted


async def _through_gate(model: str | None, path: str, body: bytes, content_type: str) -> dict[str, Any]:
    """What a stand-in for smg behind the gate receives: the body and its framing."""
    seen: dict[str, Any] = {}

    async def upstream(request: web.Request) -> web.Response:
        seen["body"] = await request.read()
        seen["chunked"] = request.headers.get("Transfer-Encoding") == "chunked"
        return web.json_response({})

    smg = web.Application()
    smg.router.add_post(path, upstream)
    smg_port, gate_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    runners = [
        web.AppRunner(smg),
        web.AppRunner(Gate(f"http://127.0.0.1:{smg_port}", None, model=model).app()),
    ]
    for runner, port in zip(runners, (smg_port, gate_port), strict=True):
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as session:
            headers = {"Content-Type": content_type}
            async with session.post(
                f"http://127.0.0.1:{gate_port}{path}", data=body, headers=headers
            ) as resp:
                assert resp.status == 200, await resp.text()
    finally:
        for runner in runners:
            await runner.cleanup()
    return seen


def test_the_gate_names_the_model_on_generate_only_and_streams_the_body_on() -> None:
    body = b'{"text":"hi","sampling_params":{"max_new_tokens":1}}'
    named = asyncio.run(_through_gate(NAME, "/generate", body, "application/json"))
    assert json.loads(named["body"]) == {**json.loads(body), "model": NAME}
    assert named["chunked"]  # streamed on as it came (its length is the gate's no more)
    for model, path, content_type in (
        (None, "/generate", "application/json"),  # a gate that knows no name
        (NAME, "/v1/completions", "application/json"),
        (NAME, "/generate", "text/plain"),
    ):
        assert asyncio.run(_through_gate(model, path, body, content_type))["body"] == body, (model, path)

"""The synthetic engine's HTTP surface against SGLang 0.5.23's own models (the installed wheel):
what it reads (native /generate, OpenAI completions and chat, as clients and smg send them) and
what it answers (native outputs, OpenAI objects and stream chunks, errors, the model list), each
parsed or rebuilt by SGLang's code, not compared by hand."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from sglang.api.v1.api_types import ErrorBody, GenerateRequest, GenerateResponse, GenerateStreamError
from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
    ErrorResponse,
    ModelList,
    UsageInfo,
)
from sglang.srt.entrypoints.openai.sse_utils import build_sse_content

from pdwarden_runtime.engines.synthetic_api import ApiRequest, Route, parse
from pdwarden_runtime.engines.synthetic_pattern import BadRequest, RequestSpec, output_ids
from pdwarden_runtime.engines.synthetic_shapes import (
    SSE_DONE,
    Shaper,
    error_body,
    model_list,
    native_output,
    sse,
    stream_error,
)

pytestmark = pytest.mark.unit

MODEL = "pdwarden/synthetic"
# What smg's PD router adds to the JSON body it sends both legs (pd_router.rs,
# inject_bootstrap_into_value), on every route.
PD_FIELDS = {"bootstrap_host": "198.18.0.7", "bootstrap_port": 8998, "bootstrap_room": 4242}


def _outputs(request: ApiRequest, tokens: int = 3) -> list[dict[str, Any]]:
    """The native outputs decode yields for a request: one per token, the last finished."""
    spec = RequestSpec(room=7, tokens=11, pages=1, max_new_tokens=tokens, digest=99)
    ids, started = output_ids(spec), time.perf_counter()
    return [
        native_output(request.rid, spec.tokens, ids[:k], finished=k == tokens, started=started)
        for k in range(1, tokens + 1)
    ]


def _stream(request: ApiRequest, tokens: int = 3) -> list[dict[str, Any]]:
    shaper, outs = Shaper(request), _outputs(request, tokens)
    events = [event for out in outs for event in shaper.chunks(out)]
    return events + shaper.tail(outs[-1])


# --- requests ---------------------------------------------------------------------------------


def test_a_native_request_needs_no_model_and_keeps_its_pd_fields() -> None:
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 4}, "stream": True, **PD_FIELDS}
    GenerateRequest.from_json_value(body)  # SGLang's contract gate admits it
    request = parse(Route.GENERATE, body)
    assert request.stream and request.native["rid"]
    spec = RequestSpec.from_body(request.native, 16, 64)
    assert (spec.room, spec.tokens, spec.max_new_tokens) == (4242, 5, 4)
    ids = parse(Route.GENERATE, {"input_ids": [1, 2, 3], "bootstrap_room": 1})
    assert ids.native["input_ids"] == [1, 2, 3] and not ids.stream


@pytest.mark.parametrize(
    "body",
    [
        {"text": ["a", "b"], "bootstrap_room": [1, 2]},
        {"input_ids": [[1, 2], [3]], "bootstrap_room": [1, 2]},
        {"sampling_params": {"max_new_tokens": 1}},
        {"text": "a", "stream": "yes"},
    ],
)
def test_a_native_batch_or_a_malformed_request_is_a_bad_request(body: dict[str, Any]) -> None:
    with pytest.raises(BadRequest):
        parse(Route.GENERATE, body)


def test_an_openai_request_as_smg_forwards_it_becomes_the_same_native_request() -> None:
    """smg parses the client's body, serializes it again (every field, nulls included) and adds
    the PD fields: the engine reads that as it reads the client's own body."""
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    forwarded = {**ChatCompletionRequest.model_validate(chat).model_dump(mode="json"), **PD_FIELDS}
    for body in (chat, forwarded):
        request = parse(Route.CHAT, {**body, **PD_FIELDS})
        assert request.stream and request.include_usage and request.model == MODEL
        assert request.native["sampling_params"] == {"max_new_tokens": 5}
        assert request.native["bootstrap_room"] == 4242 and request.rid.startswith("chatcmpl-")
        assert request.native["text"] == "<|user|>hi\n<|assistant|>"
    completion = {"prompt": [1, 2, 3], "max_tokens": 2, **PD_FIELDS}  # no model: SGLang's "default"
    CompletionRequest.model_validate(completion)
    request = parse(Route.COMPLETIONS, completion)
    assert request.model == "default" and request.native["input_ids"] == [1, 2, 3]
    assert not request.include_usage and request.rid.startswith("cmpl-")


@pytest.mark.parametrize(
    ("route", "body"),
    [
        (Route.COMPLETIONS, {"prompt": ["a", "b"]}),
        (Route.COMPLETIONS, {"prompt": "a", "n": 2}),
        (Route.CHAT, {"messages": []}),
        (Route.CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    ],
)
def test_what_the_synthetic_engine_cannot_serve_is_a_bad_request(route: Route, body: dict[str, Any]) -> None:
    with pytest.raises(BadRequest):
        parse(route, body)


# --- answers ----------------------------------------------------------------------------------


def test_a_native_answer_is_sglangs_generate_response_with_the_meta_info_it_fills() -> None:
    request = parse(Route.GENERATE, {"text": "x", "bootstrap_room": 7})
    final = _outputs(request)[-1]
    assert Shaper(request).response(final) is final
    parsed = GenerateResponse.from_json_value(json.loads(json.dumps(final)))
    assert parsed.meta_info is not None and parsed.meta_info.completion_tokens == 3
    assert parsed.text == final["text"] and list(parsed.output_ids or []) == final["output_ids"]
    meta = final["meta_info"]
    # the keys SGLang's tokenizer manager fills for a finished text request
    assert {
        "id",
        "finish_reason",
        "prompt_tokens",
        "weight_version",
        "num_retractions",
        "reasoning_tokens",
        "completion_tokens",
        "cached_tokens",
        "e2e_latency",
    } <= set(meta)
    assert meta["finish_reason"] == {"type": "length", "length": 3}


def test_a_native_stream_sends_cumulative_outputs_finished_last() -> None:
    request = parse(Route.GENERATE, {"text": "x", "bootstrap_room": 7, "stream": True})
    events = _stream(request)
    parsed = [GenerateResponse.from_json_value(e) for e in events]
    assert [len(p.output_ids or []) for p in parsed] == [1, 2, 3]
    assert all(events[-1]["text"].startswith(e["text"]) for e in events)
    assert [e["meta_info"]["finish_reason"] for e in events[:-1]] == [None, None]
    assert "e2e_latency" not in events[0]["meta_info"] and "e2e_latency" in events[-1]["meta_info"]


def _same(model: Any, answer: dict[str, Any]) -> None:
    """SGLang's model reads the answer and writes it back the same, field for field."""
    assert model.model_validate(answer).model_dump(mode="json") == answer


def test_a_completion_is_sglangs_completion_response() -> None:
    request = parse(Route.COMPLETIONS, {"model": MODEL, "prompt": "hello", "max_tokens": 3})
    answer = Shaper(request).response(_outputs(request)[-1])
    _same(CompletionResponse, answer)
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 3 and answer["usage"]["total_tokens"] == 14


def test_a_chat_is_sglangs_chat_completion_response() -> None:
    request = parse(Route.CHAT, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    answer = Shaper(request).response(_outputs(request)[-1])
    _same(ChatCompletionResponse, answer)
    assert answer["choices"][0]["message"]["role"] == "assistant"
    assert answer["id"].startswith("chatcmpl-") and answer["model"] == MODEL


def test_a_completion_stream_is_sglangs_chunks_then_usage_when_asked() -> None:
    body = {"model": MODEL, "prompt": "hello", "stream": True, "stream_options": {"include_usage": True}}
    request = parse(Route.COMPLETIONS, body)
    events = _stream(request)
    *chunks, usage = events
    for chunk in chunks:
        _same(CompletionStreamResponse, chunk)
    assert "".join(c["choices"][0]["text"] for c in chunks) == _outputs(request)[-1]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    # SGLang writes the usage chunk with exclude_none
    rebuilt = CompletionStreamResponse(
        id=request.rid,
        created=usage["created"],
        choices=[],
        model=MODEL,
        usage=UsageInfo(prompt_tokens=11, completion_tokens=3, total_tokens=14),
    )
    assert usage == json.loads(rebuilt.model_dump_json(exclude_none=True))


def test_a_chat_stream_is_sglangs_chunks_role_first_finish_apart_usage_last() -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    request = parse(Route.CHAT, {**body, "stream_options": {"include_usage": True}})
    events = _stream(request)
    for event in events:
        ChatCompletionStreamResponse.model_validate(event)
    role, *content, finish, usage = events
    created = role["created"]
    # SGLang's own builder (sse_utils.build_sse_content) makes the same bytes
    assert (
        sse(role) == build_sse_content(request.rid, created, MODEL, 0, role="assistant", content="").encode()
    )
    text = _outputs(request)[-1]["text"]
    deltas = [c["choices"][0]["delta"]["content"] for c in content]
    assert "".join(deltas) == text and len(deltas) == 3
    assert sse(content[0]) == build_sse_content(request.rid, created, MODEL, 0, content=deltas[0]).encode()
    assert sse(finish) == build_sse_content(request.rid, created, MODEL, 0, finish_reason="length").encode()
    _same(ChatCompletionStreamResponse, usage)
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3
    # without stream_options.include_usage: no usage chunk (SGLang's default)
    assert len(_stream(parse(Route.CHAT, body))) == len(events) - 1


def test_prefill_answers_a_stream_with_one_finished_output_and_no_token() -> None:
    request = parse(Route.CHAT, {"messages": [{"role": "user", "content": "hi"}], "stream": True})
    out = native_output(request.rid, 11, [], finished=True, started=time.perf_counter())
    shaper = Shaper(request)
    events = shaper.chunks(out) + shaper.tail(out)
    assert [e["choices"][0]["delta"].get("role") for e in events] == ["assistant", None]
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_errors_are_sglangs_error_response_and_native_error_bodies() -> None:
    for status in (400, 409, 500, 503):
        body = error_body(Route.CHAT, status, "why")
        assert ErrorResponse.model_validate(body).model_dump() == body
        assert body["object"] == "error" and body["code"] == status and body["param"] is None
        streamed = stream_error(Route.COMPLETIONS, status, "why")
        assert ErrorResponse.model_validate(streamed["error"]).code == status
        native = error_body(Route.GENERATE, status, "why")
        assert ErrorBody.from_json_value(native["error"]).code == status
        parsed = GenerateStreamError.from_json_value(stream_error(Route.GENERATE, status, "why"))
        assert parsed.error is not None and parsed.error.message == "why"
    assert error_body(Route.CHAT, 400, "x")["type"] == "BadRequestError"


def test_the_model_list_is_sglangs() -> None:
    answer = model_list(MODEL, 4096)
    _same(ModelList, answer)
    assert [m["id"] for m in answer["data"]] == [MODEL]


def test_server_sent_events_are_framed_as_sglang_frames_them() -> None:
    event = sse({"a": "b c"})
    assert event.startswith(b"data: ") and event.endswith(b"\n\n") and b"\n" not in event[:-2]
    assert json.loads(event[len(b"data: ") : -2]) == {"a": "b c"}
    assert SSE_DONE == b"data: [DONE]\n\n"

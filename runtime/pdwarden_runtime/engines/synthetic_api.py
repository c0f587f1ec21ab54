"""The request side of the synthetic engine's HTTP surface: SGLang 0.5.23's routes, parsed.

Each serving route (native ``/generate``, OpenAI's ``/v1/completions`` and
``/v1/chat/completions``) is read into one ``ApiRequest``: what the route asked for (stream,
usage, the model name to echo) and a native body for the engine, so the PD path (bootstrap
room, KV transfer, deadlines, aborts) is one path whatever the route, as SGLang's OpenAI layer
hands its tokenizer manager a ``GenerateReqInput``. SGLang requires no "model" (its default is
"default") and ignores what it does not know; so does this. Batched forms (a list of prompts,
``n`` > 1) are refused with a 400 that says so. Pure functions: no SGLang import (the runtime
must start without it); tests check these shapes against SGLang's own protocol models.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from pdwarden_runtime.engines.synthetic_pattern import BadRequest

# SGLang's default model name for OpenAI requests that name none (protocol.DEFAULT_MODEL_NAME).
DEFAULT_MODEL_NAME: Final = "default"
# SGLang's CompletionRequest.max_tokens default; chat has none (up to the context), and the
# synthetic engine's own native default (16) stands in for it.
COMPLETION_MAX_TOKENS: Final = 16
# Fields of a request that pass to the engine unchanged: the PD fields smg injects, and the
# synthetic engine's own knob.
PASSED_FIELDS: Final = ("bootstrap_host", "bootstrap_port", "bootstrap_room", "synthetic_compute_ms")


class Route(Enum):
    GENERATE = "/generate"
    COMPLETIONS = "/v1/completions"
    CHAT = "/v1/chat/completions"

    @property
    def openai(self) -> bool:
        return self is not Route.GENERATE


@dataclass(frozen=True)
class ApiRequest:
    route: Route
    native: dict[str, Any]  # the engine's body: text or input_ids, sampling_params, PD fields, rid
    stream: bool
    include_usage: bool  # a stream's final usage chunk (OpenAI's stream_options.include_usage)
    model: str  # echoed in OpenAI responses, as SGLang echoes request.model

    @property
    def rid(self) -> str:
        return str(self.native["rid"])


def parse(route: Route, body: Any) -> ApiRequest:
    """The request a route's JSON body asks for; BadRequest (a 400) says what is wrong."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if route is Route.GENERATE:
        return _generate(body)
    native = {k: body[k] for k in PASSED_FIELDS if k in body}
    n = body.get("n", 1)
    if n not in (None, 1):
        raise BadRequest(f"n must be 1: the synthetic engine serves one choice per request, got {n!r}")
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadRequest("stream_options must be an object")
    include_usage = stream and bool((options or {}).get("include_usage"))
    model = body.get("model") or DEFAULT_MODEL_NAME
    if not isinstance(model, str):
        raise BadRequest(f"model must be a string, got {model!r}")
    if route is Route.COMPLETIONS:
        native.update(_prompt(body.get("prompt")))
        max_tokens = body.get("max_tokens", COMPLETION_MAX_TOKENS)
        prefix = "cmpl-"
    else:
        native["text"] = _chat_prompt(body.get("messages"))
        max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        prefix = "chatcmpl-"
    if max_tokens is not None:
        native["sampling_params"] = {"max_new_tokens": max_tokens}
    native["rid"] = _rid(body.get("rid"), prefix)
    native["stream"] = stream
    return ApiRequest(route, native, stream, include_usage, model)


def _generate(body: dict[str, Any]) -> ApiRequest:
    text, ids = body.get("text"), body.get("input_ids")
    if isinstance(text, list) or (isinstance(ids, list) and any(isinstance(i, list) for i in ids)):
        raise BadRequest("batched requests (a list of prompts) are not supported by the synthetic engine")
    if text is None and ids is None:
        raise BadRequest("give text or input_ids")
    native = dict(body)
    native["rid"] = _rid(body.get("rid"), "")
    stream = _flag(body, "stream")
    return ApiRequest(Route.GENERATE, native, stream, False, DEFAULT_MODEL_NAME)


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be a boolean, got {value!r}")
    return value


def _rid(given: Any, prefix: str) -> str:
    if given is None:
        return f"{prefix}{uuid.uuid4().hex}"
    if not isinstance(given, str) or not given:
        raise BadRequest(
            f"rid must be a non-empty string (batched requests are not supported), got {given!r}"
        )
    return given


def _prompt(prompt: Any) -> dict[str, Any]:
    """A completion's prompt: a string or token ids (a one-element list of either is one prompt)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return {"text": prompt}
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return {"input_ids": prompt}
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise BadRequest("batched prompts are not supported by the synthetic engine")
    raise BadRequest("prompt must be a string or a list of token ids")


def _chat_prompt(messages: Any) -> str:
    """The prompt text of a chat: a fixed template over the messages (the synthetic tokenizer
    counts its bytes), with the assistant's turn opened, as a chat template does."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    parts = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest("each message must be an object with a role")
        parts.append(f"<|{message['role']}|>{_content(message.get('content'))}\n")
    return "".join(parts) + "<|assistant|>"


def _content(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise BadRequest("the synthetic engine takes text content parts only")
            texts.append(part["text"])
        return "".join(texts)
    raise BadRequest("message content must be a string or a list of text parts")

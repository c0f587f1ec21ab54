"""The response side of the synthetic engine's HTTP surface, in SGLang 0.5.23's shapes.

The engine produces native outputs (``native_output``: what SGLang's tokenizer manager yields,
``{"text", "output_ids", "meta_info"}``, text and ids cumulative in a stream); ``Shaper`` turns
them into a route's answer: the native output itself for ``/generate``, or OpenAI's completion
and chat objects and stream chunks, as SGLang's ``serving_completions``/``serving_chat`` build
them (field for field, nulls included, so clients and SGLang's own models read them). Server-sent
events are framed ``data: <json>\\n\\n`` and end with ``data: [DONE]\\n\\n``. Pure functions and
plain dicts: no SGLang import.
"""

from __future__ import annotations

import json
import time
from http import HTTPStatus
from typing import Any, Final

from pdwarden_runtime.engines.synthetic_api import ApiRequest, Route
from pdwarden_runtime.engines.synthetic_pattern import output_text

SSE_DONE: Final = b"data: [DONE]\n\n"
WEIGHT_VERSION: Final = "default"  # SGLang's --weight-version default


def sse(event: Any) -> bytes:
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def native_output(
    rid: str,
    prompt_tokens: int,
    ids: list[int],
    *,
    finished: bool,
    started: float,
    extras: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One output of a request as SGLang's tokenizer manager fills it (finish_reason None until
    the last; e2e_latency on the last only); ``extras``: pdwarden's own meta_info keys."""
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": {"type": "length", "length": len(ids)} if finished else None,
        "prompt_tokens": prompt_tokens,
        "weight_version": WEIGHT_VERSION,
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": len(ids),
        "cached_tokens": 0,
    }
    if finished:
        meta["e2e_latency"] = time.perf_counter() - started
    meta.update(extras or {})
    return {"text": output_text(ids), "output_ids": list(ids), "meta_info": meta}


def native_error(status: int, message: str) -> dict[str, Any]:
    """SGLang's /generate error body (``_create_error_response``)."""
    return {"error": {"message": message, "code": status}}


def native_stream_error(status: int, message: str) -> dict[str, Any]:
    """The error event of SGLang's /generate stream."""
    return {
        "error": {"message": message, "type": "invalid_request_error", "code": status, "retryable": False}
    }


def openai_error(status: int, message: str) -> dict[str, Any]:
    """SGLang's ErrorResponse (``OpenAIServingBase.create_error_response``)."""
    kind = "BadRequestError" if status == HTTPStatus.BAD_REQUEST else HTTPStatus(status).name
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


def error_body(route: Route, status: int, message: str) -> dict[str, Any]:
    return openai_error(status, message) if route.openai else native_error(status, message)


def stream_error(route: Route, status: int, message: str) -> dict[str, Any]:
    """An error event of a stream that already began (SGLang's create_streaming_error_response)."""
    return {"error": openai_error(status, message)} if route.openai else native_stream_error(status, message)


def model_list(model: str, max_model_len: int) -> dict[str, Any]:
    """SGLang's /v1/models: a ModelList of the served model."""
    card = {
        "id": model,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "sglang",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
    }
    return {"object": "list", "data": [card]}


def _usage(meta: dict[str, Any]) -> dict[str, Any]:
    prompt, completion = meta["prompt_tokens"], meta["completion_tokens"]
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }


def _finish(meta: dict[str, Any]) -> str | None:
    reason = meta.get("finish_reason")
    return None if reason is None else str(reason["type"])


def _matched(meta: dict[str, Any]) -> Any:
    reason = meta.get("finish_reason")
    return reason.get("matched") if reason else None


class Shaper:
    """One request's answer in its route's shape; a stream's state (what text went out)."""

    def __init__(self, request: ApiRequest) -> None:
        self.request = request
        self.created = int(time.time())
        self._sent = 0  # characters of the cumulative text already sent
        self._opened = False  # a chat stream's first chunk (the role) went out

    def response(self, out: dict[str, Any]) -> dict[str, Any]:
        """A non-streamed answer from the final native output (SGLang's pydantic dump: its
        serializers leave out hidden_states, token ids, tool_calls and sglext when unset)."""
        route, meta = self.request.route, out["meta_info"]
        if route is Route.GENERATE:
            return out
        common = {"logprobs": None, "finish_reason": _finish(meta), "matched_stop": _matched(meta)}
        choice: dict[str, Any]
        if route is Route.COMPLETIONS:
            choice = {"index": 0, "text": out["text"], **common}
            kind = "text_completion"
        else:
            message = {"role": "assistant", "content": out["text"], "reasoning_content": None}
            choice = {"index": 0, "message": message, **common}
            kind = "chat.completion"
        metadata = {"weight_version": meta.get("weight_version", WEIGHT_VERSION)}
        answer = self._chunk(kind, meta["id"], [choice], usage=_usage(meta))
        return {**answer, "metadata": metadata}

    def chunks(self, out: dict[str, Any]) -> list[dict[str, Any]]:
        """The stream events for one native output (cumulative text, as SGLang streams it)."""
        route, meta = self.request.route, out["meta_info"]
        if route is Route.GENERATE:
            return [out]
        delta = out["text"][self._sent :]
        self._sent = len(out["text"])
        finish = _finish(meta)
        if route is Route.COMPLETIONS:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish}
            choice["matched_stop"] = _matched(meta)
            return [self._chunk("text_completion", meta["id"], [choice], usage=None)]
        events = []
        if not self._opened:  # SGLang's first chat chunk carries the role alone
            self._opened = True
            role = {"reasoning_content": None, "role": "assistant", "content": ""}
            events.append(self._chat_chunk(meta["id"], role))
        if delta:
            events.append(self._chat_chunk(meta["id"], {"reasoning_content": None, "content": delta}))
        if finish is not None:  # then one chunk with the finish reason and an empty delta
            events.append(self._chat_chunk(meta["id"], {"reasoning_content": None}, finish, _matched(meta)))
        return events

    def tail(self, out: dict[str, Any]) -> list[dict[str, Any]]:
        """What a stream sends after its last output, before [DONE]: the usage chunk, when asked."""
        if not self.request.include_usage:
            return []
        meta = out["meta_info"]
        if self.request.route is Route.COMPLETIONS:  # SGLang dumps this one with exclude_none
            usage = {k: v for k, v in _usage(meta).items() if v is not None}
            return [self._chunk("text_completion", meta["id"], [], usage=usage)]
        return [self._chunk("chat.completion.chunk", meta["id"], [], usage=_usage(meta))]

    def _chunk(self, kind: str, rid: str, choices: list[dict[str, Any]], **rest: Any) -> dict[str, Any]:
        return {
            "id": rid,
            "object": kind,
            "created": self.created,
            "model": self.request.model,
            "choices": choices,
            **rest,
        }

    def _chat_chunk(
        self, rid: str, delta: dict[str, Any], finish: str | None = None, matched: Any = None
    ) -> dict[str, Any]:
        # SGLang builds these with msgspec (sse_utils.build_sse_content): no usage key unless set
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": matched,
        }
        return self._chunk("chat.completion.chunk", rid, [choice])

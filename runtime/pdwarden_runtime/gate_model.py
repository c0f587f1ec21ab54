"""The model's served name, added by the router's gate to a native `/generate` body naming none.

smg switches on its multi-model mode (IGW) whenever it discovers its workers, and there it
refuses a `POST /generate` without `"model"` (400 `missing_model`); smg 1.13.0 has no default
model, no alias for "none" and no way to keep discovery without that mode. One router serves
one model, so the gate names it: `ModelFill` adds `"model": <served name>` to a JSON object that
has no top-level `"model"` member, as the object streams through, holding nothing back: each
chunk passes on as it comes, the member inserted before the object's closing brace. A body that
names a model (any, even one smg does not serve: smg answers 404 `model_not_found`) or is not a
JSON object passes untouched, and smg answers it as it would.
"""

from __future__ import annotations

import json
import re
from typing import Final

import pdwarden_contract as c

MODEL_KEY: Final = "model"
# Raw bytes of a top-level key kept to compare with "model": its longest spelling, every
# character escaped (\u006d...), is 30; a longer key is another one.
_KEY_LIMIT: Final = 32
# What is skipped in one step (the regular expressions run in C, possessively: no backtracking):
# inside the top-level object, up to the next string, bracket or comma; deeper, whole strings
# and everything up to the next bracket; inside a string, up to its end (escapes included).
_TOP_RUN: Final = re.compile(rb'[^"{}\[\],]*+')
_DEEP_RUN: Final = re.compile(rb'(?:[^"{}\[\]]++|"(?:[^"\\]++|\\.)*+")*+', re.DOTALL)
_STRING_RUN: Final = re.compile(rb'(?:[^"\\]++|\\.)*+', re.DOTALL)
# Steps (a bracket, a top-level string or comma, a chunk) one body may take; past them the body
# passes untouched (a real request takes tens; only a body built to cost the gate takes more).
STEP_BUDGET: Final = 1 << 16
_WHITESPACE: Final = b" \t\r\n"
_QUOTE, _COMMA, _BACKSLASH, _BRACE_OPEN, _BRACE_CLOSE = b'",\\{}'
_OPEN: Final = frozenset(b"{[")


def _is_model_key(raw: bytes) -> bool:
    try:
        return bool(json.loads(b'"' + raw + b'"') == MODEL_KEY)
    except ValueError:
        return False


class ModelFill:
    """Feed a JSON body's chunks in order (`feed`); each returns the chunk to pass on."""

    def __init__(self, model: str) -> None:
        self._member = f"{json.dumps(MODEL_KEY)}:{json.dumps(model)}".encode()
        self._started = False
        self._done = False  # the object closed, or the body is not one: pass the rest as it is
        self._steps = 0
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._expect_key = False
        self._members = False
        self._named = False
        self._key: bytearray | None = None  # a top-level key being read
        self.filled = False  # whether the member was added

    def feed(self, chunk: bytes) -> bytes:
        if self._done:
            return chunk
        i, n = 0, len(chunk)
        if not self._started:
            while i < n and chunk[i] in _WHITESPACE:
                i += 1
            if i == n:
                return chunk
            if chunk[i] != _BRACE_OPEN:
                self._done = True
                return chunk
            self._started, self._depth, self._expect_key = True, 1, True
            i += 1
        while i < n:
            self._steps += 1
            if self._steps > STEP_BUDGET:
                self._done = True
                return chunk
            if self._in_string:
                i = self._string(chunk, i)
                continue
            run = _TOP_RUN if self._depth == 1 else _DEEP_RUN
            j = run.match(chunk, i).end()  # type: ignore[union-attr]  # a * always matches
            if j == n:
                break
            byte, i = chunk[j], j + 1
            if byte == _QUOTE:
                self._in_string = True
                if self._depth == 1 and self._expect_key:
                    self._key, self._members, self._expect_key = bytearray(), True, False
            elif byte == _COMMA:
                self._expect_key = True
            elif byte in _OPEN:
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth == 0:
                    self._done = True
                    if byte != _BRACE_CLOSE or self._named:
                        return chunk
                    self.filled = True
                    comma = b"," if self._members else b""
                    return chunk[:j] + comma + self._member + chunk[j:]
        return chunk

    def _string(self, chunk: bytes, i: int) -> int:
        """Read on inside a string from `i`; where reading goes on."""
        if self._escaped:
            self._escaped = False
            self._keep(chunk[i : i + 1])
            i += 1
        end = _STRING_RUN.match(chunk, i).end()  # type: ignore[union-attr]
        self._keep(chunk[i:end])
        if end == len(chunk):
            return end
        if chunk[end] == _BACKSLASH:  # the chunk ends inside an escape
            self._escaped = True
            self._keep(b"\\")
            return end + 1
        self._in_string = False
        if self._key is not None:
            if len(self._key) <= _KEY_LIMIT and _is_model_key(bytes(self._key)):
                self._named = True
            self._key = None
        return end + 1

    def _keep(self, part: bytes) -> None:
        if self._key is not None and len(self._key) <= _KEY_LIMIT:
            self._key += part[: _KEY_LIMIT + 1 - len(self._key)]


def wants_model(method: str, path: str, content_type: str, content_encoding: str | None) -> bool:
    """Whether a request's body is one the gate names the model in: a native `/generate` (the
    one serving route smg refuses without a model; the OpenAI routes require one of clients, as
    OpenAI does), a JSON body smg will read (axum's JSON types), not compressed."""
    json_type = content_type == "application/json" or (
        content_type.startswith("application/") and content_type.endswith("+json")
    )
    identity = content_encoding is None or content_encoding.strip().lower() in ("", "identity")
    return method.upper() == "POST" and path == c.GENERATE_PATH and json_type and identity

"""What the synthetic engine puts in KV pages, and how decode checks what it received.

Every byte is a pure function of the request (its bootstrap_room and its prompt), the
buffer (layer x K/V) and the page's position in the request, so decode can recompute
and compare every page and every aux byte without any other channel. Stale bytes from
another request, a page landing at the wrong place or a torn write all fail the check.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pdwarden_runtime.transfer.kvpool import KVPool

_MASK61 = (1 << 61) - 1
_WORD_STEP = 2654435761  # word i of a page holds seed + i * step (no int64 overflow)
VOCAB = 32000


class BadRequest(ValueError):
    """A /generate body the synthetic engine cannot serve; the message says why."""


@dataclass(frozen=True)
class RequestSpec:
    room: int
    tokens: int
    pages: int
    max_new_tokens: int
    digest: int

    @classmethod
    def from_body(cls, body: Any, page_size_tokens: int, max_pages: int) -> RequestSpec:
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        room = body.get("bootstrap_room")
        if isinstance(room, list):
            raise BadRequest("batched requests (list bootstrap_room) are not supported")
        if not isinstance(room, int) or isinstance(room, bool) or room < 0:
            raise BadRequest(f"bootstrap_room must be a non-negative integer, got {room!r}")
        prompt = body.get("input_ids")
        if prompt is not None:
            if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
                raise BadRequest("input_ids must be a list of integers")
            raw = np.asarray(prompt, dtype=np.int64).tobytes()
            tokens = len(prompt)
        else:
            text = body.get("text", "")
            if not isinstance(text, str):
                raise BadRequest("text must be a string (batched requests are not supported)")
            raw = text.encode()
            tokens = len(raw)  # the synthetic tokenizer: one token per byte
        if tokens == 0:
            raise BadRequest("empty prompt: give text or input_ids")
        sampling = body.get("sampling_params") or {}
        if not isinstance(sampling, dict):
            raise BadRequest("sampling_params must be an object")
        max_new = sampling.get("max_new_tokens", 16)
        if not isinstance(max_new, int) or max_new < 0 or max_new > 4096:
            raise BadRequest(f"max_new_tokens must be an integer in [0, 4096], got {max_new!r}")
        pages = math.ceil(tokens / page_size_tokens)
        if pages > max_pages:
            raise BadRequest(f"prompt needs {pages} KV pages, more than the pool's {max_pages}")
        return cls(room=room, tokens=tokens, pages=pages, max_new_tokens=max_new, digest=zlib.crc32(raw))


def _seeds(spec: RequestSpec, buffer: int, count: int) -> torch.Tensor:
    base = (spec.room * 0x9E3779B97F4A7C15 + spec.digest * 0x100000001B3 + buffer * 0xC2B2AE3D) & _MASK61
    idx = torch.arange(count, dtype=torch.int64)
    return (idx * 0x5851F42D + base) & _MASK61


def page_pattern(spec: RequestSpec, buffer: int, first: int, count: int, page_bytes: int) -> torch.Tensor:
    """The bytes of pages [first, first+count) of ``buffer`` for this request: (count, page_bytes)."""
    words = page_bytes // 8
    seeds = _seeds(spec, buffer, first + count)[first:]
    grid = seeds[:, None] + torch.arange(words, dtype=torch.int64)[None, :] * _WORD_STEP
    return grid.view(torch.uint8).reshape(count, words * 8)


def aux_pattern(spec: RequestSpec, aux_bytes: int) -> torch.Tensor:
    head = np.array([spec.room & ((1 << 63) - 1), spec.pages, spec.digest], dtype=np.int64).tobytes()
    body = bytes((spec.room + i * 31) & 0xFF for i in range(max(0, aux_bytes - len(head))))
    return torch.frombuffer(bytearray((head + body)[:aux_bytes]), dtype=torch.uint8)


def fill(pool: KVPool, spec: RequestSpec, pages: np.ndarray, first: int, aux_slot: int | None) -> None:
    """Prefill: write the request's pages [first, first+len(pages)) (and its aux slot)."""
    s = pool.shape
    index = torch.from_numpy(np.ascontiguousarray(pages, dtype=np.int64))
    for buffer in range(s.buffers):
        view = pool.buffers[buffer].view(s.pages, s.page_bytes)
        view.index_copy_(0, index, page_pattern(spec, buffer, first, len(pages), s.page_bytes))
    if aux_slot is not None:
        pool.aux_view(aux_slot).copy_(aux_pattern(spec, s.aux_bytes))


def verify(pool: KVPool, spec: RequestSpec, pages: np.ndarray, aux_slot: int) -> list[str]:
    """Decode: compare every received byte; return what differs (empty: all equal)."""
    return verify_pages(pool, spec, pages, aux_slot)[0]


def verify_pages(pool: KVPool, spec: RequestSpec, pages: np.ndarray, aux_slot: int) -> tuple[list[str], int]:
    """``verify`` plus the number of corrupted pages (a page bad in any buffer counts
    once; a bad aux slot counts as one)."""
    s = pool.shape
    index = torch.from_numpy(np.ascontiguousarray(pages, dtype=np.int64))
    problems = []
    bad_pages: set[int] = set()
    for buffer in range(s.buffers):
        got = pool.buffers[buffer].view(s.pages, s.page_bytes).index_select(0, index)
        want = page_pattern(spec, buffer, 0, len(pages), s.page_bytes)
        if not torch.equal(got, want):
            bad = (got != want).any(dim=1).nonzero().flatten().tolist()
            bad_pages.update(bad)
            problems.append(f"buffer {buffer}: pages {bad[:8]} differ")
    corrupted = len(bad_pages)
    if not torch.equal(pool.aux_view(aux_slot), aux_pattern(spec, s.aux_bytes)):
        problems.append("aux slot differs")
        corrupted += 1
    return problems, corrupted


def output_ids(spec: RequestSpec) -> list[int]:
    """The synthetic answer: deterministic token ids for the request."""
    seed = (spec.room ^ spec.digest) & 0xFFFFFFFF
    return [int((seed + k * 7919) % VOCAB) for k in range(spec.max_new_tokens)]


def output_text(ids: list[int]) -> str:
    return "".join(f" t{token}" for token in ids)

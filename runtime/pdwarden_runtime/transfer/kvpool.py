"""A KV pool of plain torch tensors (CPU DRAM), shaped the way SGLang's KVArgs describe it.

``layers`` layers, each with a K and a V buffer of ``pages`` pages of ``page_bytes``
bytes, plus one aux buffer with ``pages`` slots of ``aux_bytes`` (SGLang's metadata
buffer). The buffers are registered with NIXL by SGLang's own KV manager
(``register_buffer_to_engine``); the pool hands out page indices.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class PoolShape:
    layers: int = 4
    pages: int = 1024
    page_bytes: int = 16 * 1024
    aux_slots: int = 256
    aux_bytes: int = 64
    page_size_tokens: int = 16

    def __post_init__(self) -> None:
        for name in ("layers", "pages", "page_bytes", "aux_slots", "aux_bytes", "page_size_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"KV pool {name} must be > 0, got {getattr(self, name)}")
        if self.page_bytes % 8:
            raise ValueError(f"KV pool page_bytes must be a multiple of 8, got {self.page_bytes}")

    @property
    def buffers(self) -> int:
        return 2 * self.layers

    @property
    def bytes_per_page_all_layers(self) -> int:
        return self.buffers * self.page_bytes


class PagesExhausted(RuntimeError):
    """Not enough free pages or aux slots for a request."""


class _Allocator:
    def __init__(self, count: int, what: str) -> None:
        self._free = list(range(count - 1, -1, -1))
        self._count = count
        self._what = what
        self._lock = threading.Lock()

    def take(self, n: int) -> np.ndarray:
        with self._lock:
            if n > len(self._free):
                raise PagesExhausted(f"need {n} {self._what}, {len(self._free)} of {self._count} free")
            got = [self._free.pop() for _ in range(n)]
        return np.array(got, dtype=np.int32)

    def give(self, items: Any) -> None:
        with self._lock:
            self._free.extend(int(i) for i in items)

    @property
    def free(self) -> int:
        return len(self._free)


class KVPool:
    """The tensors, their KVArgs, and page/aux-slot allocators."""

    def __init__(self, shape: PoolShape) -> None:
        self.shape = shape
        self.buffers = [
            torch.zeros(shape.pages * shape.page_bytes, dtype=torch.uint8) for _ in range(shape.buffers)
        ]
        self.aux = torch.zeros(shape.aux_slots * shape.aux_bytes, dtype=torch.uint8)
        self._pages = _Allocator(shape.pages, "KV pages")
        self._aux = _Allocator(shape.aux_slots, "aux slots")

    def kv_args(self) -> Any:
        """SGLang's KVArgs for this pool (memory kind DRAM: NIXL moves host memory)."""
        from sglang.srt.disaggregation.base.conn import KVArgs  # heavy: only where used

        s = self.shape
        args = KVArgs()
        args.engine_rank = 0
        args.kv_data_ptrs = [b.data_ptr() for b in self.buffers]
        args.kv_data_lens = [b.numel() for b in self.buffers]
        args.kv_item_lens = [s.page_bytes] * s.buffers
        args.kv_layer_ids = [i % s.layers for i in range(s.buffers)]
        args.kv_cache_dtype_str = "bfloat16"
        args.kv_data_mem_kinds = ["DRAM"] * s.buffers  # type: ignore[attr-defined]
        args.aux_data_ptrs = [self.aux.data_ptr()]
        args.aux_data_lens = [self.aux.numel()]
        args.aux_item_lens = [s.aux_bytes]
        args.state_types, args.state_data_ptrs, args.state_data_lens = [], [], []
        args.state_item_lens, args.state_layer_ids, args.state_dim_per_tensor = [], [], []
        args.ib_device, args.gpu_id, args.page_size, args.system_dp_rank = "", 0, s.page_size_tokens, 0
        args.pp_rank, args.prefill_start_layer, args.prefill_end_layer = 0, 0, None
        args.rust_http_port = None
        return args

    # --- allocation ------------------------------------------------------------------
    def take_pages(self, n: int) -> np.ndarray:
        return self._pages.take(n)

    def give_pages(self, pages: Any) -> None:
        self._pages.give(pages)

    def take_aux(self) -> int:
        return int(self._aux.take(1)[0])

    def give_aux(self, slot: int) -> None:
        self._aux.give([slot])

    @property
    def free_pages(self) -> int:
        return self._pages.free

    @property
    def free_aux(self) -> int:
        return self._aux.free

    # --- views -----------------------------------------------------------------------
    def page_view(self, buffer: int, page: int) -> torch.Tensor:
        b = self.shape.page_bytes
        return self.buffers[buffer][page * b : (page + 1) * b]

    def aux_view(self, slot: int) -> torch.Tensor:
        b = self.shape.aux_bytes
        return self.aux[slot * b : (slot + 1) * b]

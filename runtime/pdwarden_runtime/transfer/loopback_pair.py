"""A loopback prefill/decode pair on SGLang's real NIXL classes, in one process.

A prefill and a decode KV manager (each with its own NIXL agent, memory and threads, talking
over loopback ZMQ/UCX as two pods would) and SGLang's bootstrap server, with pdwarden's
hardening installed as `config` says. The doctor (``sglang_boot/behaviour.py``) drives rooms
through it to prove the installed hardening behaves; the tests' transfer scenarios use it too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from pdwarden_runtime.hardening import HardeningConfig, install
from pdwarden_runtime.kvpoll import KVPoll
from pdwarden_runtime.transfer import nixl_progress
from pdwarden_runtime.transfer.context import publish_sglang_context
from pdwarden_runtime.transfer.kvpool import KVPool, PoolShape

HOST = "127.0.0.1"


class Pair:
    """A hardened prefill manager, a hardened decode manager, and SGLang's bootstrap server."""

    def __init__(self, port: int, config: HardeningConfig) -> None:
        install(config)
        publish_sglang_context(host=HOST, bootstrap_port=port)
        nixl_progress.install()
        from sglang.srt.disaggregation.utils import (
            DisaggregationMode,
            KVClassType,
            TransferBackend,
            get_kv_class,
        )

        def cls(kind: Any) -> Any:
            return get_kv_class(TransferBackend.NIXL, kind)

        self.sender_cls = cls(KVClassType.SENDER)
        self.receiver_cls = cls(KVClassType.RECEIVER)
        self.boot = cls(KVClassType.BOOTSTRAP_SERVER)(host=HOST, port=port)
        shape = PoolShape(layers=2, pages=256, page_bytes=4096)
        self.p_pool, self.d_pool = KVPool(shape), KVPool(shape)
        self.prefill = cls(KVClassType.MANAGER)(self.p_pool.kv_args(), DisaggregationMode.PREFILL, None)
        self.decode = cls(KVClassType.MANAGER)(self.d_pool.kv_args(), DisaggregationMode.DECODE, None)
        self.addr = f"{HOST}:{port}"
        deadline = time.time() + 30
        while not self.decode.try_ensure_parallel_info(self.addr):
            if time.time() > deadline:
                raise RuntimeError("decode never saw the prefill's bootstrap info")
            time.sleep(0.1)
        self.config = config

    def open_room(self, room: int, pages: int) -> tuple[Any, Any, np.ndarray]:
        recv = self.receiver_cls(self.decode, self.addr, room)
        recv.init(prefill_dp_rank=0)
        sender = self.sender_cls(self.prefill, self.addr, room)
        dst = self.d_pool.take_pages(pages)
        recv.send_metadata(dst, aux_index=room % 64)
        poll_until(lambda: sender.poll() != KVPoll.Bootstrapping, 10)
        sender.init(pages, aux_index=room % 64)
        return sender, recv, dst

    def rooms_summary(self) -> dict[str, Any]:
        rt = self.prefill.pdwarden
        return {
            "prefill_rooms": {str(r): KVPoll(s).name for r, s in rt.table.snapshot().items()},
            "decode_rooms": {
                str(r): KVPoll(s).name for r, s in self.decode.pdwarden.table.snapshot().items()
            },
            "refused": {f"{getattr(a, 'name', a)}->{b.name}": n for (a, b), n in rt.table.refused().items()},
            "outcomes": {k: v for k, v in rt.tracker.outcomes().items() if v},
            "transfer_infos": len(self.prefill.transfer_infos),
            "staging_outstanding": len(self.prefill._staging_outstanding),
            "handle_deadlines": rt.handle_deadlines,
            "failure_notices": rt.failure_notices,
            "skips_concluded": rt.silent_skips_concluded,
        }


def poll_until(predicate: Callable[[], bool], timeout: float) -> bool:
    """Poll `predicate` until it holds or `timeout` seconds pass; whether it held."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def terminal(value: Any) -> bool:
    return int(value) in (KVPoll.Success, KVPoll.Failed)

"""Publish SGLang's runtime context in a process that is not an SGLang server.

SGLang's disaggregation classes read their settings (host, bootstrap port, device,
parallel ranks) from ``sglang.srt.runtime_context``. A real SGLang scheduler publishes it
at start-up; the synthetic engine and the in-process tests publish a minimal one through
SGLang's own ``override_server_args`` and ``override_permanently`` APIs, nothing patched.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Final

# SGLang's defaults are 300 s; the synthetic engine has its own deadlines.
_ENV_DEFAULTS: Final = {
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "300",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "300",
}

_lock = threading.Lock()
_published: dict[str, Any] | None = None


def publish_sglang_context(
    *, host: str, bootstrap_port: int, http_port: int = 30000, chunked_prefill_size: int = 8192
) -> None:
    """Make SGLang's runtime context describe one CPU rank (TP/DP/PP/CP = 1) serving on
    ``host`` with its KV bootstrap server on ``bootstrap_port``. Idempotent for the same
    settings; different settings in one process are an error (SGLang's context is
    process-wide)."""
    global _published
    settings = {
        "host": host,
        "bootstrap_port": bootstrap_port,
        "http_port": http_port,
        "chunked_prefill_size": chunked_prefill_size,
    }
    with _lock:
        if _published is not None:
            if _published != settings:
                raise RuntimeError(
                    f"SGLang's runtime context is already published as {_published}, "
                    f"cannot republish as {settings} in one process"
                )
            return
        for name, value in _ENV_DEFAULTS.items():
            os.environ.setdefault(name, value)
        # SGLang binds each KV manager's ZMQ socket on this address (else a NIC address;
        # pdwarden's processes stay on the address they serve on, loopback in tests).
        os.environ.setdefault("SGLANG_HOST_IP", host)
        from sglang.srt.runtime_context import get_context, get_parallel

        get_context().override_server_args(
            host=host,
            port=http_port,
            device="cpu",
            disaggregation_bootstrap_port=bootstrap_port,
            disaggregation_transfer_backend="nixl",
            chunked_prefill_size=chunked_prefill_size,
        ).install()
        get_parallel().override_permanently(
            attn_tp_rank=0,
            attn_cp_rank=0,
            attn_dcp_rank=0,
            attn_dp_rank=0,
            pp_group=None,
            world_group=None,
        )
        _published = settings

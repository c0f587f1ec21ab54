"""`pdwarden bench side-channel`: what the PD side channel's proof costs per message.

Three messages in SGLang 0.5.23's NIXL layout, at a 64-layer model's sizes: a decode's
registration (once per decode and prefill rank: 25 frames, 8 KiB of agent metadata, 128 KV
base pointers), a room's transfer info (once per request: 256 page indices, a 4,096-token
prompt in 16-token pages) and a KV_STATUS (once or twice per request: 4 small frames). For
each, the microseconds to sign it (the sender) and to verify it (the receiver), and for the
two the prefill's bootstrap thread reads, its shape check (SGLang's own parsers, run once
more before the thread sees the message). The median of ``--rounds`` rounds of ``--n``
messages each. Prints one JSON line last.
"""

from __future__ import annotations

import json
import statistics
import struct
import time
from collections.abc import Callable
from typing import Any, Final

import click

from pdwarden_runtime.hardening.side_channel import SideKey

GUARD: Final = b"NixlMsgGuard"
LAYERS: Final = 64
PAGES: Final = 256


def registration() -> list[bytes]:
    ptrs = struct.pack(f"{2 * LAYERS}Q", *range(0x10000, 0x10000 + 2 * LAYERS))
    return [
        GUARD,
        b"None",
        b"198.18.34.56",
        b"40123",
        b"decode-agent-0123456789abcdef",
        bytes(8192),  # NIXL agent metadata
        ptrs,
        struct.pack("Q", 0x20000),
        b"",
        b"0",
        b"1",
        b"0",
        b"65536",
        b"",
        b"",
        b"",
        b"",
        b"4096",
        ",".join(["DRAM"] * 2 * LAYERS).encode(),  # KV memory kinds
        struct.pack(f"{2 * LAYERS}Q", *([65536] * 2 * LAYERS)),
        b"",
        struct.pack(f"{2 * LAYERS}I", *range(2 * LAYERS)),
        b"1",
        b"0",
        b"",
    ]


def transfer_info() -> list[bytes]:
    indices = struct.pack(f"{PAGES}i", *range(PAGES))
    agent = b"decode-agent-0123456789abcdef"
    return [
        GUARD,
        b"4611686018427387904",
        b"198.18.34.56",
        b"40123",
        agent,
        indices,
        b"17",
        b"1",
        b"",
        b"0",
        b"0",
    ]


def kv_status() -> list[bytes]:
    return [b"4611686018427387904", b"4", b"0", b""]


def _per_op_us(op: Callable[[], object], n: int, rounds: int) -> float:
    figures = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            op()
        figures.append((time.perf_counter() - t0) / n * 1e6)
    return round(statistics.median(figures), 3)


def measure(n: int, rounds: int) -> dict[str, Any]:
    from pdwarden_runtime.hardening.side_frames import prefill_message_problem

    key = SideKey.derive("k" * 43)
    result: dict[str, Any] = {"benchmark": "side-channel", "n": n, "rounds": rounds}
    for name, frames, checked in (
        ("registration", registration(), True),
        ("transfer_info", transfer_info(), True),
        ("kv_status", kv_status(), False),
    ):
        signed = key.sign(frames)
        assert key.verify(signed) == frames
        figures: dict[str, Any] = {
            "frames": len(frames),
            "bytes": sum(len(f) for f in frames),
            "sign_us": _per_op_us(lambda f=frames: key.sign(f), n, rounds),  # type: ignore[misc]
            "verify_us": _per_op_us(lambda s=signed: key.verify(s), n, rounds),  # type: ignore[misc]
        }
        if checked:
            assert prefill_message_problem(frames) is None
            figures["shape_check_us"] = _per_op_us(lambda f=frames: prefill_message_problem(f), n, rounds)  # type: ignore[misc]
        result[name] = figures
    return result


@click.command("side-channel")
@click.option("--n", type=click.IntRange(1), default=20000, show_default=True, help="Messages per round.")
@click.option(
    "--rounds", type=click.IntRange(1), default=5, show_default=True, help="Rounds; the median is reported."
)
def side_channel(n: int, rounds: int) -> None:
    """Per-message cost of signing and verifying the PD side channel (one JSON line last)."""
    click.echo(json.dumps(measure(n, rounds), sort_keys=True))

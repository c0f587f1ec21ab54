"""What the prefill's NIXL bootstrap thread may see, checked with SGLang 0.5.23's own parsers (in
process): messages they take pass; anything that would make the thread raise (the GUARD assert,
a parse error) is named."""

from __future__ import annotations

import struct

import pytest

from pdwarden_bench.side_channel import registration, transfer_info
from pdwarden_runtime.hardening.side_frames import prefill_message_problem

pytestmark = pytest.mark.integration  # imports SGLang (its parsers)

GUARD = b"NixlMsgGuard"


@pytest.mark.parametrize(
    "frames",
    [
        pytest.param(registration(), id="registration"),
        pytest.param(transfer_info(), id="transfer-info"),
        pytest.param([b"ABORT", b"42"], id="abort"),
        pytest.param([b"ABORT", b"not-a-room"], id="abort-sglang-parses-leniently"),
        pytest.param([b"WATERMARK", b"1", b"2", b"s"], id="staging-watermark"),
    ],
)
def test_messages_sglangs_thread_takes_pass(frames: list[bytes]) -> None:
    assert prefill_message_problem(frames) is None


@pytest.mark.parametrize(
    ("frames", "why"),
    [
        pytest.param([b"x"], "unknown message tag", id="one-bare-frame"),
        pytest.param([], "empty", id="empty"),
        pytest.param([b"BOOTSTRAP", b"1", b"h", b"2"], "unknown message tag", id="other-tag"),
        pytest.param([GUARD], "fewer than", id="guard-alone"),
        pytest.param([GUARD, b"1", b"h", b"2"], "fewer than", id="no-agent-name"),
        pytest.param([GUARD, b"room", b"h", b"2", b"agent"], "transfer info", id="room-not-a-number"),
        pytest.param([GUARD, b"\xff", b"h", b"2", b"agent"], "transfer info", id="room-not-ascii"),
        pytest.param([GUARD, b"1", b"h", b"2", b"\xff"], "transfer info", id="agent-not-ascii"),
        pytest.param([*transfer_info()[:5], b"123", *transfer_info()[6:]], "transfer info", id="indices-cut"),
        pytest.param(
            [*transfer_info()[:6], b"x", *transfer_info()[7:]], "transfer info", id="aux-not-a-number"
        ),
        pytest.param(
            [*registration()[:6], b"\0" * 9, *registration()[7:]], "registration", id="pointers-cut"
        ),
        pytest.param(registration()[:8], "registration", id="registration-cut-short"),
        pytest.param(
            [*registration()[:19], struct.pack("Q", 1), *registration()[20:]],
            "registration",
            id="item-lens-mismatch",
        ),
    ],
)
def test_what_would_end_sglangs_thread_is_named(frames: list[bytes], why: str) -> None:
    problem = prefill_message_problem(frames)
    assert problem is not None and why in problem

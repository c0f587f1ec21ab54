"""The status of a request whose room ended Failed: 503 where the runtime's deadline ended it
(smg retries it on another pair), SGLang's 500 otherwise."""

from __future__ import annotations

import pytest

from pdwarden_runtime.engines.synthetic import (
    DEADLINE_STATUS,
    KV_FAILED_STATUS,
    RequestFailed,
    failed_room_status,
)
from pdwarden_runtime.hardening.deadline_guard import REASON_INFLIGHT_DEADLINE
from pdwarden_runtime.hardening.handle_wait import REASON_HANDLE_DEADLINE
from pdwarden_runtime.hardening.transfer_guard import REASON_PEER_STALLED

pytestmark = pytest.mark.unit


def test_the_runtimes_deadlines_answer_503() -> None:
    for reason in (
        REASON_INFLIGHT_DEADLINE.format(15.0),
        REASON_HANDLE_DEADLINE.format(10.0),
        REASON_PEER_STALLED.format("agent-1"),
    ):
        assert failed_room_status(reason) == DEADLINE_STATUS == 503, reason
        assert RequestFailed.room(reason).status == 503


def test_other_kv_failures_answer_sglangs_500() -> None:
    for reason in ("KV transfer failed", "Aborted by decode before this prefill opened the room", ""):
        assert failed_room_status(reason) == KV_FAILED_STATUS == 500, reason
    assert RequestFailed("x").status == 500

"""`pdwarden bench cancellations`' pure parts: the seeded plans (the streaming arm's among them),
what counts as hung, decode's hang-up counters over a run, the arms' order; the JSON keys its
docstring names. And the streamed clients' reading of server-sent events (`pdwarden_bench.streams`)."""

from __future__ import annotations

import pytest

import pdwarden_bench.cancellations as cancellations
from pdwarden_bench.cancellations import (
    ARM_CANCELLING,
    ARM_CONTROL,
    ARM_STREAMING,
    CANCELLED,
    OK,
    STREAM_TAIL_TOKENS,
    TIMED_OUT,
    PlannedRequest,
    PlannedStream,
    Result,
    Workload,
    arms,
    counters_moved,
    decode_counters,
    hung,
    plan,
    plan_streams,
    stream_figures,
)
from pdwarden_bench.streams import (
    SYNTHETIC_MODEL,
    carries_content,
    chat_body,
    event_data,
    first_token_and_gaps,
)

pytestmark = pytest.mark.unit

WORKLOAD = Workload(requests=200, cancel_fraction=0.3, max_new_tokens=64, seed=5)


def test_the_streaming_arm_streams_the_cancelling_arm_s_prompts_and_hangs_up_where_it_cancels() -> None:
    requests = plan(WORKLOAD, cancelling=True)
    planned = plan_streams(WORKLOAD, hangup_after_events=3)
    assert [s.chars for s in planned] == [r.chars for r in requests]
    assert [s.cancels for s in planned] == [r.cancels for r in requests]
    assert 20 < sum(s.cancels for s in planned) < 100  # about 30 % of 200
    for stream, request in zip(planned, requests, strict=True):
        if stream.cancels:
            assert stream.hangup_after_events == 3
            assert stream.max_new_tokens == max(request.max_new_tokens, 3 + STREAM_TAIL_TOKENS)
        else:
            assert stream.hangup_after_events is None
            assert stream.max_new_tokens == request.max_new_tokens


def test_a_round_s_streams_are_the_slice_of_the_whole_plan() -> None:
    whole = plan_streams(WORKLOAD, 4)
    assert plan_streams(WORKLOAD, 4, count=50, offset=100) == whole[100:150]
    assert plan_streams(WORKLOAD, 4) != plan_streams(Workload(requests=200, seed=6), 4)


def test_only_a_client_that_waited_can_hang() -> None:
    waited = PlannedRequest(10, 4, None)
    cancelled = PlannedRequest(10, 4, 0.05)
    read_to_end = PlannedStream(10, 4, None)
    hung_up = PlannedStream(10, 40, 3)
    results = [
        Result(waited, OK, 1.0),
        Result(waited, OK, 31.0),  # answered, but after the deadline
        Result(waited, TIMED_OUT, 5.0),
        Result(cancelled, CANCELLED, 0.05),
        Result(read_to_end, OK, 2.0),
        Result(read_to_end, TIMED_OUT, 120.0),
        Result(hung_up, CANCELLED, 0.1),
        Result(hung_up, TIMED_OUT, 120.0),  # its own client left: never hung by the system
    ]
    assert hung(results, within=30.0) == 3


def test_decode_counters_sum_over_decodes_and_move_by_the_run() -> None:
    before = decode_counters(
        [{"hangups": 1, "tokens_after_hangup": 0, "tokens_produced": 10}, {"tokens_produced": 5}]
    )
    assert before == {"hangups": 1, "tokens_after_hangup": 0, "tokens_produced": 15}
    after = decode_counters(
        [
            {"hangups": 4, "tokens_after_hangup": 1, "tokens_produced": 90},
            {"hangups": 2, "tokens_after_hangup": None, "tokens_produced": 25},
        ]
    )
    assert counters_moved(before, after) == {"hangups": 5, "tokens_after_hangup": 1, "tokens_produced": 100}


def test_the_arms_alternate_and_streaming_is_only_there_when_asked() -> None:
    assert arms(False) == [ARM_CANCELLING, ARM_CONTROL]
    assert arms(True) == [ARM_CANCELLING, ARM_CONTROL, ARM_STREAMING]


def test_stream_figures_count_hang_ups_apart_from_failures() -> None:
    results = [
        Result(PlannedStream(5, 8, None), OK, 0.5),
        Result(PlannedStream(5, 8, None), OK, 1.5),
        Result(PlannedStream(5, 40, 3), CANCELLED, 0.1),
        Result(PlannedStream(5, 8, None), cancellations.FAILED, 0.2, 503, "no_available_workers"),
        Result(PlannedStream(5, 40, 3), cancellations.FAILED, 0.2, 503, "before its events"),
    ]
    assert stream_figures(results, within=30.0, hangup_events=3) == {
        "requests": 5,
        "hung_up": 1,
        "ok": 2,
        "failed": 1,  # a client that meant to hang up and failed first is not a failure of the system
        "hung": 0,
        "p99_ok_seconds": 1.5,
        "hangup_after_events": 3,
    }


def test_the_docstring_names_every_json_key() -> None:
    keys = [
        "requests", "cancelled", "ok", "failed", "hung", "failed_why", "p99_ok_seconds", "control_ok",
        "control_hung", "control_p99_ok_seconds", "p99_over_control", "rooms_left_after_settle",
        "requests_left_after_settle", "abandoned_rooms_max", "waiting_on_peer_max", "remediations",
        "tokens_after_hangup", "decode_hangups", "tokens_produced", "token_interval_ms", "stream",
        "router", "prefills", "decodes", "seconds",
    ]  # fmt: skip
    keys += list(stream_figures([], 1.0, 3))
    doc = " ".join((cancellations.__doc__ or "").split())
    for key in keys:
        assert f"``{key}``" in doc, key


def test_a_chat_body_streams_one_message() -> None:
    body = chat_body("hi", 7)
    assert body["stream"] is True and body["max_tokens"] == 7 and body["model"] == SYNTHETIC_MODEL
    assert body["messages"] == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("line", "data"),
    [
        (b'data: {"a":1}\n', b'{"a":1}'),
        (b"data:[DONE]\r\n", b"[DONE]"),
        (b"\n", None),
        (b": keep-alive\n", None),
        (b"event: error\n", None),
    ],
)
def test_event_data_is_a_data_line_s_payload(line: bytes, data: bytes | None) -> None:
    assert event_data(line) == data


def test_only_a_chunk_with_text_is_a_token() -> None:
    role = {"choices": [{"delta": {"role": "assistant", "content": ""}}]}
    token = {"choices": [{"delta": {"content": " t1"}}]}
    finish = {"choices": [{"delta": {"reasoning_content": None}, "finish_reason": "length"}]}
    usage = {"choices": [], "usage": {"completion_tokens": 3}}
    assert [carries_content(e) for e in (role, token, finish, usage, "x", None)] == [
        False,
        True,
        False,
        False,
        False,
        False,
    ]


def test_first_token_and_gaps() -> None:
    first, gaps = first_token_and_gaps([0.25, 0.5, 0.5, 1.0])
    assert first == 0.25 and gaps == [0.25, 0.0, 0.5]
    assert first_token_and_gaps([0.3]) == (0.3, [])
    assert first_token_and_gaps([]) == (None, [])

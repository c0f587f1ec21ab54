"""Decode refuses a writer before publishing pages to it (pure parts): the held-pages bound's
decision, its configuration and report, and the proof of the bootstrap server's answer that
the decode's route fetch checks."""

from __future__ import annotations

import json

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

import pdwarden_contract as c
from pdwarden_runtime.hardening.bootstrap_guard import (
    ANSWER_PROOF_HEADER,
    ROUTE_PATH,
    UnprovenRouteAnswer,
    answer_check,
    route_answer_proof,
    route_read_proof,
)
from pdwarden_runtime.hardening.config import (
    DEFAULT_HELD_PAGES_PER_WRITER,
    ENV_HELD_PAGES_PER_WRITER,
    ConfigError,
    HardeningConfig,
)
from pdwarden_runtime.hardening.held_pages import HeldPages
from pdwarden_runtime.hardening.side_channel import SideKey, SideKeys
from pdwarden_runtime.hardening.writer_bound import (
    WriterRefusals,
    held_pages_bound,
    over_bound,
    over_bound_reason,
)
from pdwarden_runtime.inflight import InflightTracker
from pdwarden_runtime.metrics import RuntimeMetrics
from pdwarden_runtime.status import RoomStatusTable
from tests.support.runtime_metrics import FakeClock

pytestmark = pytest.mark.unit

KEY = SideKey.derive("k" * 43)
OTHER = SideKey.derive("o" * 43)
KEYS, OTHER_KEYS = SideKeys(KEY), SideKeys(OTHER)
ADDR = "198.18.0.5:8998"
RANK_URL = f"http://{ADDR}/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"
SUMMARY_URL = f"http://{ADDR}/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
ANSWER = json.dumps({"rank_ip": "198.18.0.5", "rank_port": 40000}).encode()


# --- the bound ---------------------------------------------------------------------------
def test_the_bound_is_a_share_of_the_pool_and_only_exceeding_it_refuses() -> None:
    assert held_pages_bound(1024, 0.25) == 256
    assert not over_bound(256, 1024, 0.25)
    assert over_bound(257, 1024, 0.25)
    assert over_bound(2, 5, 0.25)  # a share of a tiny pool is still at least one page
    assert not over_bound(1, 5, 0.25)
    assert held_pages_bound(1024, 1.0) == 1024 and not over_bound(1024, 1024, 1.0)


def test_without_a_known_pool_size_there_is_no_bound() -> None:
    assert held_pages_bound(None, 0.25) is None and held_pages_bound(0, 0.25) is None
    assert not over_bound(10**9, None, 0.25)


def test_the_refusal_reason_names_the_writer_and_the_figures() -> None:
    reason = over_bound_reason("198.18.0.5", 300, 1024, 0.25)
    assert "198.18.0.5" in reason and "300" in reason and "256 of 1024" in reason


def test_pages_for_counts_only_held_rooms_of_that_writer() -> None:
    held = HeldPages(FakeClock())
    held.published(1, "198.18.0.5", ADDR, 8)
    held.published(2, "198.18.0.5", ADDR, 3)
    held.published(3, "198.18.0.6", "198.18.0.6:8998", 4)
    assert held.pages_for("198.18.0.5") == 0  # published, request alive: not held
    held.hold(1)
    held.hold(3)
    assert held.pages_for("198.18.0.5") == 8 and held.pages_for("198.18.0.6") == 4
    held.release(1)  # the writer drained
    assert held.pages_for("198.18.0.5") == 0


def test_the_share_is_configurable_and_must_be_a_share_of_the_pool() -> None:
    assert HardeningConfig().held_pages_per_writer == DEFAULT_HELD_PAGES_PER_WRITER == 0.25
    assert HardeningConfig.from_mapping({"held_pages_per_writer": "0.5"}).held_pages_per_writer == 0.5
    assert HardeningConfig.from_env({ENV_HELD_PAGES_PER_WRITER: "0.1"}).held_pages_per_writer == 0.1
    for bad in (0, -0.1, 1.5):
        with pytest.raises(ConfigError, match="held pages per writer"):
            HardeningConfig(held_pages_per_writer=bad)


def _refused(metrics: RuntimeMetrics) -> dict[tuple[str, str], float]:
    text = metrics.exposition()[0].decode()
    return {
        (s.labels[c.LABEL_METRIC_PEER], s.labels[c.LABEL_METRIC_REASON]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == c.METRIC_KV_WRITER_REFUSED_TOTAL
    }


def _metrics() -> RuntimeMetrics:
    table = RoomStatusTable()
    return RuntimeMetrics(
        c.ROLE_DECODE, table, InflightTracker(table), engine="synthetic", transfer_backend="nixl"
    )


def test_refusals_are_counted_by_writer_and_reason_and_logged_at_most_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    metrics = _metrics()
    refusals = WriterRefusals(metrics.count_writer_refused, clock=clock)
    with caplog.at_level("WARNING"):
        logged = [
            refusals.refused("198.18.0.5", c.WRITER_REFUSED_HELD_PAGES, "over"),
            refusals.refused("198.18.0.5", c.WRITER_REFUSED_HELD_PAGES, "over"),
            refusals.refused("198.18.0.9", c.WRITER_REFUSED_UNPROVEN_ROUTE, "unproven"),
        ]
        clock.now += 10
        logged.append(refusals.refused("198.18.0.5", c.WRITER_REFUSED_HELD_PAGES, "over again"))
    assert logged == [True, False, True, True]  # each reason has its own 10 s log
    assert "2 request(s) refused" in caplog.records[-1].getMessage()
    assert refusals.counts() == {c.WRITER_REFUSED_HELD_PAGES: 3, c.WRITER_REFUSED_UNPROVEN_ROUTE: 1}
    assert _refused(metrics) == {
        ("198.18.0.5", c.WRITER_REFUSED_HELD_PAGES): 3,
        ("198.18.0.9", c.WRITER_REFUSED_UNPROVEN_ROUTE): 1,
    }
    with pytest.raises(ValueError, match="unknown writer refusal reason"):
        refusals.refused("198.18.0.5", "because", "x")


def test_refused_writers_are_bounded_in_the_metric() -> None:
    metrics = _metrics()
    for i in range(40):  # a stranger may name any address
        metrics.count_writer_refused(f"198.18.1.{i}", c.WRITER_REFUSED_UNPROVEN_ROUTE)
    found = _refused(metrics)
    assert len(found) == 33
    assert found[(c.PEER_OTHER, c.WRITER_REFUSED_UNPROVEN_ROUTE)] == 8


# --- the answer's proof ------------------------------------------------------------------
def test_an_answers_proof_binds_its_body_and_key_and_is_never_a_requests() -> None:
    proof = route_answer_proof(KEY, ANSWER)
    assert proof != route_answer_proof(KEY, ANSWER.replace(b"40000", b"40001"))
    assert proof != route_answer_proof(OTHER, ANSWER)
    assert proof != KEY.http_proof("GET", ROUTE_PATH, ANSWER) and proof != route_read_proof(KEY)


def _response(url: str, body: bytes, proof: str | None, status: int = 200) -> requests.Response:
    response = requests.Response()
    response.status_code = status
    response._content = body
    if proof is not None:
        response.headers[ANSWER_PROOF_HEADER] = proof
    response.request = requests.Request("GET", url).prepare()
    return response


def test_the_answer_check_refuses_a_rank_answer_without_the_keys_proof() -> None:
    session = requests.Session()
    check = answer_check(session, KEYS)
    assert answer_check(session, KEYS) is check  # installed once per session
    assert session.hooks["response"].count(check) == 1
    check(_response(RANK_URL, ANSWER, route_answer_proof(KEY, ANSWER)))  # proven: passes
    assert not check.take_refusal()
    for proof in (None, route_answer_proof(OTHER, ANSWER), route_answer_proof(KEY, b"{}")):
        with pytest.raises(UnprovenRouteAnswer):
            check(_response(RANK_URL, ANSWER, proof))
        assert check.take_refusal() and not check.take_refusal()


def test_the_answer_check_leaves_the_summary_and_failed_answers_to_sglang() -> None:
    check = answer_check(requests.Session(), KEYS)
    check(_response(SUMMARY_URL, b'{"attn_tp_size": 1}', None))  # names no address
    check(_response(RANK_URL, b"not registered", None, status=503))  # SGLang fails it itself
    assert not check.take_refusal()


def test_a_check_for_another_key_is_replaced_not_added() -> None:
    session = requests.Session()
    first = answer_check(session, KEYS)
    second = answer_check(session, OTHER_KEYS)
    assert second is not first and session.hooks["response"] == [second]

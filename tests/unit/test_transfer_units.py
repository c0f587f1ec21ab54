"""Pure parts of the transfer runtime: hardening config, the room map and ledger, the
synthetic engine's request spec and KV pattern."""

from __future__ import annotations

import pytest

from pdwarden_runtime.hardening.config import (
    ALL_FIXES,
    BENCH_HARDENING_MODES,
    HARDENING_BENCH_STOCK_PROMPT_WAKE,
    HARDENING_MODES,
    NO_FIXES,
    ConfigError,
    FaultSwitch,
    Fix,
    HardeningConfig,
    config_for_mode,
    is_bench_mode,
    parse_fixes,
)
from pdwarden_runtime.hardening.mirror import wake_on_status_change
from pdwarden_runtime.hardening.rooms import RoomLedger, RoomStatusMap
from pdwarden_runtime.hardening.runtime import RoomRuntime
from pdwarden_runtime.kvpoll import KVPoll
from pdwarden_runtime.status import RoomStatusTable

pytestmark = pytest.mark.unit


def test_config_defaults_have_every_fix_and_no_fault() -> None:
    config = HardeningConfig()
    assert config.fixes == ALL_FIXES
    assert config.fault.active == "none"
    assert all(config.active_fixes().values())
    assert config.status_mode == "sticky"


def test_config_from_mapping_and_env() -> None:
    config = HardeningConfig.from_mapping(
        {
            "hardening": "off",
            "transfer_deadline": "2.5",
            "inflight_deadline": "off",
            "fault": "stall-transfers",
        }
    )
    assert config.fixes == NO_FIXES and config.stock_classes
    emulated = HardeningConfig.from_mapping({"hardening": "emulated-port"})
    assert emulated.fixes == NO_FIXES and emulated.status_mode == "legacy" and not emulated.stock_classes
    assert config.transfer_deadline == 2.5 and config.inflight_deadline is None
    assert config.fault.active == "stall-transfers"
    env = HardeningConfig.from_env(
        {"PDWARDEN_FIXES": "sticky_status,transfer_deadline", "PDWARDEN_TRANSFER_DEADLINE": "7"}
    )
    assert env.fixes == {Fix.STICKY_STATUS, Fix.TRANSFER_DEADLINE} and env.transfer_deadline == 7.0


def test_bench_stock_prompt_wake_mode_is_stock_classes_that_wake_at_once() -> None:
    mode = HARDENING_BENCH_STOCK_PROMPT_WAKE
    assert mode in BENCH_HARDENING_MODES and mode not in HARDENING_MODES
    assert is_bench_mode(mode) and not any(is_bench_mode(m) for m in HARDENING_MODES)
    for config in (config_for_mode(mode), HardeningConfig.from_mapping({"hardening": mode})):
        assert config.stock_classes and config.stock_prompt_wake and config.fixes == NO_FIXES
    for other in HARDENING_MODES:
        assert not config_for_mode(other).stock_prompt_wake
    assert config_for_mode("off").stock_classes and not HardeningConfig().stock_prompt_wake


class _StockManager:
    """The part of SGLang's stock manager wake_on_status_change relies on."""

    def __init__(self) -> None:
        self.request_status: dict[int, KVPoll] = {}
        self.writes = 0

    def update_status(self, bootstrap_room: int, status: KVPoll) -> None:
        self.writes += 1
        self.request_status[bootstrap_room] = max(self.request_status.get(bootstrap_room, status), status)


def test_wake_on_status_change_notifies_changed_writes_only() -> None:
    rt = RoomRuntime(HardeningConfig(inflight_deadline=None, stock_classes=True), "prefill")
    woken: list[int] = []
    rt.status_listeners.append(woken.append)
    mgr = _StockManager()
    wake_on_status_change(rt, mgr)
    mgr.update_status(7, KVPoll.WaitingForInput)
    mgr.update_status(7, KVPoll.Transferring)
    mgr.update_status(7, KVPoll.Transferring)  # the worker's per-chunk repeat
    mgr.update_status(7, KVPoll.Success)
    assert woken == [7, 7, 7] and mgr.writes == 4  # every write still reaches the manager
    assert mgr.request_status[7] is KVPoll.Success


@pytest.mark.parametrize(
    "values, message",
    [
        ({"fixes": "A,Z"}, "unknown hardening fix"),
        ({"transfer_deadline": "soon"}, "transfer_deadline must be a number"),
        ({"transfer_deadline": 0}, "transfer deadline must be > 0"),
        ({"fault": "meteor"}, "unknown fault"),
        ({"colour": "blue"}, "unknown hardening setting"),
        ({"hardening": "maybe"}, "hardening mode must be one of"),
    ],
)
def test_config_rejects_bad_input_by_name(values: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        HardeningConfig.from_mapping(values)


def test_env_errors_say_where_they_came_from() -> None:
    with pytest.raises(ConfigError, match="PDWARDEN_"):
        HardeningConfig.from_env({"PDWARDEN_TRANSFER_DEADLINE": "-1"})


def test_parse_fixes_forms() -> None:
    assert parse_fixes("all") == ALL_FIXES
    assert parse_fixes("none") == frozenset()
    assert parse_fixes(["sticky_status", "No_Silent_Skip"]) == {Fix.STICKY_STATUS, Fix.NO_SILENT_SKIP}
    assert HardeningConfig(fixes=frozenset({Fix.METRICS})).active_fixes() == {
        "sticky_status": False,
        "no_silent_skip": False,
        "transfer_deadline": False,
        "inflight_deadline": False,
        "metrics": True,
    }


@pytest.mark.parametrize("raw", ["A,C", ["B"], "sticky_status,typo"])
def test_an_unknown_fix_is_refused_with_the_known_names(raw: object) -> None:
    """Fixes go by their names only (no letters): a typo must not turn a fix off."""
    with pytest.raises(ConfigError, match=r"expected some of .*sticky_status"):
        parse_fixes(raw)


def test_fault_switch_changes_at_run_time_and_validates() -> None:
    fault = FaultSwitch()
    assert fault.set("drop-abort") == "drop-abort" and fault == "drop-abort"
    with pytest.raises(ConfigError):
        fault.set("nope")
    assert fault.active == "drop-abort"


def test_room_map_is_the_sticky_table_seen_as_a_dict() -> None:
    table = RoomStatusTable(mode="sticky")
    rooms = RoomStatusMap(table)
    rooms[7] = KVPoll.Bootstrapping
    rooms[7] = KVPoll.Failed
    rooms[7] = KVPoll.Transferring  # the resurrection: refused and counted
    assert rooms[7] == KVPoll.Failed and 7 in rooms and rooms.get(8, "x") == "x"
    assert table.refused() == {(KVPoll.Failed, KVPoll.Transferring): 1}
    assert rooms.pop(7) == KVPoll.Failed and 7 not in rooms
    assert rooms.pop(7, None) is None
    with pytest.raises(KeyError):
        rooms[7]
    rooms[7] = KVPoll.Transferring  # after clear: still refused, never an orphan room
    assert 7 not in rooms


def test_room_map_legacy_keeps_the_old_max_rule() -> None:
    rooms = RoomStatusMap(RoomStatusTable(mode="legacy"))
    rooms[1] = KVPoll.Bootstrapping
    rooms[1] = KVPoll.Failed
    rooms[1] = KVPoll.Transferring
    assert rooms[1] == KVPoll.Transferring


def test_ledger_tells_decode_once_and_only_when_no_chunk_is_in_flight() -> None:
    ledger = RoomLedger()
    ledger.remember_targets(5, [("127.0.0.1", 4000)])
    ledger.enqueued(5)
    ledger.dequeued(5)
    ledger.failed(5, "aborted")
    assert ledger.claim_failure_notice(5) is None  # a chunk is still on a worker
    assert ledger.chunk_done(5) is True
    assert ledger.claim_failure_notice(5) == ([("127.0.0.1", 4000)], "aborted")
    assert ledger.claim_failure_notice(5) is None  # once
    ledger.cleared(5)
    assert ledger.sizes()["targets"] == 0 and ledger.sizes()["failed"] == 0


def test_ledger_skips_a_room_decode_was_already_told_about() -> None:
    ledger = RoomLedger()
    ledger.remember_targets(9, [("h", 1)])
    ledger.told(9)
    ledger.failed(9, "x")
    assert ledger.claim_failure_notice(9) is None


def test_request_spec_validates_the_body() -> None:
    from pdwarden_runtime.engines.synthetic_pattern import BadRequest, RequestSpec

    spec = RequestSpec.from_body({"text": "a" * 33, "bootstrap_room": 3}, page_size_tokens=16, max_pages=10)
    assert (spec.tokens, spec.pages, spec.max_new_tokens) == (33, 3, 16)
    for body, message in [
        ({"text": "x"}, "bootstrap_room"),
        ({"bootstrap_room": 1}, "empty prompt"),
        ({"bootstrap_room": 1, "text": ["a"]}, "batched"),
        ({"bootstrap_room": 1, "text": "a" * 200}, "more than the pool"),
        ({"bootstrap_room": 1, "input_ids": [1, "2"]}, "input_ids"),
    ]:
        with pytest.raises(BadRequest, match=message):
            RequestSpec.from_body(body, page_size_tokens=16, max_pages=10)


def test_pattern_verify_catches_any_wrong_byte() -> None:
    from pdwarden_runtime.engines.synthetic_pattern import RequestSpec, fill, verify
    from pdwarden_runtime.transfer.kvpool import KVPool, PoolShape

    pool = KVPool(PoolShape(layers=1, pages=8, page_bytes=64, aux_slots=2, aux_bytes=32))
    spec = RequestSpec.from_body({"text": "hello world", "bootstrap_room": 11}, 4, 8)
    pages = pool.take_pages(spec.pages)
    fill(pool, spec, pages, 0, 1)
    assert verify(pool, spec, pages, 1) == []
    other = RequestSpec.from_body({"text": "hello world", "bootstrap_room": 12}, 4, 8)
    assert verify(pool, other, pages, 1)  # another room's bytes never pass
    pool.buffers[1].view(8, 64)[int(pages[1])][5] ^= 1
    assert verify(pool, spec, pages, 1) == ["buffer 1: pages [1] differ"]

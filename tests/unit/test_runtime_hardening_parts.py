"""Pure parts of the hardening added for stalled peers and dead threads: the handle
quarantine (with a fake NIXL state reader), the ledger's quarantine accounting, the thread
watch, and the new metric families."""

from __future__ import annotations

import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

import pdwarden_contract as c
from pdwarden_runtime.hardening.config import HardeningConfig
from pdwarden_runtime.hardening.quarantine import HandleQuarantine, is_disconnect
from pdwarden_runtime.hardening.rooms import RoomLedger
from pdwarden_runtime.hardening.runtime import RoomRuntime
from pdwarden_runtime.hardening.threads import ThreadWatch, kind_of
from pdwarden_runtime.kvpoll import KVPoll

pytestmark = pytest.mark.unit


class nixlRemoteDisconnectError(RuntimeError):  # NIXL's own class name
    pass


def test_quarantine_holds_until_every_handle_ends_and_reports_how() -> None:
    states = {"a": "PROC", "b": "PROC", "c": "PROC"}
    released: list[str] = []
    settled: list[int] = []
    done = threading.Event()

    def read(handle: str) -> str:
        if states[handle] == "GONE":
            raise nixlRemoteDisconnectError("peer disconnected")
        if states[handle] == "GARBLED":
            raise ValueError("cannot read")
        return states[handle]

    def on_settled(room: int) -> None:
        settled.append(room)
        done.set()

    q = HandleQuarantine(read, released.append, on_settled, poll_s=0.001)
    q.start()
    try:
        q.add(7, ["a", "b", "c"])
        assert q.holds(7) and q.count() == 3
        states["a"] = "DONE"
        states["b"] = "GARBLED"  # unreadable is not proof the write is over
        states["c"] = "GONE"
        assert not done.wait(0.2)
        assert q.holds(7) and q.count() == 1 and settled == []
        states["b"] = "ERR"
        assert done.wait(5)
    finally:
        q.stop()
    assert settled == [7] and q.count() == 0 and not q.holds(7)
    assert sorted(released) == ["a", "b"]  # a disconnected peer's handle is not released
    assert q.ended() == {
        c.QUARANTINE_ENDED_DONE: 1,
        c.QUARANTINE_ENDED_ERROR: 1,
        c.QUARANTINE_ENDED_PEER_GONE: 1,
    }


def test_disconnect_is_recognised_by_nixl_class_name_or_cause() -> None:
    assert is_disconnect(nixlRemoteDisconnectError())
    wrapped = RuntimeError("post failed")
    wrapped.__cause__ = nixlRemoteDisconnectError()
    assert is_disconnect(wrapped)
    assert not is_disconnect(ValueError("other"))


def test_ledger_holds_the_failure_notice_while_a_batch_is_quarantined() -> None:
    ledger = RoomLedger()
    ledger.remember_targets(5, [("127.0.0.1", 9000)])
    ledger.enqueued(5)
    ledger.dequeued(5)
    ledger.failed(5, "transfer deadline")
    ledger.quarantined(5)
    assert ledger.chunk_done(5) is False  # the worker moved on; the handle may still write
    assert ledger.claim_failure_notice(5) is None
    assert ledger.unquarantined(5) is True
    assert ledger.claim_failure_notice(5) == ([("127.0.0.1", 9000)], "transfer deadline")
    assert ledger.has_targets(5) and not ledger.has_targets(6)


def test_thread_watch_counts_what_was_started_and_sees_a_death() -> None:
    watch = ThreadWatch()
    stop = threading.Event()

    def transfer_worker() -> None:
        stop.wait(10)

    def bootstrap_thread_guarded() -> None:
        return  # dies at once

    with watch.record_started():
        threads = [threading.Thread(target=transfer_worker, daemon=True) for _ in range(2)]
        threads.append(threading.Thread(target=bootstrap_thread_guarded, daemon=True))
        threading.Thread(target=lambda: None, daemon=True).start()  # unknown kind: ignored
        for t in threads:
            t.start()
    threads[-1].join(5)
    try:
        assert kind_of(threads[0]) == "nixl_transfer_worker"
        assert watch.expected() == {"nixl_transfer_worker": 2, "nixl_bootstrap": 1}
        assert watch.dead() == {"nixl_bootstrap": (0, 1)}
    finally:
        stop.set()


def _families(rt: RoomRuntime) -> dict[str, list[tuple[dict[str, str], float]]]:
    body = rt.metrics.exposition()[0].decode()
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(body)}


def test_new_metric_families_are_exported_with_their_contract_names() -> None:
    rt = RoomRuntime(HardeningConfig(inflight_deadline=None), "prefill")
    rt.table.open(1, KVPoll.Bootstrapping)
    rt.table.update(1, KVPoll.Transferring)
    rt.count_error("chunk_taken")
    with rt.guard("enqueue"):
        raise RuntimeError("injected")  # swallowed, counted
    rt.metrics.add_verify_failures(3)
    fams = _families(rt)
    states = {labels["state"] for labels, _ in fams[c.METRIC_KV_OLDEST_IN_STATE]}
    assert states == {"bootstrapping", "waiting_for_input", "transferring"}
    errors = {
        labels["where"]: v
        for labels, v in fams[c.METRIC_RUNTIME_ERRORS_BASE]
        if labels.get("where") and not labels.get("__name__")
    }
    assert errors["chunk_taken"] == 1 and errors["enqueue"] == 1 and errors["abort"] == 0
    assert fams[c.METRIC_KV_HANDLES_QUARANTINED] == [({"role": "prefill"}, 0.0)]
    verify = [v for labels, v in fams[c.METRIC_KV_VERIFY_FAILURES_BASE] if labels == {"role": "prefill"}]
    assert verify[:1] == [3.0]
    assert c.METRIC_RUNTIME_THREADS in fams and c.METRIC_RUNTIME_THREADS_EXPECTED in fams


def test_quarantine_endings_are_counted_by_how_at_scrape_time() -> None:
    rt = RoomRuntime(HardeningConfig(inflight_deadline=None), "prefill")

    def endings() -> dict[str, float]:
        return {
            labels[c.LABEL_METRIC_HOW]: v
            for labels, v in _families(rt)[c.METRIC_KV_QUARANTINE_ENDINGS_BASE]
            if c.LABEL_METRIC_HOW in labels
        }

    # every series exists at zero before any handle was quarantined
    assert endings() == dict.fromkeys(c.QUARANTINE_ENDINGS, 0.0)
    states = {"a": "PROC", "b": "PROC", "c": "PROC", "d": "PROC"}
    settled = threading.Event()

    def read(handle: str) -> str:
        if states[handle] == "GONE":
            raise nixlRemoteDisconnectError("peer disconnected")
        return states[handle]

    q = HandleQuarantine(read, lambda handle: None, lambda room: settled.set(), poll_s=0.001)
    rt.quarantine = q
    q.start()
    try:
        q.add(3, ["a", "b", "c", "d"])
        states.update(a="DONE", b="DONE", c="ERR")
        assert not settled.wait(0.1)
        # a batch still holding a handle has ended nothing yet
        assert endings() == dict.fromkeys(c.QUARANTINE_ENDINGS, 0.0)
        states["d"] = "GONE"
        assert settled.wait(5)
    finally:
        q.stop()
    assert endings() == {
        c.QUARANTINE_ENDED_DONE: 2.0,
        c.QUARANTINE_ENDED_ERROR: 1.0,
        c.QUARANTINE_ENDED_PEER_GONE: 1.0,
    }
    assert c.METRIC_KV_QUARANTINE_ENDINGS_TOTAL.startswith(c.METRIC_KV_QUARANTINE_ENDINGS_BASE)

"""The runtime's /metrics: every contract name with its type, series at 0 from the start,
one registry per runtime (serving it over HTTP: tests/integration/test_runtime_metrics_http.py)."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

import pdwarden_contract as c
from pdwarden_runtime.inflight import InflightTracker
from pdwarden_runtime.kvpoll import STATE_LABELS, KVPoll
from pdwarden_runtime.metrics import RuntimeMetrics
from pdwarden_runtime.status import RoomStatusTable
from tests.support.runtime_metrics import CONTRACT_FAMILIES, runtime

pytestmark = pytest.mark.unit


def samples(metrics: RuntimeMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    body, _ = metrics.exposition()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def value(metrics: RuntimeMetrics, name: str, **labels: str) -> float:
    labels.setdefault("role", metrics.role)
    return samples(metrics)[(name, frozenset(labels.items()))]


def test_exposition_parses_and_carries_every_contract_name_with_its_type() -> None:
    *_, metrics = runtime()
    body, content_type = metrics.exposition()
    assert content_type.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    for name, kind in CONTRACT_FAMILIES.items():
        assert name in families, f"{name} missing from /metrics"
        assert families[name].type == kind, name
        for sample in families[name].samples:
            assert sample.labels.get(c.LABEL_METRIC_ROLE) == c.ROLE_PREFILL, sample
    exposed = {s.name for f in families.values() for s in f.samples}
    for sample_name in (
        c.METRIC_KV_TRANSFERS_TOTAL,
        c.METRIC_KV_TRANSFER_BYTES_TOTAL,
        c.METRIC_STATUS_WRITES_REFUSED_TOTAL,
    ):
        assert sample_name in exposed


def test_every_series_exists_at_zero_before_anything_happens() -> None:
    *_, metrics = runtime()
    assert value(metrics, c.METRIC_INFLIGHT_REQUESTS) == 0
    assert value(metrics, c.METRIC_INFLIGHT_OLDEST_AGE) == 0
    for state in STATE_LABELS.values():
        assert value(metrics, c.METRIC_KV_ROOMS, state=state) == 0
    for outcome in c.OUTCOMES:
        assert value(metrics, c.METRIC_KV_TRANSFERS_TOTAL, outcome=outcome) == 0
    assert (
        value(metrics, c.METRIC_STATUS_WRITES_REFUSED_TOTAL, from_state="failed", to_state="transferring")
        == 0
    )
    assert value(metrics, c.METRIC_KV_TRANSFER_BYTES_TOTAL) == 0
    assert (
        value(metrics, c.METRIC_RUNTIME_INFO, version="9.9.9", engine="synthetic", transfer_backend="nixl")
        == 1
    )


def test_metrics_follow_the_table_and_the_tracker() -> None:
    clock, table, _, metrics = runtime()
    table.open(1, KVPoll.Bootstrapping)
    table.open(2, KVPoll.Bootstrapping)
    table.update(1, KVPoll.Transferring)
    clock.now += 3
    table.update(2, KVPoll.Failed, outcome="aborted")
    table.update(2, KVPoll.Transferring)  # the race, refused and counted
    metrics.add_bytes(4096)
    metrics.add_bytes(4096)
    assert value(metrics, c.METRIC_INFLIGHT_REQUESTS) == 1
    assert value(metrics, c.METRIC_INFLIGHT_OLDEST_AGE) == pytest.approx(3.0)
    assert value(metrics, c.METRIC_KV_ROOMS, state="transferring") == 1
    assert value(metrics, c.METRIC_KV_ROOMS, state="failed") == 1
    assert value(metrics, c.METRIC_KV_TRANSFERS_TOTAL, outcome="aborted") == 1
    assert (
        value(metrics, c.METRIC_STATUS_WRITES_REFUSED_TOTAL, from_state="failed", to_state="transferring")
        == 1
    )
    assert value(metrics, c.METRIC_KV_TRANSFER_BYTES_TOTAL) == 8192
    assert value(metrics, c.METRIC_KV_TRANSFER_SECONDS + "_count") == 1
    assert value(metrics, c.METRIC_KV_TRANSFER_SECONDS + "_sum") == pytest.approx(3.0)
    table.clear(2)
    table.update(2, KVPoll.Success)
    assert value(metrics, c.METRIC_STATUS_WRITES_REFUSED_TOTAL, from_state="cleared", to_state="success") == 1


def test_a_scrape_enforces_the_deadline() -> None:
    clock, table, _, metrics = runtime(deadline=30.0)
    table.open(7, KVPoll.Bootstrapping)
    table.update(7, KVPoll.Transferring)
    clock.now += 31
    assert value(metrics, c.METRIC_INFLIGHT_REQUESTS) == 0
    assert value(metrics, c.METRIC_KV_TRANSFERS_TOTAL, outcome="deadline") == 1
    assert table.get(7) == KVPoll.Failed


def test_registries_are_per_runtime_and_the_global_one_is_untouched() -> None:
    _, table_a, _, prefill = runtime(c.ROLE_PREFILL)
    _, _, _, decode = runtime(c.ROLE_DECODE)
    table_a.open(1, KVPoll.Bootstrapping)
    assert value(prefill, c.METRIC_INFLIGHT_REQUESTS) == 1
    assert value(decode, c.METRIC_INFLIGHT_REQUESTS) == 0
    assert prefill.registry is not decode.registry
    global_names = {f.name for f in REGISTRY.collect()}
    assert not any(name.startswith("pdwarden_") for name in global_names)


def test_bad_role_and_negative_bytes_are_clear_errors() -> None:
    table = RoomStatusTable("sticky")
    tracker = InflightTracker(table)
    with pytest.raises(ValueError, match="unknown runtime role 'router'"):
        RuntimeMetrics("router", table, tracker, engine="synthetic", transfer_backend="nixl")
    *_, metrics = runtime()
    with pytest.raises(ValueError, match="must be >= 0"):
        metrics.add_bytes(-1)

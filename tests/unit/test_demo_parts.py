"""The demo's pure parts: its model manifest, its verdict, and the scraped-series grid that
promtool replays (fed by a real RuntimeMetrics exposition; tests/integration/test_demo_alerts.py
has promtool judge it)."""

from __future__ import annotations

import json

import pytest
import yaml

from pdwarden_cli import demo_scenario
from pdwarden_cli.demo_scrape import SeriesStore, Target, parse_samples, target_labels
from pdwarden_operator.models import parse_spec
from pdwarden_runtime import contract
from pdwarden_runtime.inflight import InflightTracker
from pdwarden_runtime.kvpoll import KVPoll
from pdwarden_runtime.metrics import RuntimeMetrics
from pdwarden_runtime.status import RoomStatusTable

pytestmark = pytest.mark.unit


def test_demo_manifest_is_the_example_with_2_2_1_pods_and_fault_injection_allowed() -> None:
    example = yaml.safe_load(demo_scenario.EXAMPLE.read_text())
    m = demo_scenario.demo_manifest(example, "ns1")
    assert m["metadata"]["namespace"] == "ns1"
    assert m["metadata"]["annotations"][contract.ANNOTATION_ALLOW_FAULT_INJECTION] == "true"
    spec = parse_spec(m["spec"])  # the operator's own validation (the CRD's rules too)
    assert (spec.prefill.replicas, spec.decode.replicas, spec.router.replicas) == (2, 2, 1)
    assert spec.engine == "synthetic"
    assert spec.watchdog.action == "restart"
    # the emulated NIXL port, so the race can wedge it
    assert spec.prefill.args == ["--hardening", "emulated-port", "--race-window", "5"]
    assert spec.decode.args == example["spec"].get("decode", {}).get("args", [])
    # the ladder's order: the runtime's deadline first (none in the emulated port), then the operator
    assert spec.watchdog.stuck_after_seconds > spec.transfer.inflight_deadline_seconds
    assert "annotations" not in example.get("metadata", {}) or (
        contract.ANNOTATION_ALLOW_FAULT_INJECTION not in example["metadata"]["annotations"]
    )  # the example itself stays safe


def good_result() -> demo_scenario.DemoResult:
    return demo_scenario.DemoResult(
        wedges_injected=1,
        wedges_detected=1,
        detection_seconds=23.456,
        remediations=1,
        requests_ok=300,
        requests_failed=12,
        recovered=True,
        alerts_fired=["PdwardenInflightOldestAgeHigh", "PdwardenWedgeRemediated"],
        alerts_for_wedged_pod=["PdwardenInflightOldestAgeHigh"],
        alerts_before_fault=["PdwardenStatusWritesRefused"],
    )


def test_demo_result_json_line_has_the_promised_keys() -> None:
    line = good_result().json_line()
    assert "\n" not in line
    data = json.loads(line)
    for key in (
        "wedges_injected",
        "wedges_detected",
        "detection_seconds",
        "remediations",
        "requests_ok",
        "requests_failed",
        "recovered",
    ):
        assert key in data
    assert data["detection_seconds"] == 23.5 and data["recovered"] is True


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"wedges_detected": 0}, "did not detect"),
        ({"remediations": 0}, "not remediated"),
        ({"recovered": False}, "did not recover"),
        ({"alerts_for_wedged_pod": []}, "no inflight alert"),
        ({"alerts_fired": ["PdwardenInflightOldestAgeHigh"]}, "PdwardenWedgeRemediated"),
        (
            {"alerts_before_fault": ["PdwardenInflightStuck"]},
            "before the fault was injected: PdwardenInflightStuck",
        ),
        ({"wedges_injected": 0, "wedges_detected": 0}, "no wedge was injected"),
        ({"error": "helm install failed"}, "helm install failed"),
    ],
)
def test_demo_fails_when_anything_did_not_happen(change: dict[str, object], complaint: str) -> None:
    assert good_result().failures() == []
    result = good_result()
    for key, value in change.items():
        setattr(result, key, value)
    assert any(complaint in failure for failure in result.failures())
    if result.error:  # an aborted demo names its error, not the consequences
        assert result.failures() == [result.error]


def exposition_of_a_runtime(rooms_in_flight: int, finished: int) -> str:
    table = RoomStatusTable(mode="sticky")
    tracker = InflightTracker(table)
    metrics = RuntimeMetrics("prefill", table, tracker, engine="synthetic", transfer_backend="nixl")
    for room in range(finished):
        table.open(room, KVPoll.Bootstrapping)
        table.update(room, KVPoll.Transferring)
        table.update(room, KVPoll.Success)
    for room in range(1000, 1000 + rooms_in_flight):
        table.open(room, KVPoll.Bootstrapping)
        table.update(room, KVPoll.Transferring)
    body, _ = metrics.exposition()
    return body.decode()


def test_parse_samples_keeps_the_contract_series_of_a_real_runtime_exposition() -> None:
    samples = parse_samples(exposition_of_a_runtime(rooms_in_flight=3, finished=5))
    names = {name for name, _, _ in samples}
    assert contract.METRIC_INFLIGHT_REQUESTS in names and contract.METRIC_KV_TRANSFERS_TOTAL in names
    assert not any(n.endswith(("_bucket", "_created", "_sum", "_count")) for n in names)
    inflight = [v for n, _, v in samples if n == contract.METRIC_INFLIGHT_REQUESTS]
    assert inflight == [3.0]
    success = [
        v
        for n, labels, v in samples
        if n == contract.METRIC_KV_TRANSFERS_TOTAL and labels[contract.LABEL_METRIC_OUTCOME] == "success"
    ]
    assert success == [5.0]


def test_target_labels_follow_prometheus_honor_labels_semantics() -> None:
    scraped = {"namespace": "models", "model": "m"}
    plain = Target("http://x/metrics", {"namespace": "ops", "job": "j"})
    honored = Target("http://x/metrics", {"namespace": "ops", "job": "j"}, honor_labels=True)
    assert target_labels(scraped, plain)["namespace"] == "ops"
    assert target_labels(scraped, honored)["namespace"] == "models"


def test_series_grid_marks_missed_scrapes() -> None:
    store = SeriesStore(start=100.0, step=2.0)
    labels = {"__name__": "up", "job": 'a"b', "instance": "i"}
    store.add(100.1, labels, 1)
    store.add(104.0, labels, 0)
    store.add(106.2, {**labels, "instance": "k"}, 0.5)
    rows = {r["series"]: r["values"] for r in store.input_series()}
    assert rows['up{instance="i", job="a\\"b"}'] == "1 _ 0 _"
    assert rows['up{instance="k", job="a\\"b"}'] == "_ _ _ 0.5"


@pytest.mark.parametrize(
    ("asked", "started", "scope"),
    [
        ("auto", True, "cluster"),  # a cluster the demo started holds nothing else
        ("auto", False, "namespace"),  # a cluster that was up may hold a user's models
        ("cluster", False, "cluster"),
        ("namespace", True, "namespace"),
    ],
)
def test_the_demo_chooses_its_operators_scope(asked: str, started: bool, scope: str) -> None:
    assert demo_scenario.operator_scope(asked, started) == scope


def test_the_demo_scopes_values_are_the_charts() -> None:
    allow = {
        f"podPolicy.namespaces.{demo_scenario.NAMESPACE}": "{faultInjection}",
        # the demo scrapes the operator from the host: its NetworkPolicy must let that in
        "operator.networkPolicy.metricsFrom[0].ipBlock.cidr": "198.18.15.1/32",
    }
    assert demo_scenario.chart_values("cluster", "198.18.15.1/32") == {"operator.scope": "cluster", **allow}
    values = demo_scenario.chart_values("namespace", "198.18.15.1/32")
    assert values == {
        "operator.scope": "namespace",
        "operator.watchNamespace": demo_scenario.NAMESPACE,
        **allow,
    }
    with pytest.raises(ValueError, match="scope must be one of"):
        demo_scenario.operator_scope("everywhere", True)

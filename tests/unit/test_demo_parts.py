"""The demo's pure parts: its model manifest, its verdict, its chart values and the alerts it
keeps from Alertmanager."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
import yaml

import pdwarden_contract as contract
from pdwarden_demo import demo_scenario, demo_traffic
from pdwarden_localcluster.monitoring import Alert
from pdwarden_operator.models import parse_spec

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
        requests_failed=0,
        recovered=True,
        wedged_requests=3,
        wedged_requests_p99_s=16.04,
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
        "wedged_requests",
        "wedged_requests_p99_s",
    ):
        assert key in data
    assert data["detection_seconds"] == 23.5 and data["recovered"] is True
    assert data["requests_failed"] == 0 and data["wedged_requests_p99_s"] == 16.0


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
        ({"requests_failed": 3}, "a client saw the wedge"),
        (
            {"wedged_requests_p99_s": demo_scenario.INFLIGHT_DEADLINE_S + 2.5},
            "more than the inflight deadline",
        ),
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


def test_the_requests_a_wedge_caught_are_the_slow_answers_after_it() -> None:
    log = demo_traffic.TrafficLog()
    log.requests = [
        (100.0, 16.0, demo_traffic.OK),  # in flight at the fault (110), answered after it: caught
        (90.0, 0.2, demo_traffic.OK),  # ended before the fault
        (111.0, 0.3, demo_traffic.OK),  # quick
        (112.0, 2.5, demo_traffic.CANCELLED),  # its client gave up: not an answer
        (113.0, 15.5, demo_traffic.FAILED),
    ]
    assert sorted(log.slow(110.0, 2.0)) == [15.5, 16.0]
    assert demo_traffic.p99([15.5, 16.0]) == 16.0 and demo_traffic.p99([]) is None
    assert demo_traffic.p99([float(i) for i in range(1, 201)]) == 198.0


def alert(name: str, fingerprint: str, starts_at: str, **labels: str) -> Alert:
    return Alert.model_validate(
        {"labels": {"alertname": name, **labels}, "startsAt": starts_at, "fingerprint": fingerprint}
    )


def test_the_alerts_seen_keep_each_alert_once_and_answer_by_pod_and_by_start() -> None:
    seen = demo_scenario.AlertsSeen()
    stuck = alert("PdwardenInflightStuck", "f1", "2026-12-02T00:00:10.5Z", pod="m-prefill-a")
    seen.add([stuck, alert("PdwardenWedgeRemediated", "f2", "2026-12-02T00:00:30Z")])
    # a later poll: the same alert (its fingerprint) again, another pod's, and the first gone
    seen.add([stuck, alert("PdwardenInflightOldestAgeHigh", "f3", "2026-12-02T00:00:20+00:00", pod="other")])
    assert seen.names() == [
        "PdwardenInflightOldestAgeHigh",
        "PdwardenInflightStuck",
        "PdwardenWedgeRemediated",
    ]
    assert seen.names(pod="m-prefill-a") == ["PdwardenInflightStuck"]
    assert seen.names(pod="other", only=demo_scenario.INFLIGHT_ALERTS) == ["PdwardenInflightOldestAgeHigh"]
    assert seen.names(pod="m-prefill-a", only=("PdwardenWedgeRemediated",)) == []
    injected = datetime(2026, 12, 2, 0, 0, 15, tzinfo=UTC).timestamp()
    assert seen.started_before(injected) == ["PdwardenInflightStuck"]


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
        **demo_scenario.DEMO_MONITORING_VALUES,
    }
    assert demo_scenario.chart_values("cluster") == {"operator.scope": "cluster", **allow}
    values = demo_scenario.chart_values("namespace")
    assert values == {
        "operator.scope": "namespace",
        "operator.watchNamespace": demo_scenario.NAMESPACE,
        **allow,
    }
    with pytest.raises(ValueError, match="scope must be one of"):
        demo_scenario.operator_scope("everywhere", True)

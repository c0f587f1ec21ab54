"""The chart's alert rules, rendered by the real helm and evaluated by the real promtool.

Every alert must fire when its condition holds, and stay silent for a busy queue that keeps
finishing transfers. Scenarios use the chart's default thresholds (window 5m, for 1m, ...).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

import pdwarden_contract as contract
from pdwarden_demo import chart

pytestmark = pytest.mark.integration

RELEASE = "pdw"
NAMESPACE = "pdwarden-system"
OPERATOR_JOB = f"{RELEASE}-pdwarden-metrics"  # the metrics Service's name, as a ServiceMonitor labels `up`

ALERTS = (
    "PdwardenInflightStuck",
    "PdwardenInflightOldestAgeHigh",
    "PdwardenStatusWritesRefused",
    "PdwardenWedgeRemediated",
    "PdwardenRemediationBudgetExhausted",
    "PdwardenFleetBrakeEngaged",
    "PdwardenPodsUnobserved",
    "PdwardenAutoscaleSaturated",
    "PdwardenRatioBandUnkeepable",
    "PdwardenOperatorDown",
)
SEVERITY = {
    "PdwardenInflightStuck": "critical",
    "PdwardenInflightOldestAgeHigh": "warning",
    "PdwardenStatusWritesRefused": "warning",
    "PdwardenWedgeRemediated": "warning",
    "PdwardenRemediationBudgetExhausted": "critical",
    "PdwardenFleetBrakeEngaged": "critical",
    "PdwardenPodsUnobserved": "warning",
    "PdwardenAutoscaleSaturated": "warning",
    "PdwardenRatioBandUnkeepable": "warning",
    "PdwardenOperatorDown": "critical",
}


@pytest.fixture(scope="module")
def groups() -> dict[str, Any]:
    docs = chart.helm_template(
        release=RELEASE, namespace=NAMESPACE, set_values={"monitoring.prometheusRule.enabled": "true"}
    )
    return chart.rule_groups(docs)


def contract_metric_names() -> set[str]:
    return {
        value
        for name, value in vars(contract).items()
        if name.startswith("METRIC_") and not name.endswith("_BASE") and isinstance(value, str)
    }


def test_every_alert_is_rendered_once(groups: dict[str, Any]) -> None:
    names = [rule["alert"] for rule in chart.alert_rules(groups)]
    assert sorted(names) == sorted(ALERTS)


def test_alert_expressions_use_only_contract_metric_names(groups: dict[str, Any]) -> None:
    allowed = contract_metric_names() | {"up"}  # `up` is Prometheus's own scrape-health series
    for rule in chart.alert_rules(groups):
        used = chart.promql_metric_names(rule["expr"])
        assert used, f"{rule['alert']}: no metric found in {rule['expr']!r}"
        assert used <= allowed, f"{rule['alert']} uses names missing from pdwarden_contract: {used - allowed}"


def test_metric_name_reader_sees_unknown_names() -> None:
    # The check above is only as good as this reader: it must report a misspelt metric.
    expr = 'sum by (pod) (increase(pdwarden_kv_transfer_total{role="prefill"}[5m])) > 0 unless on (pod) up'
    assert chart.promql_metric_names(expr) == {"pdwarden_kv_transfer_total", "up"}


def test_every_alert_has_severity_summary_description_and_a_runbook_section(groups: dict[str, Any]) -> None:
    anchors = chart.runbook_anchors(chart.ALERTS_DOC.read_text())
    for rule in chart.alert_rules(groups):
        name = rule["alert"]
        assert rule["labels"]["severity"] == SEVERITY[name]
        annotations = rule["annotations"]
        assert annotations["summary"].strip() and annotations["description"].strip()
        anchor = annotations["runbook_url"].rsplit("#", 1)[1]
        assert anchor == name.lower()
        assert anchor in anchors, f"docs/alerts.md has no section for {name}"


def test_promtool_accepts_the_rules_and_their_templates(groups: dict[str, Any], tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(chart.dump_yaml(groups))
    proc = run_promtool("check", "rules", str(rules))
    assert f"SUCCESS: {len(ALERTS)} rules found" in proc.stdout


# --- promtool unit tests ----------------------------------------------------------------


def run_promtool(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [chart.find_tool("promtool"), *args], capture_output=True, text=True, timeout=120, check=False
    )
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def promtool_rules_test(
    tmp_path: Path, groups: dict[str, Any], case: dict[str, Any], *, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run promtool's rule unit test `case` against `groups`."""
    # promtool compares annotations too; they are checked above, the expressions here.
    (tmp_path / "rules.yaml").write_text(chart.dump_yaml(chart.without_annotations(groups)))
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "15s", "tests": [case]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    return run_promtool("test", "rules", str(tmp_path / "test.yaml"), check=check)


def series(metric: str, values: str, **labels: str) -> dict[str, str]:
    body = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{metric}{{{body}}}", "values": values}


RUNTIME_JOB = "pdwarden-system/pdw-pdwarden-runtime"  # a PodMonitor's job label
OPERATOR_INSTANCE = "10.0.0.9:8080"


def runtime_labels(pod: str, role: str = "prefill") -> dict[str, str]:
    # What the chart's PodMonitor attaches to a runtime pod's series.
    instance = f"10.0.1.{sum(map(ord, pod)) % 250}:{contract.DEFAULT_METRICS_PORT}"
    return {
        "namespace": "ml",
        "pod": pod,
        "role": role,
        "model": "m",
        "job": RUNTIME_JOB,
        "instance": instance,
    }


def up(labels: dict[str, str], values: str) -> dict[str, str]:
    """Prometheus's scrape-health series of the target these labels come from."""
    return series("up", values, job=labels["job"], instance=labels["instance"], namespace=labels["namespace"])


def only(labels: dict[str, str], *keys: str) -> dict[str, str]:
    return {k: labels[k] for k in keys}


def expectations(at: str, firing: dict[str, list[dict[str, str]]]) -> list[dict[str, Any]]:
    """One alert_rule_test per alert at `at`: the listed alerts fire (with these labels), the rest not."""
    return [
        {
            "eval_time": at,
            "alertname": name,
            "exp_alerts": [
                {"exp_labels": {**labels, "severity": SEVERITY[name]}} for labels in firing.get(name, [])
            ],
        }
        for name in ALERTS
    ]


def operator_model_labels() -> dict[str, str]:
    # The operator's series (honorLabels: its own `namespace`, the model's) plus the target's.
    return {"namespace": "ml", "model": "m", "job": OPERATOR_JOB, "instance": OPERATOR_INSTANCE}


def healthy_operator(samples: int) -> list[dict[str, str]]:
    """Operator series of a healthy operator that remediated once, before Prometheus started:
    its counter is not new, it just was not seen before (it must not fire)."""
    model = operator_model_labels()
    return [
        series("up", f"1x{samples}", job=OPERATOR_JOB, instance=OPERATOR_INSTANCE, namespace=NAMESPACE),
        series(contract.METRIC_OPERATOR_UNOBSERVED_PODS, f"0x{samples}", **model, role="prefill"),
        series(contract.METRIC_OPERATOR_BUDGET_EXHAUSTED, f"0x{samples}", **model),
        series(contract.METRIC_OPERATOR_WEDGED_PODS, f"0x{samples}", **model, role="prefill"),
        series(
            contract.METRIC_OPERATOR_REMEDIATIONS_TOTAL,
            f"2x{samples}",
            **model,
            action="restart",
            outcome="succeeded",
        ),
    ]


def scenario_wedge() -> dict[str, Any]:
    """p0 finishes transfers for 10 min, then its queue wedges; p1 stays busy; p2 starts at
    10 min with requests in flight and never finishes one (it must fire too, once it is older
    than the window)."""
    p0, p1, p2 = runtime_labels("m-prefill-0"), runtime_labels("m-prefill-1"), runtime_labels("m-prefill-2")
    return {
        "interval": "15s",
        "input_series": [
            up(p0, "1x120"),
            series(contract.METRIC_INFLIGHT_REQUESTS, "3x120", **p0),
            series(contract.METRIC_KV_TRANSFERS_TOTAL, "0+4x40 160x80", **p0, outcome="success"),
            series(contract.METRIC_INFLIGHT_OLDEST_AGE, "2x40 2+15x80", **p0),
            up(p1, "1x120"),
            series(contract.METRIC_INFLIGHT_REQUESTS, "5x120", **p1),
            series(contract.METRIC_KV_TRANSFERS_TOTAL, "0+4x120", **p1, outcome="success"),
            series(contract.METRIC_INFLIGHT_OLDEST_AGE, "1x120", **p1),
            up(p2, "_x40 1x80"),
            series(contract.METRIC_INFLIGHT_REQUESTS, "_x40 4x80", **p2),
            series(contract.METRIC_INFLIGHT_OLDEST_AGE, "_x40 0+15x80", **p2),
            *healthy_operator(120),
        ],
        "alert_rule_test": [
            *expectations("9m", {}),
            # p0 wedged 3 min ago: less than the window; p2 is 3 min old.
            *expectations("13m", {}),
            *expectations(
                "17m",
                {
                    "PdwardenInflightStuck": [p0, p2],
                    "PdwardenInflightOldestAgeHigh": [
                        only(p0, "namespace", "pod", "role"),
                        only(p2, "namespace", "pod", "role"),
                    ],
                },
            ),
        ],
    }


def scenario_busy_but_progressing() -> dict[str, Any]:
    """A deep queue that keeps finishing transfers, a slow queue (one transfer every 4 min),
    an idle pod, and refused-writes counters that exist but never grow: nothing fires."""
    deep, slow, idle = (
        runtime_labels("m-prefill-0"),
        runtime_labels("m-decode-0", "decode"),
        runtime_labels("m-x"),
    )
    refused = {"from_state": "Failed", "to_state": "Transferring"}
    return {
        "interval": "15s",
        "input_series": [
            *[up(p, "1x120") for p in (deep, slow, idle)],
            series(contract.METRIC_INFLIGHT_REQUESTS, "200x120", **deep),
            series(contract.METRIC_KV_TRANSFERS_TOTAL, "0+50x120", **deep, outcome="success"),
            series(contract.METRIC_KV_TRANSFERS_TOTAL, "0+1x120", **deep, outcome="aborted"),
            series(contract.METRIC_INFLIGHT_OLDEST_AGE, "5 25 " * 60, **deep),
            series(contract.METRIC_STATUS_WRITES_REFUSED_TOTAL, "0x120", **deep, **refused),
            # refused once before Prometheus started: seen, but not new, so silent
            series(contract.METRIC_STATUS_WRITES_REFUSED_TOTAL, "4x120", **slow, **refused),
            series(contract.METRIC_INFLIGHT_REQUESTS, "1x120", **slow),
            series(
                contract.METRIC_KV_TRANSFERS_TOTAL,
                " ".join(f"{i}x15" for i in range(8)),
                **slow,
                outcome="success",
            ),
            series(contract.METRIC_INFLIGHT_OLDEST_AGE, "0+15x15 " * 8, **slow),
            series(contract.METRIC_INFLIGHT_REQUESTS, "0x120", **idle),
            series(contract.METRIC_KV_TRANSFERS_TOTAL, "7x120", **idle, outcome="success"),
            series(contract.METRIC_INFLIGHT_OLDEST_AGE, "0x120", **idle),
            *healthy_operator(120),
        ],
        "alert_rule_test": [e for at in ("5m", "10m", "20m", "29m") for e in expectations(at, {})],
    }


def busy_series(labels: dict[str, str], samples: int) -> list[dict[str, str]]:
    return [
        up(labels, f"1x{samples}"),
        series(contract.METRIC_INFLIGHT_REQUESTS, f"2x{samples}", **labels),
        series(contract.METRIC_KV_TRANSFERS_TOTAL, f"0+3x{samples}", **labels, outcome="success"),
        series(contract.METRIC_INFLIGHT_OLDEST_AGE, f"1x{samples}", **labels),
    ]


def scenario_refused_writes() -> dict[str, Any]:
    """The race caught on p0: its refused counter appears at 12 min, grows at 22 min, then
    stays; p1's counter exists at zero."""
    p0, p1 = runtime_labels("m-prefill-0"), runtime_labels("m-prefill-1")
    refused = {"from_state": "Failed", "to_state": "Transferring"}
    at = only(p0, "namespace", "pod", "role")
    return {
        "interval": "15s",
        "input_series": [
            *busy_series(p0, 180),
            *busy_series(p1, 180),
            series(contract.METRIC_STATUS_WRITES_REFUSED_TOTAL, "_x48 1x40 3x90", **p0, **refused),
            series(contract.METRIC_STATUS_WRITES_REFUSED_TOTAL, "0x180", **p1, **refused),
            *healthy_operator(180),
        ],
        "alert_rule_test": [
            *expectations("5m", {}),
            *expectations("15m", {"PdwardenStatusWritesRefused": [at]}),
            *expectations("27m", {"PdwardenStatusWritesRefused": [at]}),
            *expectations("40m", {}),
        ],
    }


def scenario_operator() -> dict[str, Any]:
    """Operator series at 1 min resolution: unobserved pods 5-25 min, a first remediation at
    20 min, budget exhausted 25-30 min, operator down 30-45 min, a second remediation at 45 min."""
    labels = operator_model_labels()
    model = only(labels, "namespace", "model")
    remediated = {**model, "action": "restart"}
    operator_down = {"job": OPERATOR_JOB, "namespace": NAMESPACE}
    return {
        "interval": "1m",
        "input_series": [
            series("up", "1x30 0x15 1x15", job=OPERATOR_JOB, instance=OPERATOR_INSTANCE, namespace=NAMESPACE),
            series(
                contract.METRIC_OPERATOR_REMEDIATIONS_TOTAL,
                "_x20 1x25 2x15",
                **labels,
                action="restart",
                outcome="succeeded",
            ),
            series(contract.METRIC_OPERATOR_BUDGET_EXHAUSTED, "0x25 1x5 0x30", **labels),
            series(contract.METRIC_OPERATOR_UNOBSERVED_PODS, "0x5 2x20 0x35", **labels, role="decode"),
            series(contract.METRIC_OPERATOR_WEDGED_PODS, "0x60", **labels, role="prefill"),
        ],
        "alert_rule_test": [
            *expectations("3m", {}),
            *expectations("12m", {}),  # unobserved for 7 min: still pending
            *expectations("18m", {"PdwardenPodsUnobserved": [model]}),
            *expectations(
                "22m", {"PdwardenWedgeRemediated": [remediated], "PdwardenPodsUnobserved": [model]}
            ),
            *expectations(
                "27m",
                {"PdwardenWedgeRemediated": [remediated], "PdwardenRemediationBudgetExhausted": [model]},
            ),
            *expectations("33m", {"PdwardenWedgeRemediated": [remediated]}),  # down 3 min: pending
            *expectations("38m", {"PdwardenOperatorDown": [operator_down]}),
            *expectations("47m", {"PdwardenWedgeRemediated": [remediated]}),
            *expectations("58m", {"PdwardenWedgeRemediated": [remediated]}),
        ],
    }


def scenario_fleet_brake() -> dict[str, Any]:
    """Two operator replicas: the leader engages the brake 10-20 min, the standby exports 0."""
    leader = {"job": OPERATOR_JOB, "instance": OPERATOR_INSTANCE, "namespace": NAMESPACE}
    standby = {**leader, "instance": "10.0.0.10:8080"}
    return {
        "interval": "1m",
        "input_series": [
            series("up", "1x30", **leader),
            series("up", "1x30", **standby),
            series(contract.METRIC_OPERATOR_BRAKE_ENGAGED, "0x10 1x10 0x10", **leader),
            series(contract.METRIC_OPERATOR_BRAKE_ENGAGED, "0x30", **standby),
        ],
        "alert_rule_test": [
            *expectations("5m", {}),
            *expectations(
                "12m", {"PdwardenFleetBrakeEngaged": [{"namespace": NAMESPACE, "job": OPERATOR_JOB}]}
            ),
            *expectations("25m", {}),  # released on its own
        ],
    }


def scenario_autoscaling() -> dict[str, Any]:
    """Operator series at 1 min resolution: prefill of m is saturated 5-24 min (20 min; fires
    after 15 min), decode of m and both roles of n never are; m's band is unkeepable 8-12 min
    (5 min: never fires), n's 0-14 min (15 min: fires from 10 min)."""
    m = operator_model_labels()
    n = {**m, "model": "n"}
    return {
        "interval": "1m",
        "input_series": [
            series("up", "1x40", job=OPERATOR_JOB, instance=OPERATOR_INSTANCE, namespace=NAMESPACE),
            series(contract.METRIC_OPERATOR_AUTOSCALE_SATURATED, "0x4 1x19 0x16", **m, role="prefill"),
            series(contract.METRIC_OPERATOR_AUTOSCALE_SATURATED, "0x40", **m, role="decode"),
            series(contract.METRIC_OPERATOR_AUTOSCALE_SATURATED, "0x40", **n, role="prefill"),
            series(contract.METRIC_OPERATOR_AUTOSCALE_SATURATED, "0x40", **n, role="decode"),
            series(contract.METRIC_OPERATOR_AUTOSCALE_REPLICAS, "2 3 4x38", **m, role="prefill"),
            series(
                contract.METRIC_OPERATOR_AUTOSCALE_DECISIONS_TOTAL,
                "0 1 2x38",
                **m,
                role="prefill",
                direction="up",
                reason="Load",
            ),
            series(contract.METRIC_OPERATOR_RATIO_UNKEEPABLE, "0x7 1x4 0x28", **m),
            series(contract.METRIC_OPERATOR_RATIO_UNKEEPABLE, "1x14 0x25", **n),
        ],
        "alert_rule_test": [
            *expectations("3m", {}),
            *expectations("9m", {}),  # both pending: saturated 4 min, n's band 9 min
            *expectations("12m", {"PdwardenRatioBandUnkeepable": [only(n, "namespace", "model")]}),
            *expectations("19m", {}),  # saturated 14 min: still pending; n's band kept again
            *expectations(
                "21m", {"PdwardenAutoscaleSaturated": [{**only(m, "namespace", "model"), "role": "prefill"}]}
            ),
            *expectations(
                "24m", {"PdwardenAutoscaleSaturated": [{**only(m, "namespace", "model"), "role": "prefill"}]}
            ),
            *expectations("30m", {}),
        ],
    }


SCENARIOS = {
    "wedge": scenario_wedge,
    "fleet_brake": scenario_fleet_brake,
    "autoscaling": scenario_autoscaling,
    "busy_but_progressing": scenario_busy_but_progressing,
    "refused_writes": scenario_refused_writes,
    "operator": scenario_operator,
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_promtool_rule_unit_tests(scenario: str, groups: dict[str, Any], tmp_path: Path) -> None:
    proc = promtool_rules_test(tmp_path, groups, SCENARIOS[scenario]())
    assert "SUCCESS" in proc.stdout


def test_promtool_catches_a_wrong_expectation(groups: dict[str, Any], tmp_path: Path) -> None:
    # Guards the harness: if the wedge scenario expected silence at 17 min, promtool must fail.
    wrong = scenario_wedge()
    wrong["alert_rule_test"] = expectations("17m", {})
    proc = promtool_rules_test(tmp_path, groups, wrong, check=False)
    assert proc.returncode != 0
    assert "PdwardenInflightStuck" in proc.stdout + proc.stderr

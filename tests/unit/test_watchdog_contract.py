"""The watchdog reads what the runtime really exposes, and sees pods as the kubelet reports them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import pdwarden_contract as contract
from pdwarden_operator.metrics import OperatorMetrics
from pdwarden_operator.watchdog.parse import METRICS_READ, parse_metrics
from pdwarden_operator.watchdog.targets import metrics_url, pod_view
from pdwarden_runtime.kvpoll import KVPoll
from tests.support.runtime_metrics import runtime

pytestmark = pytest.mark.unit


def test_parses_the_runtime_exposition_through_a_room_lifecycle() -> None:
    clock, table, _, metrics = runtime()
    idle = parse_metrics(metrics.exposition()[0])
    assert (idle.inflight, idle.oldest_age, idle.transfers) == (0, 0, 0)
    table.open(7, KVPoll.Bootstrapping)
    table.update(7, KVPoll.Transferring)
    clock.now += 4.5
    busy = parse_metrics(metrics.exposition()[0])
    assert (busy.inflight, busy.oldest_age, busy.transfers) == (1, 4.5, 0)
    table.update(7, KVPoll.Success)
    table.open(8, KVPoll.Bootstrapping)
    table.update(8, KVPoll.Failed)
    done = parse_metrics(metrics.exposition()[0])
    assert (done.inflight, done.transfers) == (0, 2)  # success and failure both count as progress


def test_what_a_scrape_names_parses_as_the_whole_body_in_a_fraction_of_it() -> None:
    """The names the watchdog asks for lose nothing it reads: every state of a room, per-peer
    series, a fresh runtime's empty per-peer counter (prometheus_client's own restriction would
    drop that family, and with it every figure taken from it)."""
    clock, table, _, metrics = runtime()
    peers = {"198.18.0.9"}

    def both() -> tuple[bytes, bytes]:
        return metrics.exposition()[0], metrics.exposition(METRICS_READ)[0]

    seen = []
    for step in range(4):
        if step == 1:
            table.open(7, KVPoll.Bootstrapping)
            metrics.peers.bind(7, ["198.18.0.9"])
            table.update(7, KVPoll.Transferring)
            clock.now += 3.0
        elif step == 2:
            table.open(8, KVPoll.Bootstrapping)
        elif step == 3:
            table.update(7, KVPoll.Failed, outcome=contract.OUTCOME_DEADLINE)
        full, named = both()
        assert len(named) * 2 < len(full), (len(named), len(full))
        sample, whole = parse_metrics(named, peers=peers), parse_metrics(full, peers=peers)
        # the per-state age is read on the table's own clock, at each exposition's instant
        assert (sample.transferring_age is None) == (whole.transferring_age is None)
        assert replace(sample, transferring_age=None) == replace(whole, transferring_age=None)
        seen.append(sample)
    assert [s.inflight for s in seen] == [0, 1, 2, 1]
    assert seen[0].peers is not None and seen[3].peers is not None
    assert seen[3].peers.outcomes["198.18.0.9"][contract.OUTCOME_DEADLINE] == 1


def pod(**overrides: object) -> dict:
    obj: dict = {
        "metadata": {"name": "m-prefill-abc", "uid": "u1", "labels": {contract.LABEL_ROLE: "prefill"}},
        "spec": {
            "containers": [
                {
                    "ports": [
                        {"name": "http", "containerPort": 30000},
                        {"name": "metrics", "containerPort": 9555},
                    ]
                }
            ]
        },
        "status": {
            "phase": "Running",
            "podIP": "127.0.3.4",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    for key, value in overrides.items():
        obj[key] = value
    return obj


def test_pod_view_and_metrics_url() -> None:
    view = pod_view(pod())
    assert view is not None and (view.name, view.role, view.ready, view.terminating) == (
        "m-prefill-abc",
        "prefill",
        True,
        False,
    )
    assert metrics_url(pod()) == "http://127.0.3.4:9555/metrics"
    terminating = pod(
        metadata={
            "name": "x",
            "uid": "u2",
            "deletionTimestamp": "2026-01-01T00:00:00Z",
            "labels": {contract.LABEL_ROLE: "decode"},
        }
    )
    assert pod_view(terminating).terminating  # type: ignore[union-attr]
    assert metrics_url(terminating) is None
    assert metrics_url(pod(status={"phase": "Pending"})) is None
    assert pod_view(pod(status={"phase": "Running", "podIP": "1.2.3.4"})).ready is False  # type: ignore[union-attr]
    assert (
        pod_view(pod(metadata={"name": "r", "uid": "u3", "labels": {contract.LABEL_ROLE: "router"}})) is None
    )
    no_ports = pod(spec={"containers": [{}]})
    assert metrics_url(no_ports) == f"http://127.0.3.4:{contract.DEFAULT_METRICS_PORT}/metrics"


def test_operator_metric_names_follow_the_contract() -> None:
    from prometheus_client import generate_latest

    m = OperatorMetrics()
    m.wedged_pods.labels("ns", "m", "prefill").set(1)
    m.unobserved_pods.labels("ns", "m", "decode").set(2)
    m.remediations.labels("ns", "m", "restart", "deleted").inc()
    m.scrape_errors.labels("ns", "m", "decode").inc()
    m.scrape_duration.labels("ns", "m").observe(0.2)
    m.budget_exhausted.labels("ns", "m").set(1)
    text = generate_latest(m.registry).decode()
    for name in (
        contract.METRIC_OPERATOR_WEDGED_PODS,
        contract.METRIC_OPERATOR_UNOBSERVED_PODS,
        contract.METRIC_OPERATOR_REMEDIATIONS_TOTAL,
        contract.METRIC_OPERATOR_SCRAPE_ERRORS_TOTAL,
        contract.METRIC_OPERATOR_SCRAPE_DURATION + "_bucket",
        contract.METRIC_OPERATOR_BUDGET_EXHAUSTED,
    ):
        assert f"\n{name}{{" in text, name
    assert 'action="restart"' in text and 'outcome="deleted"' in text
    m.forget("ns", "m")
    assert "pdwarden_operator_wedged_pods{" not in generate_latest(m.registry).decode()


def test_the_operator_exports_its_own_process_cpu_memory_and_collections() -> None:
    """What a fleet costs the operator, readable from its page (the watchdog bench reads its
    garbage collections per window from it)."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    families = {
        f.name: f
        for f in text_string_to_metric_families(generate_latest(OperatorMetrics().registry).decode())
    }
    assert families["process_cpu_seconds"].samples[0].value > 0
    assert families["process_resident_memory_bytes"].samples[0].value > 1 << 20
    assert {s.labels["generation"] for s in families["python_gc_collections"].samples} == {"0", "1", "2"}


def test_a_gone_models_series_all_leave_the_page_and_no_other_models() -> None:
    """Every metric labelled with a model is in `per_model`, and forgetting a model drops its
    series from each of them (counters and histograms too), not another model's."""
    from prometheus_client.metrics import MetricWrapperBase

    m = OperatorMetrics()
    labelled = [
        metric
        for metric in vars(m).values()
        if isinstance(metric, MetricWrapperBase) and {"namespace", "model"} <= set(metric._labelnames)
    ]
    assert {id(x) for x in labelled} == {id(x) for x in m.per_model}
    for model in ("gone", "kept"):
        for metric in labelled:
            child: Any = metric.labels(**{n: model if n == "model" else "x" for n in metric._labelnames})
            child.observe(1) if hasattr(child, "observe") else child.inc()
    m.forget("x", "gone")
    models = {s.labels.get("model") for family in m.registry.collect() for s in family.samples}
    assert "gone" not in models and "kept" in models
    kept = {
        family.name for family in m.registry.collect() if any(s.labels.get("model") for s in family.samples)
    }
    assert len(kept) == len(labelled)

"""The test kit's simulated fleet on the local cluster: a model's pods run on its node without
processes, the operator's real watchdog scrapes and judges every one at its own address, and a
pod the fleet wedges is restarted alone. A second fleet for the same cluster is refused."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pdwarden_contract as contract
from pdwarden_localcluster.cluster import ClusterInfo
from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.cluster_env import Env, operator_metric, remediations
from pdwarden_testkit.fleet.model import fleet_model
from pdwarden_testkit.fleet.process import FleetProcess
from pdwarden_testkit.fleet.runtimes import MODE_ANNOTATION

# cluster_exclusive: the fleet registers a Node, which every other e2e module would see (its
# network is an IPv6 namespace of its own, apart from the processes of integration modules)
pytestmark = [pytest.mark.e2e, pytest.mark.cluster_exclusive]


@pytest.fixture(scope="module")
def fleet(cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetProcess]:
    with FleetProcess(cluster.kubeconfig, log_path=tmp_path_factory.mktemp("fleet") / "fleet.log") as proc:
        yield proc


def _runtime_pods(env: Env, model: str) -> list[dict[str, Any]]:
    return [p for role in contract.RUNTIME_ROLES for p in env.pods(model, role)]


def test_the_watchdog_judges_every_simulated_pod_and_restarts_only_the_wedged_one(
    fleet: FleetProcess, env: Env
) -> None:
    env.create_model(fleet_model(env.namespace, "sim", prefill=3, decode=3, interval=2))
    op = env.start_operator()

    def running() -> list[dict[str, Any]]:
        pods = _runtime_pods(env, "sim")
        ok = [p for p in pods if p["status"].get("phase") == "Running"]
        return ok if len(ok) == 6 else []

    pods = wait_for(running, 120, "six runtime pods Running on the fleet", 1.0)
    assert {p["spec"]["nodeName"] for p in pods} == {fleet.name}
    assert all(":" in p["status"]["podIP"] for p in pods)
    # every pod observed (scraped and parsed) and none wedged, over several rounds
    wait_for(
        lambda: operator_metric(op, f"{contract.METRIC_OPERATOR_ROUND_SECONDS}_count") >= 4,
        120,
        "four watchdog rounds",
        1.0,
    )
    assert operator_metric(op, contract.METRIC_OPERATOR_UNOBSERVED_PODS) == 0
    assert operator_metric(op, contract.METRIC_OPERATOR_WEDGED_PODS) == 0
    assert operator_metric(op, contract.METRIC_OPERATOR_SCRAPE_ERRORS_TOTAL) == 0

    victim = sorted(env.pods("sim", contract.ROLE_PREFILL), key=lambda p: p["metadata"]["name"])[0]
    others = {p["metadata"]["uid"] for p in pods} - {victim["metadata"]["uid"]}
    env.call(
        "PATCH",
        f"/api/v1/namespaces/{env.namespace}/pods/{victim['metadata']['name']}",
        {"metadata": {"annotations": {MODE_ANNOTATION: "wedged"}}},
        content_type="application/merge-patch+json",
    )
    done = wait_for(
        lambda: remediations(env, "sim", victim["metadata"]["name"]),
        120,
        f"a remediation of wedged pod {victim['metadata']['name']}",
        1.0,
    )
    assert done[0]["action"] == "restart", done
    wait_for(
        lambda: victim["metadata"]["uid"] not in {p["metadata"]["uid"] for p in _runtime_pods(env, "sim")},
        60,
        "the wedged pod to be gone",
        1.0,
    )
    # the healthy pods were left alone, and the Deployment replaced the restarted one
    assert others <= {p["metadata"]["uid"] for p in _runtime_pods(env, "sim")}
    assert len(remediations(env, "sim")) == 1
    wait_for(lambda: len(running()) == 6, 60, "the replacement Running", 1.0)


def test_a_second_fleet_for_the_same_cluster_is_refused_naming_the_first(
    fleet: FleetProcess, cluster: ClusterInfo, tmp_path: Path
) -> None:
    second = FleetProcess(cluster.kubeconfig, log_path=tmp_path / "second.log", name="pdwarden-fleet-1")
    proc = subprocess.run(second.command(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "a simulated fleet already runs for this cluster" in proc.stderr
    assert fleet.proc is not None and f"pid {fleet.proc.pid}" in proc.stderr
    assert fleet.proc.poll() is None  # the first one still runs

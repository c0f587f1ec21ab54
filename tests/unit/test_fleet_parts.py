"""The simulated fleet's pure parts: its addresses, the pod status it writes, and bodies the
watchdog reads exactly as it reads a runtime's (a serving pod healthy, a wedged one wedged)."""

from __future__ import annotations

import ipaddress
import time

import pytest

import pdwarden_contract as contract
from pdwarden_localcluster.network import plan
from pdwarden_operator.models import parse_spec
from pdwarden_operator.watchdog.history import PodScrape
from pdwarden_operator.watchdog.parse import parse_metrics
from pdwarden_operator.watchdog.rule import judge
from pdwarden_operator.watchdog.targets import metrics_url, pod_view
from pdwarden_operator.watchdog.verdict import VerdictState
from pdwarden_testkit.fleet import placement, pod_status
from pdwarden_testkit.fleet.addresses import FLEET_RANGE, FleetPlan
from pdwarden_testkit.fleet.model import fleet_model
from pdwarden_testkit.fleet.runtimes import MODE_ANNOTATION, FleetRuntimes, Mode, mode_of

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("base", [30000, 31000, 45600])
def test_a_fleets_addresses_lie_in_the_benchmarking_range_and_differ_per_cluster(base: int) -> None:
    fleet, other = FleetPlan(plan(base)), FleetPlan(plan(base + 100))
    whole = ipaddress.ip_network(FLEET_RANGE)
    for prefix in (fleet.pod_prefix, fleet.link_prefix, fleet.pod_pool):
        assert ipaddress.ip_network(prefix).subnet_of(whole)  # type: ignore[arg-type]
    assert not ipaddress.ip_network(fleet.pod_prefix).overlaps(ipaddress.ip_network(other.pod_prefix))
    assert ipaddress.ip_network(fleet.pod_pool).subnet_of(ipaddress.ip_network(fleet.pod_prefix))  # type: ignore[arg-type]
    assert fleet.netns.startswith(plan(base).prefix)  # `cluster down` removes it with the rest
    assert len(fleet.host_link) <= 15  # a Linux interface name
    assert fleet.holds(str(ipaddress.ip_network(fleet.pod_pool).network_address + 7))
    assert not fleet.holds("198.18.0.7") and not fleet.holds("not an address")


def _pod(**meta: object) -> dict[str, object]:
    return {
        "metadata": {
            "name": "m-prefill-0",
            "uid": "u1",
            "labels": {contract.LABEL_ROLE: contract.ROLE_PREFILL},
            **meta,
        },
        "spec": {
            "initContainers": [{"name": "init", "image": "i"}],
            "containers": [
                {"name": "runtime", "image": "r", "ports": [{"name": "metrics", "containerPort": 9400}]}
            ],
        },
    }


def test_the_written_status_is_a_ready_running_pod_the_watchdog_scrapes_at_its_address() -> None:
    pod = _pod()
    pod["status"] = pod_status.running(pod, "2001:2:0:3::9", "2026-12-03T00:00:00Z")
    view = pod_view(pod)
    assert view is not None and view.ready and view.role == contract.ROLE_PREFILL
    assert metrics_url(pod) == "http://[2001:2:0:3::9]:9400/metrics"
    status = pod["status"]
    assert isinstance(status, dict)
    assert [c["name"] for c in status["initContainerStatuses"]] == ["init"]
    assert all(c["ready"] and "running" in c["state"] for c in status["containerStatuses"])


def test_placement_selects_the_fleets_node_and_tolerates_only_its_taint() -> None:
    spec = placement.pod_template()["spec"]
    assert spec["nodeSelector"] == {placement.NODE_LABEL: "true"}
    (toleration,) = spec["tolerations"]
    taint = placement.taint()
    assert (toleration["key"], toleration["value"], toleration["effect"]) == (
        taint["key"],
        taint["value"],
        taint["effect"],
    )


@pytest.mark.parametrize("mode", ["serving", "idle"])
def test_a_fleet_models_runtime_pods_carry_its_mode_and_the_operator_takes_its_spec(mode: Mode) -> None:
    body = fleet_model("ns", "m", 2, 2, 10, mode)
    parse_spec(body["spec"])  # the operator's own validation (the pod policy's owned fields too)
    for role in contract.RUNTIME_ROLES:
        template = body["spec"][role]["podTemplate"]
        assert mode_of((template.get("metadata") or {}).get("annotations")) == mode
        assert template["spec"] == placement.pod_template()["spec"]
    assert "metadata" not in body["spec"]["router"]["podTemplate"]


def test_a_pods_mode_comes_from_its_annotation_and_anything_else_serves() -> None:
    assert mode_of(None) == "serving"
    assert mode_of({MODE_ANNOTATION: "wedged"}) == "wedged"
    assert mode_of({MODE_ANNOTATION: "idle"}) == "idle"
    assert mode_of({MODE_ANNOTATION: "WEDGED"}) == "serving"


@pytest.mark.parametrize("role", contract.RUNTIME_ROLES)
def test_the_watchdog_judges_a_serving_body_healthy_and_a_wedged_one_wedged(role: str) -> None:
    fleet = FleetRuntimes().start()
    try:
        history: dict[str, list[PodScrape]] = {"serving": [], "wedged": [], "idle": []}
        idle_bodies = set()
        for step in range(3):
            for mode in history:
                body, ctype = fleet.body(role, mode)  # type: ignore[arg-type]
                assert ctype.startswith("text/plain")
                history[mode].append(PodScrape(10.0 * step, parse_metrics(body)))
                if mode == "idle":
                    idle_bodies.add(body)
            time.sleep(0.3)  # past the body's lifetime: the serving state moved on
    finally:
        fleet.stop()
    serving, wedged, idle = history["serving"], history["wedged"], history["idle"]
    assert len(idle_bodies) == 1  # rendered again, read the same
    assert idle[-1].sample is not None and (idle[-1].sample.inflight, idle[-1].sample.transfers) == (0, 0)
    assert judge(idle, stuck_after=15).state == VerdictState.OK
    assert serving[-1].sample is not None and serving[-1].sample.transfers > serving[0].sample.transfers  # type: ignore[union-attr]
    assert judge(serving, stuck_after=15).state == VerdictState.OK
    assert wedged[-1].sample is not None and wedged[-1].sample.inflight == 1
    assert judge(wedged, stuck_after=15).state == VerdictState.WEDGED

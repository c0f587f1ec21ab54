"""Multi-node replicas on the local cluster: prefill 1 group x 2 pods, decode 2 groups x 2 pods.

The model becomes Ready with each group's ranks on different nodes; requests through the
router succeed; a worker rank killed from outside gets its whole group restarted by the
operator (one remediation naming the group and the rank) while the other group is left
alone, and traffic recovers; scaling decode from 2 groups to 1 removes a whole group.
A wedge injected into a group's leader (the emulated NIXL port's status race) gets that
whole group restarted, not the leader alone.
The ranks tolerate the GPU taint without asking for GPUs, so that any two nodes will do.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

import pdwarden_contract as contract
from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.cluster_env import EMULATED_PORT_PREFILL, HOST_PLAYS_ROUTER, wedge_pod
from pdwarden_testkit.kubectl import Kubectl
from pdwarden_testkit.operator_process import OperatorProcess

from ._operator_helpers import new_namespace, operator_module_fixtures

pytestmark = pytest.mark.e2e

NS_PREFIX = "pdwe-groups-"
kubectl, operator, _namespace = operator_module_fixtures(NS_PREFIX)
NAME = "grp"
GENERATE_BODY = {"model": NAME, "text": "hello groups", "sampling_params": {"max_new_tokens": 4}}
TOLERATE_GPU_TAINT = {
    "spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
}


def _role(replicas: int, args: list[str] | None = None) -> dict[str, Any]:
    return {
        "replicas": replicas,
        "nodesPerReplica": 2,
        "tensorParallel": 2,
        "podTemplate": TOLERATE_GPU_TAINT,
        "args": args or [],
    }


def _model() -> dict[str, Any]:
    return {
        "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
        "kind": contract.KIND,
        # the leader-wedge test injects the emulated port's race (it wedges only when injected)
        "metadata": {"name": NAME, "annotations": {contract.ANNOTATION_ALLOW_FAULT_INJECTION: "true"}},
        "spec": {
            "model": {"path": "synthetic/tiny", "servedName": NAME},
            "engine": "synthetic",
            "prefill": _role(1, EMULATED_PORT_PREFILL),
            "decode": _role(2),
            "router": {"replicas": 1, "policy": "round_robin"},
            "transfer": {
                "inflightDeadlineSeconds": 25,
                "transferDeadlineSeconds": 20,
                "ucxTransports": "tcp,self",
            },
            **HOST_PLAYS_ROUTER,
            "watchdog": {
                "stuckAfterSeconds": 30,
                "scrapeIntervalSeconds": 5,
                "action": "restart",
                "maxRemediations": 3,
                "budgetWindowSeconds": 600,
                "maxUnavailable": 1,
            },
        },
    }


def _get(k: Kubectl, *args: str) -> Any:
    proc = k.run("get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def _pods(k: Kubectl, ns: str) -> list[dict[str, Any]]:
    body = _get(k, "pods", "-n", ns, "-l", f"{contract.LABEL_MODEL}={NAME}")
    return sorted((body or {}).get("items") or [], key=lambda p: p["metadata"]["name"])


def _group_pods(k: Kubectl, ns: str, group: str) -> list[dict[str, Any]]:
    return [p for p in _pods(k, ns) if p["metadata"]["name"].startswith(f"{group}-")]


def _ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    live = not pod["metadata"].get("deletionTimestamp")
    return live and any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def _groups_ready(k: Kubectl, ns: str, prefill: int, decode: int | None) -> dict[str, Any] | None:
    """The model when Ready with these groups per role, all their pods Ready (decode None:
    whatever decode's group count; this module's other test scales it)."""
    dm = _get(k, "dm", NAME, "-n", ns)
    status = (dm or {}).get("status") or {}
    want = {"prefill": prefill} if decode is None else {"prefill": prefill, "decode": decode}
    for role, n in want.items():
        got = status.get(role) or {}
        if got.get("groups") != n or got.get("readyGroups") != n or got.get("readyPods") != 2 * n:
            return None
    ready: dict[str, Any] = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
    return dm if ready.get("status") == "True" else None


def _generate(k: Kubectl, ns: str) -> dict[str, Any] | None:
    routers = [p for p in _pods(k, ns) if p["metadata"]["labels"].get(contract.LABEL_ROLE) == "router"]
    if not routers or not routers[0].get("status", {}).get("podIP"):
        return None
    url = f"http://{routers[0]['status']['podIP']}:{contract.ROUTER_HTTP_PORT}{contract.GENERATE_PATH}"
    req = urllib.request.Request(
        url, data=json.dumps(GENERATE_BODY).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return dict(json.loads(resp.read())) if resp.status == 200 else None
    except OSError:
        return None


def _remediations(k: Kubectl, ns: str) -> list[dict[str, Any]]:
    return list((((_get(k, "dm", NAME, "-n", ns) or {}).get("status") or {}).get("remediations")) or [])


def _kill(pod: dict[str, Any]) -> None:
    """SIGKILL the rank's process, as a crash would (the kubelet records each container's pid)."""
    from pdwarden_localcluster.cluster import layout

    meta = pod["metadata"]
    pod_dir = layout().pods / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
    pid = json.loads(next(pod_dir.glob("*.pid")).read_text())["pid"]
    os.killpg(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def model(kubectl: Kubectl, operator: OperatorProcess) -> Iterator[str]:
    nodes = (_get(kubectl, "nodes") or {}).get("items") or []
    if len(nodes) < 2:
        pytest.skip("a group's ranks need two nodes (pdwarden cluster up --nodes 2 or more)")
    for ns in new_namespace(kubectl, NS_PREFIX):
        kubectl.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(_model()))
        yield ns


@pytest.mark.timeout(2400)
def test_groups_are_ready_spread_serve_restart_as_a_whole_and_scale_by_groups(
    kubectl: Kubectl, model: str
) -> None:
    ns = model
    wait_for(lambda: _groups_ready(kubectl, ns, 1, 2), 600, "1 prefill and 2 decode groups Ready", 2.0)
    printed = kubectl.run("get", "dm", NAME, "-n", ns).stdout
    assert "1/1 groups, 2/2 pods" in printed and "2/2 groups, 4/4 pods" in printed, printed

    # every group's ranks on different nodes, labelled with their group and rank
    wait_for(
        lambda: all(
            p["metadata"]["labels"].get(contract.LABEL_RANK)
            == p["metadata"]["labels"][contract.LABEL_POD_INDEX]
            for p in _pods(kubectl, ns)
            if contract.LABEL_GROUP in p["metadata"]["labels"]
        ),
        60,
        "every group pod labelled with its rank",
        2.0,
    )
    for group in ("grp-prefill-0", "grp-decode-0", "grp-decode-1"):
        pods = _group_pods(kubectl, ns, group)
        assert [p["metadata"]["labels"][contract.LABEL_POD_INDEX] for p in pods] == ["0", "1"], group
        assert len({p["spec"]["nodeName"] for p in pods}) == 2, (group, [p["spec"]["nodeName"] for p in pods])
        assert {p["metadata"]["labels"][contract.LABEL_GROUP] for p in pods} == {group.rsplit("-", 1)[1]}

    answer = wait_for(lambda: _generate(kubectl, ns), 180, "a /generate answer through the router", 2.0)
    assert answer.get("text") is not None, answer

    # a worker rank crashes: its whole group is restarted, the other group is left alone
    victim_group = _group_pods(kubectl, ns, "grp-decode-0")
    other_uids = {p["metadata"]["uid"] for p in _group_pods(kubectl, ns, "grp-decode-1")}
    old_uids = {p["metadata"]["uid"] for p in victim_group}
    before = {e.get("id") for e in _remediations(kubectl, ns)}
    _kill(victim_group[1])

    def remediated() -> dict[str, Any] | None:
        done = [
            e
            for e in _remediations(kubectl, ns)
            if e.get("id") not in before and e.get("pod") == "grp-decode-0" and e.get("outcome") == "deleted"
        ]
        return done[0] if done else None

    entry = wait_for(remediated, 240, "the group's remediation", 2.0)
    # the killed worker is named, not the leader that exited after it
    assert "rank 1 (pod grp-decode-0-1) crashed" in entry["reason"] and entry["role"] == "decode", entry
    # acted on once; a cooldown left by the module's other test (either order) may defer it first
    acted = [
        e["pod"]
        for e in _remediations(kubectl, ns)
        if e.get("id") not in before and not str(e.get("outcome")).startswith("skipped-")
    ]
    assert acted == ["grp-decode-0"], _remediations(kubectl, ns)

    def replaced() -> bool:
        pods = _group_pods(kubectl, ns, "grp-decode-0")
        uids = {p["metadata"]["uid"] for p in pods}
        return len(pods) == 2 and not uids & old_uids and all(_ready(p) for p in pods)

    wait_for(replaced, 600, "both ranks of grp-decode-0 replaced and Ready", 2.0)
    assert {p["metadata"]["uid"] for p in _group_pods(kubectl, ns, "grp-decode-1")} == other_uids
    events = (_get(kubectl, "events", "-n", ns) or {}).get("items") or []
    # (the module's other test restarts the prefill group, in the same namespace)
    restarted = [
        e for e in events if e.get("reason") == "GroupRestarted" and "grp-decode-0" in e.get("message", "")
    ]
    # one Event, on the model (a group is no Pod), naming the group and the rank
    assert [(e["involvedObject"]["kind"], e.get("count", 1)) for e in restarted] == [(contract.KIND, 1)], (
        restarted
    )
    assert "grp-decode-0" in restarted[0]["message"] and "rank 1" in restarted[0]["message"]
    wait_for(lambda: _groups_ready(kubectl, ns, 1, 2), 300, "every group Ready again", 2.0)
    wait_for(lambda: _generate(kubectl, ns), 180, "traffic through the router again", 2.0)

    # scaling decode from 2 groups to 1 removes a whole group
    kubectl.run("patch", "dm", NAME, "-n", ns, "--type", "merge", "-p", '{"spec":{"decode":{"replicas":1}}}')
    wait_for(
        lambda: (
            _get(kubectl, "statefulset", "grp-decode-1", "-n", ns) is None
            and not _group_pods(kubectl, ns, "grp-decode-1")
        ),
        300,
        "group grp-decode-1 removed",
        2.0,
    )
    wait_for(lambda: _groups_ready(kubectl, ns, 1, 1), 300, "1 prefill and 1 decode group Ready", 2.0)
    assert len(_group_pods(kubectl, ns, "grp-decode-0")) == 2
    wait_for(lambda: _generate(kubectl, ns), 180, "traffic through the remaining group", 2.0)


@pytest.mark.timeout(1800)
def test_a_wedge_in_a_groups_leader_restarts_the_whole_group(kubectl: Kubectl, model: str) -> None:
    ns = model
    wait_for(lambda: _groups_ready(kubectl, ns, 1, None), 600, "the model Ready", 2.0)
    wait_for(lambda: _generate(kubectl, ns), 180, "a /generate answer through the router", 2.0)
    group = "grp-prefill-0"
    leader, worker = _group_pods(kubectl, ns, group)
    old_uids = {leader["metadata"]["uid"], worker["metadata"]["uid"]}
    decode_uids = {
        p["metadata"]["uid"] for p in _pods(kubectl, ns) if p["metadata"]["name"].startswith("grp-decode-")
    }
    decode_leader = next(p for p in _pods(kubectl, ns) if p["metadata"]["name"].endswith("-decode-0-0"))
    before = {e.get("id") for e in _remediations(kubectl, ns)}

    # the emulated port's status race, triggered on the leader: a room stuck in its inflight queue
    wedge_pod(leader, decode_leader)

    def remediated() -> dict[str, Any] | None:
        done = [
            e
            for e in _remediations(kubectl, ns)
            if e.get("id") not in before and e.get("outcome") == "deleted"
        ]
        return done[0] if done else None

    entry = wait_for(remediated, 240, "the group's remediation", 2.0)
    # one entry for the group (not its pods one by one), naming the wedged rank
    assert entry["pod"] == group and entry["role"] == "prefill", entry
    assert f"rank 0 (pod {leader['metadata']['name']}) is wedged" in entry["reason"], entry
    # every new entry names the group, and one remediation acted: the wedge may have waited
    # out the cooldown of this module's other test first (a skipped-cooldown entry)
    new = [e for e in _remediations(kubectl, ns) if e.get("id") not in before]
    assert {e["pod"] for e in new} == {group}, new
    assert [e["outcome"] for e in new if not e["outcome"].startswith("skipped-")] == ["deleted"], new

    def replaced() -> bool:
        pods = _group_pods(kubectl, ns, group)
        uids = {p["metadata"]["uid"] for p in pods}
        return len(pods) == 2 and not uids & old_uids and all(_ready(p) for p in pods)

    # both ranks, the healthy worker too: its peer's new incarnation could not join it
    wait_for(replaced, 600, f"both ranks of {group} replaced and Ready", 2.0)
    now_decode = {
        p["metadata"]["uid"] for p in _pods(kubectl, ns) if p["metadata"]["name"].startswith("grp-decode-")
    }
    assert now_decode <= decode_uids, "a decode group was touched"
    wait_for(lambda: _groups_ready(kubectl, ns, 1, None), 300, "the model Ready again", 2.0)
    wait_for(lambda: _generate(kubectl, ns), 180, "traffic through the router again", 2.0)

"""`pdwarden cluster down` leaves nothing of the cluster on the host, even after its kubelet
was killed without a chance to clean up: no process, mount, cgroup, network namespace, link,
route or nftables table. A cluster of its own (own state directory and port base)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pdwarden_localcluster import network, procs, teardown
from pdwarden_localcluster.cluster import Ports
from pdwarden_localcluster.waits import pod_ready, wait_for
from pdwarden_testkit.kubectl import Kubectl
from tests.support.clusters import free_cluster_base

# a second local cluster beside the shared one, its kubelet killed
pytestmark = [pytest.mark.e2e, pytest.mark.exclusive]

PDWARDEN = str(Path(sys.executable).parent / "pdwarden")
NODES = 2  # a CPU node and a GPU node


def _pdwarden(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PDWARDEN, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _pod(name: str, node: str, scratch: str) -> dict[str, Any]:
    """A pod pinned to `node` with a memory-backed emptyDir at `scratch` (a path the host lacks)
    and a memory limit (a tmpfs, a mount point and a cgroup where the kubelet makes them)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 30,
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "command": ["sleep", "3600"],
                    "resources": {"limits": {"memory": "64Mi"}},
                    "volumeMounts": [{"name": "scratch", "mountPath": scratch}],
                }
            ],
            "volumes": [{"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}}],
        },
    }


def _cgroup_with_a_process(state: Path) -> tuple[Path, subprocess.Popen[bytes]]:
    """A cgroup named like the cluster's kubelet's, under this process's own memory cgroup (v2:
    its unified cgroup), holding a process of its own."""
    own = Path("/proc/self/cgroup").read_text().splitlines()
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").is_file()
    if v2:
        rel = next(line.split(":", 2)[2] for line in own if line.startswith("0:"))
        base = Path("/sys/fs/cgroup") / rel.lstrip("/")
    else:
        rel = next(line.split(":", 2)[2] for line in own if "memory" in line.split(":")[1].split(","))
        base = Path("/sys/fs/cgroup/memory") / rel.lstrip("/")
    group = base / teardown.cgroup_name(state) / "podleft" / "main"
    group.mkdir(parents=True)
    proc = subprocess.Popen(["sleep", "3600"], start_new_session=True)
    (group / "cgroup.procs").write_text(str(proc.pid))
    return group.parent.parent, proc


def test_down_after_a_killed_kubelet_leaves_no_process_mount_cgroup_or_network(tmp_path: Path) -> None:
    base = free_cluster_base(NODES)
    state = tmp_path / "state"
    env = {
        **os.environ,
        "PDWARDEN_STATE_DIR": str(state),
        "PDWARDEN_CLUSTER_PORT_BASE": str(base),
        "PDWARDEN_CLUSTER_NODES": str(NODES),
        "PDWARDEN_CLUSTER_CPU_NODES": "1",
    }
    net = Ports(base).net
    mount_point = f"/pdwe-teardown-{os.urandom(4).hex()}"
    try:
        up = _pdwarden(env, "cluster", "up", "--json")
        assert up.returncode == 0, up.stderr
        info = json.loads(up.stdout)
        kubectl = Kubectl(info["kubeconfig"])
        for i, node in enumerate(info["nodes"]):
            kubectl.apply(_pod(f"sleeper-{i}", node, f"{mount_point}/{i}/scratch"), "default")
        for i in range(NODES):
            wait_for(
                lambda n=f"sleeper-{i}": pod_ready(kubectl.get("pod", n, "default") or {}),  # type: ignore[misc]
                120,
                f"sleeper-{i} Ready",
            )
        pod_pids = [json.loads(f.read_text())["pid"] for f in (state / "pods").glob("*/*.pid")]
        assert pod_pids, "the pods' processes are recorded"
        present = teardown.leftovers(state)
        assert any(item.startswith("process") for item in present), present
        assert f"mount point {mount_point}" in present  # made on the host for the pods' volumes
        assert f"netns {net.gateway_netns}" in network.leftovers(net)
        # what a kubelet with memory limits and memory-backed volumes leaves when it dies: a
        # cgroup of the cluster with a process in it, a tmpfs under the state directory
        stray_cgroup, stray = _cgroup_with_a_process(state)
        scratch = state / "pods" / "leftover-scratch"
        scratch.mkdir(parents=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(scratch)], check=True, timeout=30
        )
        assert f"mount {scratch}" in teardown.leftovers(state)
        # a crash: the kubelet gets no chance to stop its pods or remove anything
        os.kill(info["processes"]["kubelet"], signal.SIGKILL)
        wait_for(lambda: procs.start_time(info["processes"]["kubelet"]) is None, 30, "the kubelet gone")
        assert all(procs.start_time(pid) is not None for pid in pod_pids), "the pods outlive it"
    finally:
        down = _pdwarden(env, "cluster", "down", timeout=180)
    assert down.returncode == 0, down.stderr
    assert not list((state / "pids").glob("*.json")), "pid files left"
    assert all(procs.start_time(pid) is None for pid in [*info["processes"].values(), *pod_pids, stray.pid])
    assert not stray_cgroup.exists()
    assert teardown.leftovers(state) == []
    assert not Path(mount_point).exists()
    assert network.leftovers(net) == []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    assert net.prefix not in netns
    # nothing of the cluster mounted anywhere (the netns bind mounts under /run/netns included)
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(state) not in mounts and net.prefix not in mounts
    # no cgroup named after the cluster anywhere in the hierarchy
    assert teardown.cgroup_dirs(teardown.cgroup_name(state)) == []

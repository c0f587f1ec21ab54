"""A second local cluster beside the shared one: a port in use is a clear error, and `up`
after a killed run recovers while `down` leaves nothing of it (and keeps the shared one's).

Exclusive: a second control plane and kubelets load the machine the other tests share."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pdwarden_localcluster import network, procs, reserved_ports
from pdwarden_localcluster.cluster import ClusterInfo, Ports, ports
from tests.support.clusters import free_cluster_base

pytestmark = [pytest.mark.e2e, pytest.mark.exclusive]

PDWARDEN = str(Path(sys.executable).parent / "pdwarden")


OTHER_NODES = ["pdwarden-node-0", "pdwarden-node-1"]  # a CPU node and a GPU node


def other_cluster_base() -> int:
    """A port base whose every control-plane and kubelet port is free now (two nodes)."""
    return free_cluster_base(len(OTHER_NODES))


def _other_cluster_env(tmp_path: Path, base: int) -> dict[str, str]:
    return {
        **os.environ,
        "PDWARDEN_STATE_DIR": str(tmp_path / "state"),
        "PDWARDEN_CLUSTER_PORT_BASE": str(base),
        "PDWARDEN_CLUSTER_NODES": str(len(OTHER_NODES)),
        "PDWARDEN_CLUSTER_CPU_NODES": "1",
    }


@pytest.mark.parametrize("holder", ["listener", "connection"])
def test_a_port_in_use_is_a_clear_error_naming_what_holds_it(
    cluster: ClusterInfo, tmp_path: Path, holder: str
) -> None:
    base = other_cluster_base()
    env = _other_cluster_env(tmp_path, base)
    busy_port = Ports(base).apiserver if holder == "listener" else Ports(base).etcd_peer
    me = f"pid {os.getpid()} ("
    with contextlib.ExitStack() as stack:
        busy = stack.enter_context(socket.socket())
        busy.bind(("127.0.0.1", busy_port))
        if holder == "listener":
            busy.listen()
            said = "listens on it"
        else:  # an outgoing connection's local end, as an ephemeral port is held
            server = stack.enter_context(socket.socket())
            server.bind(("127.0.0.1", 0))
            server.listen()
            busy.connect(server.getsockname())
            stack.enter_context(server.accept()[0])
            said = f"holds it as the local end of a connection to 127.0.0.1:{server.getsockname()[1]}"
        proc = subprocess.run(
            [PDWARDEN, "cluster", "up"], env=env, capture_output=True, text=True, timeout=120
        )
    assert proc.returncode == 1
    assert f"port {busy_port} on 127.0.0.1" in proc.stderr and "in use" in proc.stderr
    assert me in proc.stderr and said in proc.stderr, proc.stderr
    assert not set(Ports(base).listening(len(OTHER_NODES))) & reserved_ports.reserved()  # none kept
    assert "Traceback" not in proc.stderr


def test_up_after_a_killed_run_recovers_on_another_base_and_down_leaves_nothing(
    cluster: ClusterInfo, tmp_path: Path
) -> None:
    """The second `up` asks for other ports: the killed run's network and reserved ports go
    with it. `down` from a shell that names no port base stops the cluster on the ports it runs
    on (the state directory's), not the default ones the shared cluster uses."""
    base = other_cluster_base()
    env = _other_cluster_env(tmp_path, base)
    state = tmp_path / "state"
    new: dict = {"processes": {}}
    moved = base
    try:
        first = subprocess.run(
            [PDWARDEN, "cluster", "up", "--json"], env=env, capture_output=True, text=True, timeout=300
        )
        assert first.returncode == 0, first.stderr
        pids = json.loads(first.stdout)["processes"]
        assert set(Ports(base).listening(len(OTHER_NODES))) <= reserved_ports.reserved()
        for name in ("kube-apiserver", "kubelet"):  # a crash: no clean shutdown
            os.kill(pids[name], signal.SIGKILL)
        moved = other_cluster_base()
        second = subprocess.run(
            [PDWARDEN, "cluster", "up", "--json"],
            env={**env, "PDWARDEN_CLUSTER_PORT_BASE": str(moved)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert second.returncode == 0, second.stderr
        assert "stopped leftovers" in second.stderr and "removing etcd data" in second.stderr
        new = json.loads(second.stdout)
        assert new["started"] is True and new["nodes"] == OTHER_NODES
        assert new["server"] == f"https://127.0.0.1:{Ports(moved).apiserver}"
        assert not any(procs.start_time(pid) for pid in pids.values() if pid not in new["processes"].values())
        assert network.leftovers(Ports(base).net) == []  # the killed run's network went
        assert not set(Ports(base).listening(len(OTHER_NODES))) & reserved_ports.reserved()
        assert set(Ports(moved).listening(len(OTHER_NODES))) <= reserved_ports.reserved()
    finally:
        down = subprocess.run(
            [PDWARDEN, "cluster", "down"],
            env={k: v for k, v in env.items() if k != "PDWARDEN_CLUSTER_PORT_BASE"},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert down.returncode == 0, down.stderr
    for rec_file in (state / "pids").glob("*.json"):
        raise AssertionError(f"pid file left behind: {rec_file}")
    assert all(procs.start_time(pid) is None for pid in new["processes"].values())
    assert not set(Ports(moved).listening(len(OTHER_NODES))) & reserved_ports.reserved()
    assert set(ports().listening(len(cluster.nodes))) <= reserved_ports.reserved()  # the shared one's kept
    # no network namespace, link, route or firewall table of that cluster is left
    assert network.leftovers(Ports(moved).net) == []
    assert network.leftovers(ports().net) != []  # the shared cluster's network is untouched
    assert network.blackhole_present()  # the running test cluster's routes still need it

"""What a state directory says of the cluster it ran: its saved settings, the port base among
them, so `down` and a repair act on the running cluster's ports and network whatever
PDWARDEN_CLUSTER_PORT_BASE says in the shell that runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdwarden_localcluster import cluster
from pdwarden_localcluster.cluster import DEFAULT_PORT_BASE, Layout, Settings

pytestmark = pytest.mark.unit


def _kubeconfig(lay: Layout, server: str) -> None:
    lay.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
    doc = cluster.kubeconfig_doc(server, b"ca", b"cert", b"key", user="admin")
    lay.kubeconfig.write_text(json.dumps(doc))


def test_saved_settings_come_back_with_their_port_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lay = Layout(tmp_path)
    cluster._save_settings(lay, Settings(nodes=2, gpus=4, cpu_nodes=1, port_base=30400))
    monkeypatch.setenv("PDWARDEN_CLUSTER_PORT_BASE", "29000")  # another shell's choice
    loaded = cluster._load_settings(lay)
    assert loaded == Settings(nodes=2, gpus=4, cpu_nodes=1, port_base=30400)
    assert loaded.ports.apiserver == 30843


def test_settings_saved_without_a_port_base_take_it_from_the_admin_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lay = Layout(tmp_path)
    (tmp_path / "settings.json").write_text(json.dumps({"nodes": 3, "gpus": 8, "cpu_nodes": 1}))
    _kubeconfig(lay, "https://127.0.0.1:36443")
    monkeypatch.delenv("PDWARDEN_CLUSTER_PORT_BASE", raising=False)
    assert cluster._load_settings(lay).port_base == 36000


def test_a_state_directory_that_never_ran_a_cluster_has_the_ports_the_shell_asks_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PDWARDEN_CLUSTER_PORT_BASE", raising=False)
    assert cluster._load_settings(Layout(tmp_path)) == Settings(port_base=DEFAULT_PORT_BASE)
    monkeypatch.setenv("PDWARDEN_CLUSTER_PORT_BASE", "30100")
    assert cluster._load_settings(Layout(tmp_path)).port_base == 30100
    monkeypatch.setenv("PDWARDEN_CLUSTER_PORT_BASE", "80")
    with pytest.raises(cluster.ClusterError, match="PDWARDEN_CLUSTER_PORT_BASE='80'"):
        cluster._load_settings(Layout(tmp_path))

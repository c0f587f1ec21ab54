"""A second local cluster next to the session's, for tests that start and stop their own."""

from __future__ import annotations

from pdwarden_localcluster import network
from pdwarden_localcluster.cluster import Ports
from pdwarden_testkit.ports import free_port_base


def free_cluster_base(nodes: int, tries: int = 50) -> int:
    """A port base whose control-plane and kubelet ports bind now and whose address slot no
    running cluster's routes hold (two clusters in one slot cannot run at once)."""
    offsets = Ports(0).listening(nodes)
    for _ in range(tries):
        base = free_port_base(offsets)
        if not network.slot_in_use(network.plan(base)):
            return base
    raise RuntimeError(f"no free port base with an unused address slot after {tries} tries")

"""A pod's network namespace: a veth from its node's bridge, its address, /etc/hosts.

Containers run through `ip netns exec <netns>`, which also gives each process its own mount
namespace with the files of /etc/netns/<netns>/ bind-mounted over /etc (hosts, resolv.conf).
All containers of a pod share the namespace, so `localhost` reaches each other's ports.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from pdwarden_localcluster import network
from pdwarden_localcluster.errors import ClusterError
from pdwarden_localcluster.network import ETC_NETNS, IP, NetPlan, ip_cmd


@dataclass(frozen=True)
class PodNet:
    plan: NetPlan
    node: int
    uid: str
    ip: str
    hostname: str
    resolv_conf: str = ""  # empty: the host's /etc/resolv.conf

    @property
    def netns(self) -> str:
        return self.plan.pod_netns(self.uid)

    def exec_prefix(self) -> list[str]:
        """argv prefix that runs a command inside the pod's namespaces."""
        return [IP, "netns", "exec", self.netns]


def hosts_file(ip: str, hostname: str) -> str:
    return f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{ip}\t{hostname}\n"


def setup(pod: PodNet) -> None:
    """Create the namespace afresh (a leftover of an earlier kubelet is replaced)."""
    p, gw = pod.plan, pod.plan.gateway_netns
    teardown(pod)
    veth = network.pod_veth(pod.ip)
    prefix_len = ipaddress.ip_network(p.node_subnet(pod.node)).prefixlen
    try:
        ip_cmd("netns", "add", pod.netns)
        ip_cmd("-n", pod.netns, "link", "set", "lo", "up")
        ip_cmd("-n", gw, "link", "del", veth, check=False)
        ip_cmd("-n", gw, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", pod.netns)
        ip_cmd("-n", gw, "link", "set", veth, "master", p.bridge(pod.node))
        # a pod that dials its own Service may be sent back to itself through the bridge
        ip_cmd("-n", gw, "link", "set", veth, "type", "bridge_slave", "hairpin", "on")
        ip_cmd("-n", gw, "link", "set", veth, "up")
        ip_cmd("-n", pod.netns, "addr", "add", f"{pod.ip}/{prefix_len}", "dev", "eth0")
        ip_cmd("-n", pod.netns, "link", "set", "eth0", "up")
        # no default route: only the cluster's own range is reachable from a pod
        gateway = p.node_gateway(pod.node)
        ip_cmd("-n", pod.netns, "route", "add", network.BENCHMARK_RANGE, "via", gateway, "dev", "eth0")
    except ClusterError:
        teardown(pod)
        raise
    etc = ETC_NETNS / pod.netns
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hosts").write_text(hosts_file(pod.ip, pod.hostname))
    if pod.resolv_conf:
        (etc / "resolv.conf").write_text(pod.resolv_conf)


def teardown(pod: PodNet) -> None:
    """Delete the namespace (its eth0 and the veth's other end go with it) and its /etc files."""
    if pod.netns in network.netns_names():
        ip_cmd("netns", "del", pod.netns, check=False)
    etc = ETC_NETNS / pod.netns
    if etc.is_dir():
        for child in etc.iterdir():
            child.unlink(missing_ok=True)
        etc.rmdir()

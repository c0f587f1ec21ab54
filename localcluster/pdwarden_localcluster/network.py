"""The local cluster's network: addresses (pure) and the host objects that carry them.

Every address lies in the RFC 2544 benchmarking range 198.18.0.0/15, and a blackhole route
for the whole /15 on the host keeps any packet for it from leaving the machine even when a
more specific route is missing. Each cluster (one port base) owns a slot of 16:

- pods: 198.18.<16*slot>.0/20, node i: 198.18.<16*slot+i>.0/24 (its bridge holds .1);
- Services: 198.19.<16*slot>.0/20 (the apiserver's `kubernetes` Service takes .1, DNS .10);
- the link between the host and the cluster: 198.18.<16*slot+15>.0/30 (host .1, cluster .2).

The cluster's bridges and pod veths live in a gateway network namespace of their own
(`pdw<base>-gw`), not in the host's: the Service rules (kube-proxy) and the NetworkPolicy
enforcer (kube-network-policies, `netpolicy.py`) go there too, so two clusters on one host
never share a bridge, a route table or a firewall table. Every packet between two pods passes
that namespace's inet hooks once: routed between two nodes' bridges, or bridged on one node's
(br_netfilter's `bridge-nf-call-iptables`, which the enforcer needs). The host
holds one veth (`pdw<base>h`) into that namespace and two routes through it. Pods get
their own namespaces (`pdw<base>-<pod uid>`) with a veth onto their node's bridge.
`teardown()` deletes the namespaces (which takes their links and rules with them), the host
link (which takes its routes), and the blackhole when no other cluster routes remain.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import ipaddress
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pdwarden_localcluster.errors import ClusterError

BENCHMARK_RANGE = "198.18.0.0/15"
SLOTS = 16
MAX_NODES = 15  # /24 number 15 of the slot is the host link
NETNS_DIR = Path("/run/netns")
ETC_NETNS = Path("/etc/netns")
IP = shutil.which("ip") or "/usr/sbin/ip"  # iproute2; absolute so a pod's PATH cannot change it
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


@dataclass(frozen=True)
class NetPlan:
    base: int  # the cluster's port base: every name and address derives from it

    @property
    def slot(self) -> int:
        return (self.base // 100) % SLOTS

    @property
    def prefix(self) -> str:
        """Prefix of every network namespace of this cluster."""
        return f"pdw{self.base}-"

    @property
    def gateway_netns(self) -> str:
        return f"{self.prefix}gw"

    @property
    def host_link(self) -> str:
        return f"pdw{self.base}h"

    @property
    def uplink(self) -> str:
        """The gateway namespace's end of the host link."""
        return "uplink"

    @property
    def pod_cidr(self) -> str:
        return f"198.18.{16 * self.slot}.0/20"

    @property
    def service_cidr(self) -> str:
        return f"198.19.{16 * self.slot}.0/20"

    @property
    def host_addr(self) -> str:
        """The host's address on the cluster link; pods reach the API server here."""
        return f"198.18.{16 * self.slot + 15}.1"

    @property
    def gateway_addr(self) -> str:
        return f"198.18.{16 * self.slot + 15}.2"

    @property
    def kubernetes_service_ip(self) -> str:
        return f"198.19.{16 * self.slot}.1"

    @property
    def dns_service_ip(self) -> str:
        return f"198.19.{16 * self.slot}.10"

    def node_subnet(self, node: int) -> str:
        if not 0 <= node < MAX_NODES:
            raise ValueError(f"node index {node} out of range (at most {MAX_NODES} nodes)")
        return f"198.18.{16 * self.slot + node}.0/24"

    def node_gateway(self, node: int) -> str:
        """The bridge's address on node `node`'s subnet: the pods' next hop."""
        return str(ipaddress.ip_network(self.node_subnet(node)).network_address + 1)

    def bridge(self, node: int) -> str:
        return f"br{node}"

    def pod_netns(self, uid: str) -> str:
        return f"{self.prefix}{uid}"

    def is_mine(self, netns: str) -> bool:
        return netns.startswith(self.prefix)


def plan(base: int) -> NetPlan:
    return NetPlan(base)


def pod_veth(ip: str) -> str:
    """The gateway-side name of a pod's veth: unique per pod address (at most 15 bytes)."""
    return "v" + ip.split(".", 2)[2].replace(".", "x")


# --- applying -----------------------------------------------------------------------------


def ip_cmd(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `ip` (iproute2); a failure that is not allowed names the command and its error."""
    proc = subprocess.run([IP, *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise ClusterError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def entered(netns: str) -> Iterator[None]:
    """The calling thread in network namespace `netns` for the block; sockets made in it stay
    there. A thread's namespace is its own: the process's other threads stay where they are."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(NETNS_DIR / netns, os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(home)


def netns_names() -> list[str]:
    try:
        return sorted(p.name for p in NETNS_DIR.iterdir())
    except FileNotFoundError:
        return []


def _sysctl(netns: str, key: str, value: str, check: bool = True) -> None:
    ip_cmd("netns", "exec", netns, "sysctl", "-qw", f"{key}={value}", check=check)


def ensure_debian_package(command: str, package: str) -> None:
    """Install `package` with apt-get unless `command` is on PATH already (idempotent)."""
    if shutil.which(command):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", package]):
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
        if proc.returncode != 0:
            raise ClusterError(
                f"`{' '.join(argv)}` failed (the cluster's Services need {command} from Debian's "
                f"{package}): {proc.stderr.strip()[-500:]}"
            )
    if not shutil.which(command):
        raise ClusterError(f"installed Debian's {package}, but {command} is still not on PATH")


def _route_owner(cidr: str) -> str | None:
    """The device the host routes `cidr` through now, if any route for exactly it exists."""
    out = ip_cmd("-o", "route", "show", "exact", cidr, check=False).stdout.split()
    return out[out.index("dev") + 1] if "dev" in out else None


def slot_in_use(p: NetPlan) -> bool:
    """True while another cluster's routes hold this plan's address slot."""
    return any(_route_owner(cidr) not in (None, p.host_link) for cidr in (p.pod_cidr, p.service_cidr))


def ensure(p: NetPlan, nodes: int) -> None:
    """Create (afresh) the gateway namespace, its bridges, the host link and routes."""
    if not 1 <= nodes <= MAX_NODES:
        raise ClusterError(
            f"--nodes must be between 1 and {MAX_NODES} with the cluster network (got {nodes})"
        )
    for cidr in (p.pod_cidr, p.service_cidr):
        owner = _route_owner(cidr)
        if owner is not None and owner != p.host_link:
            raise ClusterError(
                f"{cidr} is routed through {owner} already (another local cluster whose port base "
                f"maps to the same address slot {p.slot}): pick another PDWARDEN_CLUSTER_PORT_BASE "
                f"(now {p.base}; the slot is (base // 100) % {SLOTS})"
            )
    ensure_debian_package("nft", "nftables")  # kube-proxy's nftables mode runs it
    teardown(p, keep_blackhole=True)
    ip_cmd("route", "replace", "blackhole", BENCHMARK_RANGE)
    gw = p.gateway_netns
    ip_cmd("netns", "add", gw)
    ip_cmd("-n", gw, "link", "set", "lo", "up")
    _sysctl(gw, "net.ipv4.ip_forward", "1")
    # bridged traffic between pods passes the Service rules and the NetworkPolicy enforcer's
    # (needs br_netfilter: without it kube-proxy's masquerading still brings replies back
    # through the gateway, and netpolicy.kernel_support refuses to start, naming it)
    _sysctl(gw, "net.bridge.bridge-nf-call-iptables", "1", check=False)
    ip_cmd("link", "add", p.host_link, "type", "veth", "peer", "name", p.uplink, "netns", gw)
    ip_cmd("addr", "add", f"{p.host_addr}/30", "dev", p.host_link)
    ip_cmd("link", "set", p.host_link, "up")
    ip_cmd("-n", gw, "addr", "add", f"{p.gateway_addr}/30", "dev", p.uplink)
    ip_cmd("-n", gw, "link", "set", p.uplink, "up")
    for node in range(nodes):
        br = p.bridge(node)
        ip_cmd("-n", gw, "link", "add", br, "type", "bridge")
        prefix_len = ipaddress.ip_network(p.node_subnet(node)).prefixlen
        ip_cmd("-n", gw, "addr", "add", f"{p.node_gateway(node)}/{prefix_len}", "dev", br)
        ip_cmd("-n", gw, "link", "set", br, "up")
    for cidr in (p.pod_cidr, p.service_cidr):
        ip_cmd("route", "replace", cidr, "via", p.gateway_addr, "dev", p.host_link)


def teardown(p: NetPlan, keep_blackhole: bool = False) -> list[str]:
    """Remove every namespace and link of this cluster; returns what it removed."""
    removed = []
    for name in netns_names():
        if p.is_mine(name):
            ip_cmd("netns", "del", name, check=False)
            _remove_etc_netns(name)
            removed.append(f"netns {name}")
    if ip_cmd("link", "show", p.host_link, check=False).returncode == 0:
        ip_cmd("link", "del", p.host_link, check=False)  # its routes go with it
        removed.append(f"link {p.host_link}")
    if (
        not keep_blackhole
        and not _other_routes_in_range()
        and ip_cmd("route", "del", "blackhole", BENCHMARK_RANGE, check=False).returncode == 0
    ):
        removed.append(f"blackhole route {BENCHMARK_RANGE}")
    return removed


def _remove_etc_netns(name: str) -> None:
    directory = ETC_NETNS / name
    if directory.is_dir():
        for child in directory.iterdir():
            child.unlink(missing_ok=True)
        directory.rmdir()


def _other_routes_in_range() -> bool:
    """True while any route within the benchmarking range (another cluster's) remains."""
    out = ip_cmd("-o", "route", "show", "root", BENCHMARK_RANGE, check=False).stdout
    return any(line and not line.startswith("blackhole") for line in out.splitlines())


def leftovers(p: NetPlan) -> list[str]:
    """What of this cluster's network is present on the host now (empty after teardown)."""
    found = [f"netns {n}" for n in netns_names() if p.is_mine(n)]
    found += [f"/etc/netns/{n.name}" for n in ETC_NETNS.glob(f"{p.prefix}*")]
    if ip_cmd("link", "show", p.host_link, check=False).returncode == 0:
        found.append(f"link {p.host_link}")
    for cidr in (p.pod_cidr, p.service_cidr):
        if _route_owner(cidr) == p.host_link:
            found.append(f"route {cidr}")
    # kube-proxy's and kube-network-policies' tables belong in the gateway namespace; one in the
    # host's would be a leak (and there the policies' queue rules would judge the host's traffic)
    if shutil.which("nft"):
        tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, timeout=30).stdout
        found += [
            f"host nftables {t.strip()}"
            for t in tables.splitlines()
            if t.strip().endswith(" kube-proxy") or " kube-network-policies-" in t
        ]
    return found


def blackhole_present() -> bool:
    out = ip_cmd("-o", "route", "show", "exact", BENCHMARK_RANGE, check=False).stdout
    return out.startswith("blackhole")

"""The fleet's network: a namespace that owns every pod address (an IPv6 local route) and a
veth to the host, which routes the pod prefix through it. Nothing else changes on the host
but the blackhole of the whole benchmarking range, which stays while any fleet's route does.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from pdwarden_localcluster.errors import ClusterError
from pdwarden_localcluster.network import ip_cmd, netns_names
from pdwarden_testkit.fleet.addresses import FLEET_RANGE, FleetPlan


def ipv6_available() -> bool:
    try:
        with open("/proc/sys/net/ipv6/conf/all/disable_ipv6") as f:
            return f.read().strip() == "0"
    except OSError:
        return False


LOCK_DIR = Path("/run/pdwarden-fleet")


@contextlib.contextmanager
def held(p: FleetPlan) -> Iterator[None]:
    """The cluster's one fleet: a second one would take the first's namespace and addresses
    from under it, so it is refused, naming the process that holds them."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    path = LOCK_DIR / f"{p.netns}.lock"
    with open(path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            raise ClusterError(
                f"a simulated fleet already runs for this cluster (pid {lock.read().strip() or '?'}, "
                f"lock {path}): stop it first"
            ) from None
        lock.truncate(0)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        yield


def ensure(p: FleetPlan) -> None:
    """Create (afresh) the fleet's namespace, link and routes; refuses without IPv6."""
    if not ipv6_available():
        raise ClusterError(
            "the simulated fleet needs IPv6 on this machine (net.ipv6.conf.all.disable_ipv6=0): "
            "its pods live in the benchmarking range " + FLEET_RANGE
        )
    teardown(p, keep_blackhole=True)
    ip_cmd("-6", "route", "replace", "blackhole", FLEET_RANGE)
    ns = p.netns
    ip_cmd("netns", "add", ns)
    ip_cmd("-n", ns, "link", "set", "lo", "up")
    ip_cmd("link", "add", p.host_link, "type", "veth", "peer", "name", p.peer_link, "netns", ns)
    # nodad: the addresses are ours alone, and a tentative one would refuse the first scrapes
    ip_cmd("addr", "add", f"{p.host_addr}/64", "dev", p.host_link, "nodad")
    ip_cmd("link", "set", p.host_link, "up")
    ip_cmd("-n", ns, "addr", "add", f"{p.netns_addr}/64", "dev", p.peer_link, "nodad")
    ip_cmd("-n", ns, "link", "set", p.peer_link, "up")
    # every address of the pod prefix is the namespace's own: one listener answers them all
    ip_cmd("-n", ns, "-6", "route", "replace", "local", p.pod_prefix, "dev", "lo")
    ip_cmd("-6", "route", "replace", p.pod_prefix, "via", p.netns_addr, "dev", p.host_link)


def teardown(p: FleetPlan, keep_blackhole: bool = False) -> None:
    if p.netns in netns_names():
        ip_cmd("netns", "del", p.netns, check=False)  # takes the veth pair and its routes
    ip_cmd("link", "del", p.host_link, check=False)
    if not keep_blackhole and not _other_fleet_routes():
        ip_cmd("-6", "route", "del", "blackhole", FLEET_RANGE, check=False)


def _other_fleet_routes() -> bool:
    out = ip_cmd("-6", "-o", "route", "show", "root", FLEET_RANGE, check=False).stdout
    return any(line and not line.startswith("blackhole") for line in out.splitlines())

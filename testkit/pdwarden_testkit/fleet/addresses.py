"""Where the simulated fleet's pods live (pure).

The local cluster's IPv4 slot has room for 15 nodes of 254 pods, far fewer than a fleet, so
the fleet takes IPv6 addresses from the benchmarking range 2001:2::/48 (RFC 5180, the IPv6
twin of the cluster's 198.18.0.0/15), blackholed as a whole like the IPv4 range. Each cluster
(one port base, one slot) gets its own prefixes, so two clusters' fleets never meet.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final

from pdwarden_localcluster.network import NetPlan

FLEET_RANGE: Final = "2001:2::/48"
POOL_PREFIX_LEN: Final = 112  # 65,534 pod addresses per fleet


@dataclass(frozen=True)
class FleetPlan:
    cluster: NetPlan

    @property
    def netns(self) -> str:
        """The fleet's network namespace; the cluster's prefix, so `cluster down` removes it."""
        return f"{self.cluster.prefix}fleet"

    @property
    def host_link(self) -> str:
        return f"pdw{self.cluster.base}f"

    @property
    def peer_link(self) -> str:
        return "fleet0"

    @property
    def pod_prefix(self) -> str:
        return f"2001:2:0:{self.cluster.slot:x}::/64"

    @property
    def pod_pool(self) -> str:
        """The addresses handed to pods (the pool's first host stays the namespace's own)."""
        return f"2001:2:0:{self.cluster.slot:x}::/{POOL_PREFIX_LEN}"

    @property
    def link_prefix(self) -> str:
        return f"2001:2:0:{0x100 + self.cluster.slot:x}::/64"

    @property
    def host_addr(self) -> str:
        return str(ipaddress.ip_network(self.link_prefix).network_address + 1)

    @property
    def netns_addr(self) -> str:
        return str(ipaddress.ip_network(self.link_prefix).network_address + 2)

    def holds(self, address: str) -> bool:
        try:
            return ipaddress.ip_address(address) in ipaddress.ip_network(self.pod_prefix)
        except ValueError:
            return False

"""NetworkPolicy enforcement: kube-network-policies, a process of the cluster in its gateway namespace.

Every node's bridge is in the gateway network namespace (`network.py`), so each packet
between pods passes that namespace's netfilter hooks once: routed between two nodes' bridges,
or bridged between two pods of one node, which br_netfilter (`bridge-nf-call-iptables`) hands
to the same inet hooks. kube-network-policies diverts the first packet of a connection to or
from a pod its node's policies select to an nfqueue and judges it there. One process
(`pdwarden-network-policies`, go-netpol/) runs there with one controller per node, each
watching its own node's pods, with a table `kube-network-policies-<node>` and a queue of its
own: a packet between two nodes' pods is judged by both, as on a cluster.

It authenticates as upstream's DaemonSet does, as the ServiceAccount
kube-system/kube-network-policies bound to upstream's ClusterRole, with a token the cluster
requests for it, and reaches the API server at the host's end of the cluster link (the
kubelet's relay).

Where the kernel cannot do what it needs, start-up refuses with the reason: br_netfilter off
in the gateway namespace (same-node traffic would pass unjudged), or no way to queue packets
to user space. A kernel without nftables' queue expression (CONFIG_NFT_QUEUE) but with
nft_compat and the xtables NFQUEUE target gets the build whose queue rules use that target
(same queue, same verdicts), and start-up says so.
"""

from __future__ import annotations

import functools
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pdwarden_localcluster import build
from pdwarden_localcluster.errors import ClusterError
from pdwarden_localcluster.kubeapi import ApiError, KubeApi
from pdwarden_localcluster.network import IP

JSON = dict[str, Any]
COMPONENT = "kube-network-policies"
NAMESPACE = "kube-system"
NAME = "kube-network-policies"  # its ServiceAccount, ClusterRole and ClusterRoleBinding
TABLE_PREFIX = "kube-network-policies-"
QUEUE_BASE = 100  # node i's queue is QUEUE_BASE + i
METRICS = "127.0.0.1:9080"  # the gateway namespace's loopback: no pod and no host process reaches it
# One token for the process's life: it is no pod, so nothing would refresh a short one, and a
# fresh cluster (new ServiceAccount UID) makes an old one worthless.
TOKEN_SECONDS = 365 * 24 * 3600
BRIDGE_NF = "/proc/sys/net/bridge/bridge-nf-call-iptables"


def rbac() -> list[JSON]:
    """kube-network-policies' install.yaml at the pinned release, less its DaemonSet."""
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": NAME, "namespace": NAMESPACE},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": NAME},
            "rules": [
                {"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["list", "watch"]},
                {
                    "apiGroups": ["networking.k8s.io"],
                    "resources": ["networkpolicies"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
        },
    ]


def table(node: str) -> str:
    return TABLE_PREFIX + node


def queue(index: int) -> int:
    return QUEUE_BASE + index


def argv(binary: Path, netns: str, kubeconfig: Path, nodes: list[str]) -> list[str]:
    return [
        IP,
        "netns",
        "exec",
        netns,
        str(binary),
        f"--kubeconfig={kubeconfig}",
        *(f"--node={n}" for n in nodes),
        f"--nfqueue-id={QUEUE_BASE}",
        f"--metrics-bind-address={METRICS}",
        "--v=2",  # as upstream's DaemonSet: each judged connection and its verdict in the log
    ]


def _in_netns(netns: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([IP, "netns", "exec", netns, *cmd], capture_output=True, text=True, timeout=30)


@dataclass(frozen=True)
class KernelSupport:
    binary: Path
    note: str  # what start-up must say about it; empty when upstream's build runs as it is


@functools.cache
def kernel_support(netns: str) -> KernelSupport:
    """The build this kernel can run, tried in `netns`; a ClusterError says what it lacks."""
    bridged = _in_netns(netns, "cat", BRIDGE_NF)
    if bridged.stdout.strip() != "1":
        raise ClusterError(
            f"NetworkPolicies cannot be enforced: {BRIDGE_NF} in {netns} reads "
            f"{bridged.stdout.strip() or bridged.stderr.strip()!r}, not 1 (br_netfilter, "
            "CONFIG_BRIDGE_NETFILTER): packets between pods of one node would be bridged past "
            "nftables unjudged; the cluster does not start without it"
        )
    plain = build.network_policies_binary()
    tried = _in_netns(netns, str(plain), "--check-queue")
    if tried.returncode == 0:
        return KernelSupport(plain, "")
    xt = build.network_policies_binary(xtqueue=True)
    fallback = _in_netns(netns, str(xt), "--check-queue")
    if fallback.returncode == 0:
        return KernelSupport(
            xt,
            "NOTE: this kernel has no nftables queue expression (CONFIG_NFT_QUEUE): "
            f"{tried.stderr.strip()}. kube-network-policies' queue rules go in as the xtables "
            "NFQUEUE target through nft_compat instead (the same nfnetlink queue and verdicts; "
            f"{build.NETPOL_XT_COMMAND}, go-netpol/_xtqueue/queue.go)",
        )
    raise ClusterError(
        "NetworkPolicies cannot be enforced: this kernel queues no packet to user space, neither "
        f"with nftables' queue expression (CONFIG_NFT_QUEUE: {tried.stderr.strip()}) nor with "
        "the xtables NFQUEUE target through nft_compat (CONFIG_NFT_COMPAT, "
        f"CONFIG_NETFILTER_XT_TARGET_NFQUEUE: {fallback.stderr.strip()}); the cluster does not "
        "start without it"
    )


def apply_rbac(api: KubeApi) -> None:
    """Create the ServiceAccount, ClusterRole and binding (idempotent)."""
    for obj in rbac():
        if obj["kind"] == "ServiceAccount":
            path = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts"
        else:
            path = f"/apis/rbac.authorization.k8s.io/v1/{obj['kind'].lower()}s"
        try:
            api.post(path, obj)
        except ApiError as exc:
            if exc.status != 409:
                raise ClusterError(f"cannot create {obj['kind']} {NAME} for {COMPONENT}: {exc}") from exc


def request_token(api: KubeApi) -> str:
    review = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": TOKEN_SECONDS},
    }
    try:
        out = api.post(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{NAME}/token", review)
    except ApiError as exc:
        raise ClusterError(f"cannot get a token for {NAMESPACE}/{NAME}: {exc}") from exc
    token = (out.get("status") or {}).get("token")
    if not token:
        raise ClusterError(f"the TokenRequest for {NAMESPACE}/{NAME} returned no token")
    return str(token)


def kubeconfig_doc(server: str, ca: Path, token: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": NAME, "user": {"token": token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": NAME}}],
        "current-context": "local",
    }


def write_kubeconfig(api: KubeApi, path: Path, server: str, ca: Path) -> None:
    """Its identity, afresh: the RBAC objects and a new token (a restart gets a new one)."""
    apply_rbac(api)
    doc = kubeconfig_doc(server, ca, request_token(api))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.chmod(0o600)
    tmp.replace(path)


def missing(netns: str, nodes: list[str]) -> list[str]:
    """What of a working enforcer `netns` lacks now: a node's table (its rules, loaded once the
    controller has synced) or its queue's listener. Empty: every node is enforced."""
    tables = _in_netns(netns, "nft", "list", "tables").stdout.split("\n")
    queues = _in_netns(netns, "cat", "/proc/net/netfilter/nfnetlink_queue").stdout.splitlines()
    bound = {line.split()[0] for line in queues if line.split()}
    gaps = [f"table inet {table(n)}" for n in nodes if f"table inet {table(n)}" not in tables]
    gaps += [f"queue {queue(i)}" for i in range(len(nodes)) if str(queue(i)) not in bound]
    return gaps


def judged_addresses(netns: str, node: str) -> set[str]:
    """The IPv4 addresses of `node`'s pods whose connections its controller judges now: those
    its node's policies select (empty while none does, or before the table exists)."""
    out = _in_netns(netns, "nft", "-j", "list", "set", "inet", table(node), "podips-v4")
    if out.returncode != 0:
        return set()
    found: set[str] = set()
    for item in json.loads(out.stdout).get("nftables", []):
        found.update(str(e) for e in (item.get("set") or {}).get("elem", []))
    return found

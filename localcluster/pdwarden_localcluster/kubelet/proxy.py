"""kube-proxy for the cluster, a child of the kubelet, programming the gateway namespace.

All nodes' bridges live in one gateway network namespace, so one kube-proxy (in nftables
mode) serves the cluster. It runs in the host's namespace, where it reaches the API server
on loopback, and its `nft` is a wrapper that runs nftables inside the gateway namespace:
the Service rules never touch the host's own tables, and another cluster's kube-proxy
(its own gateway namespace) never meets them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import yaml

from pdwarden_localcluster.kubelet import streaming
from pdwarden_localcluster.network import IP, NetPlan


def nft_wrapper(directory: Path, netns: str) -> Path:
    nft = shutil.which("nft") or "/usr/sbin/nft"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "nft"
    path.write_text(f'#!/bin/sh\nexec {IP} netns exec {netns} {nft} "$@"\n')
    path.chmod(0o755)
    return directory


def config(
    kubeconfig: Path, node: str, net: NetPlan, healthz_port: int, metrics_port: int
) -> dict[str, object]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node,
        "mode": "nftables",
        "clusterCIDR": net.pod_cidr,
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        # pods share a bridge: a client and the endpoint it is sent to may be neighbours, and
        # the reply must come back through the gateway to be un-NATed
        "masqueradeAll": True,
        # the host's conntrack limits and timeouts are left alone
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def kubeconfig_doc(server: str, ca: Path, cert: Path, key: Path) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "kube-proxy", "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "kube-proxy"}}],
        "current-context": "local",
    }


def start(
    binary: Path,
    state_dir: Path,
    credentials: tuple[str, Path, Path, Path],
    node: str,
    net: NetPlan,
    healthz_port: int,
    metrics_port: int,
) -> subprocess.Popen[bytes]:
    work = state_dir / "kube-proxy"
    work.mkdir(parents=True, exist_ok=True)
    kubeconfig = work / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(kubeconfig_doc(*credentials)))
    kubeconfig.chmod(0o600)
    cfg = work / "config.yaml"
    cfg.write_text(yaml.safe_dump(config(kubeconfig, node, net, healthz_port, metrics_port)))
    wrappers = nft_wrapper(work / "bin", net.gateway_netns)
    env = dict(os.environ, PATH=f"{wrappers}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}")
    return streaming.start_logged_child(state_dir, "kube-proxy", [str(binary), f"--config={cfg}"], env=env)

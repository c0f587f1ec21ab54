"""Cluster DNS: CoreDNS (a child of the kubelet) behind the `kube-system/kube-dns` Service.

CoreDNS runs in the host's network namespace and listens on the host's address on the
cluster link only, reading Services and EndpointSlices from the API server on loopback. The
Service's ClusterIP (the slot's .10) has an EndpointSlice naming that address, so kube-proxy
sends pods' queries there. Nothing forwards names outside cluster.local: no query leaves
the machine. Pods get a resolv.conf naming the Service (see podnet).
"""

from __future__ import annotations

import logging
import subprocess
import threading
from pathlib import Path
from typing import Any

import yaml

from pdwarden_localcluster.kubeapi import ApiError, KubeApi
from pdwarden_localcluster.kubelet import proxy, streaming
from pdwarden_localcluster.network import NetPlan

log = logging.getLogger("pdwarden.kubelet")
CLUSTER_DOMAIN = "cluster.local"
NAMESPACE = "kube-system"
SERVICE = "kube-dns"
MANAGED_BY = "pdwarden-kubelet"
PORTS = [("dns", "UDP"), ("dns-tcp", "TCP")]


def corefile(listen: str, kubeconfig: Path) -> str:
    return (
        ".:53 {\n"
        f"    bind {listen}\n"
        "    errors\n"
        "    cache 5\n"
        f"    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{\n"
        f"        kubeconfig {kubeconfig}\n"
        "        pods insecure\n"
        "        ttl 5\n"
        "    }\n"
        "}\n"
    )


def resolv_conf(net: NetPlan, namespace: str) -> str:
    search = f"{namespace}.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}"
    return f"nameserver {net.dns_service_ip}\nsearch {search}\noptions ndots:5\n"


def service(net: NetPlan) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": NAMESPACE, "labels": {"k8s-app": SERVICE}},
        "spec": {
            "clusterIP": net.dns_service_ip,
            "ports": [
                {"name": name, "protocol": proto, "port": 53, "targetPort": 53} for name, proto in PORTS
            ],
        },
    }


def endpoint_slice(net: NetPlan) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{SERVICE}-coredns",
            "namespace": NAMESPACE,
            "labels": {
                "kubernetes.io/service-name": SERVICE,
                "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [net.host_addr], "conditions": {"ready": True}}],
        "ports": [{"name": name, "protocol": proto, "port": 53} for name, proto in PORTS],
    }


def publish_forever(api: KubeApi, net: NetPlan, stop: threading.Event) -> None:
    """publish() until it succeeds (the API server may still be starting)."""
    while not stop.is_set():
        try:
            publish(api, net)
            return
        except ApiError as exc:
            log.warning("publishing the kube-dns Service: %s; retrying", exc)
            stop.wait(2.0)


def publish(api: KubeApi, net: NetPlan) -> None:
    """Create (or correct) the Service and its EndpointSlice; idempotent."""
    for path, body in (
        (f"/api/v1/namespaces/{NAMESPACE}/services", service(net)),
        (f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices", endpoint_slice(net)),
    ):
        name = body["metadata"]["name"]
        # look first: a POST naming a taken clusterIP fails on the address, not the name
        current = api.get_or_none(f"{path}/{name}")
        if current is None:
            api.post(path, body)
            continue
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        if body["kind"] == "Service":  # clusterIP is immutable; the rest may be corrected
            body["spec"]["clusterIP"] = current["spec"].get("clusterIP")
        api.put(f"{path}/{name}", body)


def start(
    binary: Path, state_dir: Path, credentials: tuple[str, Path, Path, Path], net: NetPlan
) -> subprocess.Popen[bytes]:
    work = state_dir / "coredns"
    work.mkdir(parents=True, exist_ok=True)
    kubeconfig = work / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(proxy.kubeconfig_doc(*credentials)))
    kubeconfig.chmod(0o600)
    conf = work / "Corefile"
    conf.write_text(corefile(net.host_addr, kubeconfig))
    return streaming.start_logged_child(state_dir, "coredns", [str(binary), "-conf", str(conf)], cwd=work)

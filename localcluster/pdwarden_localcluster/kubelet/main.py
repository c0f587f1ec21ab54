"""The process kubelet: `python -m pdwarden_localcluster.kubelet --server ... --nodes N`.

Per Node: a watch on the pods bound to it (with a periodic relist), a heartbeat thread
(Lease every 10 s, Node status every 30 s), and one PodWorker thread per pod.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from pdwarden_localcluster import network, topology
from pdwarden_localcluster.errors import ClusterError
from pdwarden_localcluster.kubeapi import ApiError, KubeApi
from pdwarden_localcluster.kubelet import apirelay, cgroups, dns, logserver, proxy, streaming
from pdwarden_localcluster.kubelet.backoff import BASE_S, CAP_S, BackOff
from pdwarden_localcluster.kubelet.ipam import IpAllocator
from pdwarden_localcluster.kubelet.node import NodeAgent, NodeShape
from pdwarden_localcluster.kubelet.podworker import KubeletConfig, PodWorker
from pdwarden_localcluster.paths import venv_bin
from pdwarden_localcluster.teardown import cgroup_name
from pdwarden_operator.kube.credentials import Credentials

JSON = dict[str, Any]
log = logging.getLogger("pdwarden.kubelet")
NODE_IP = "127.0.0.1"


class NodeLoop:
    def __init__(
        self,
        api: KubeApi,
        cfg: KubeletConfig,
        ips: IpAllocator,
        agent: NodeAgent,
        stop: threading.Event,
        node_index: int,
    ) -> None:
        self.api, self.cfg, self.ips, self.agent, self.stop = api, cfg, ips, agent, stop
        self.node_index = node_index
        self.workers: dict[str, PodWorker] = {}
        self._lock = threading.Lock()

    def watch_forever(self) -> None:
        selector = {"fieldSelector": f"spec.nodeName={self.agent.name}"}
        while not self.stop.is_set():
            try:
                listing = self.api.get("/api/v1/pods", params=selector)
                self._sync([p for p in listing.get("items", [])])
                rv = listing["metadata"]["resourceVersion"]
                for etype, obj in self.api.watch("/api/v1/pods", dict(selector, resourceVersion=rv), 30):
                    if self.stop.is_set():
                        return
                    if etype == "ERROR":
                        break  # e.g. 410 Gone: relist
                    if etype == "BOOKMARK":
                        continue
                    if etype == "DELETED":
                        self._forget(obj)
                    else:
                        self._upsert(obj)
            except ApiError as exc:
                log.warning("node %s pod watch: %s; relisting", self.agent.name, exc)
                self.stop.wait(1.0)
            except Exception:
                log.exception("node %s pod watch failed; relisting", self.agent.name)
                self.stop.wait(1.0)

    def _sync(self, pods: list[JSON]) -> None:
        seen = set()
        for pod in pods:
            seen.add(pod["metadata"]["uid"])
            self._upsert(pod)
        with self._lock:
            stale = [w for uid, w in self.workers.items() if uid not in seen]
        for worker in stale:
            worker.gone()

    def _upsert(self, pod: JSON) -> None:
        uid = pod.get("metadata", {}).get("uid")
        if not uid:
            return
        with self._lock:
            self._reap()
            worker = self.workers.get(uid)
            if worker is None:
                worker = PodWorker(self.api, self.cfg, self.ips, self.agent.name, pod, self.node_index)
                self.workers[uid] = worker
                worker.start()
                log.info("pod %s/%s: started worker", worker.namespace, worker.pod_name)
            else:
                worker.update(pod)

    def _forget(self, pod: JSON) -> None:
        with self._lock:
            worker = self.workers.get(pod.get("metadata", {}).get("uid", ""))
        if worker is not None:
            worker.gone()

    def _reap(self) -> None:
        for uid in [u for u, w in self.workers.items() if w.finished.is_set()]:
            del self.workers[uid]

    def shutdown(self) -> None:
        with self._lock:
            workers = list(self.workers.values())
        for worker in workers:
            worker.shutdown()
        for worker in workers:
            worker.join(timeout=15)


def _serve_endpoint(
    port: int, pods_dir: Path, pki_dir: Path, stop: threading.Event, stream_addr: tuple[str, int] | None
) -> bool:
    try:
        logserver.serve(port, pods_dir, pki_dir, stop, stream_addr)
    except OSError as exc:
        log.error("cannot serve the kubelet endpoint on 127.0.0.1:%d: %s; retrying", port, exc)
        return False
    return True


def _endpoint_later(
    agent: NodeAgent,
    port: int,
    pods_dir: Path,
    pki_dir: Path,
    stop: threading.Event,
    stream_addr: tuple[str, int] | None,
) -> None:
    """Bind the node's endpoint once its port is free (the port lies in the ephemeral range, so
    another process's outgoing connection may hold it for a while), then publish it: until
    then `kubectl logs`/`exec` for that node fail, and `pdwarden cluster logs` still works."""
    while not stop.wait(2.0):
        try:
            logserver.serve(port, pods_dir, pki_dir, stop, stream_addr)
        except OSError:
            continue
        agent.shape = dataclasses.replace(agent.shape, kubelet_port=port)
        while not stop.is_set():
            try:
                agent.heartbeat()
                log.info("node %s: kubelet endpoint on 127.0.0.1:%d", agent.name, port)
                return
            except ApiError as exc:
                log.warning("node %s: publishing its endpoint: %s; retrying", agent.name, exc)
                stop.wait(2.0)
        return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pdwarden-kubelet", description=__doc__)
    parser.add_argument("--server", required=True)
    parser.add_argument("--ca-file", required=True, type=Path)
    parser.add_argument("--cert-file", required=True, type=Path)
    parser.add_argument("--key-file", required=True, type=Path)
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--cpu-nodes", type=int, default=0, help="the first N nodes: CPU only, untainted")
    parser.add_argument("--node-prefix", default=topology.NODE_PREFIX)
    parser.add_argument("--cpu", default="32")
    parser.add_argument("--memory", default="256Gi")
    parser.add_argument("--max-pods", default="110")
    parser.add_argument("--gpus", type=int, default=topology.DEFAULT_GPUS, help="per GPU node")
    parser.add_argument("--kubelet-version", default="v0.0.0")
    parser.add_argument(
        "--kubelet-port",
        type=int,
        default=0,
        help="HTTPS port of node 0 for `kubectl logs` (node i: +i); 0: off",
    )
    parser.add_argument(
        "--network-base",
        type=int,
        required=True,
        help="the cluster's port base: its network namespaces, links and addresses derive from it",
    )
    parser.add_argument(
        "--streaming-binary",
        type=Path,
        default=None,
        help="pdwarden-streaming (exec, port-forward); unset: off",
    )
    parser.add_argument("--kube-proxy-binary", type=Path, default=None, help="kube-proxy; unset: no Services")
    parser.add_argument(
        "--kube-proxy-ports", default="0,0", help="kube-proxy's healthz and metrics ports on loopback"
    )
    parser.add_argument("--coredns-binary", type=Path, default=None, help="CoreDNS; unset: no cluster DNS")
    parser.add_argument("--backoff-base", type=float, default=BASE_S)
    parser.add_argument("--backoff-cap", type=float, default=CAP_S)
    args = parser.parse_args(argv)
    try:
        nodes = topology.plan(args.nodes, args.cpu_nodes, args.gpus, args.node_prefix)
    except ClusterError as exc:
        parser.error(str(exc))
    net = network.plan(args.network_base)
    api_port = int(args.server.rsplit(":", 1)[1])

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s: %(message)s")
    api = KubeApi(Credentials(args.server, args.ca_file, args.cert_file, args.key_file))
    cfg = KubeletConfig(
        node_ip=NODE_IP,
        state_dir=args.state_dir,
        venv_bin=str(venv_bin()),
        server=args.server,
        # as on a cluster: the `kubernetes` Service, whose endpoint is the API relay (cluster.py)
        pod_server=f"https://{net.kubernetes_service_ip}:443",
        net=net,
        cluster_dns=args.coredns_binary is not None,
        ca_file=args.ca_file,
        host_env=dict(os.environ),
        backoff=BackOff(args.backoff_base, args.backoff_cap),
    )
    base_shape = NodeShape(
        cpu=args.cpu,
        memory=args.memory,
        pods=args.max_pods,
        gpus=args.gpus,
        kubelet_version=args.kubelet_version,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    # pods reach the API server through the host's address on the cluster link
    apirelay.serve((net.host_addr, api_port), ("127.0.0.1", api_port), stop)
    pods_dir = args.state_dir / "pods"
    stream_proc, stream_addr = None, None
    if args.streaming_binary is not None:
        try:
            stream_proc, stream_addr = streaming.start(args.streaming_binary, pods_dir)
        except (OSError, RuntimeError) as exc:  # logs still work; exec and port-forward answer 501
            log.error("cannot start the streaming server: %s", exc)
    proxy_proc = None
    if args.kube_proxy_binary is not None:
        healthz, metrics = (int(x) for x in args.kube_proxy_ports.split(","))
        creds = (args.server, args.ca_file, args.cert_file, args.key_file)
        node0 = nodes[0].name
        proxy_proc = proxy.start(args.kube_proxy_binary, args.state_dir, creds, node0, net, healthz, metrics)
    dns_proc = None
    if args.coredns_binary is not None:
        creds = (args.server, args.ca_file, args.cert_file, args.key_file)
        dns_proc = dns.start(args.coredns_binary, args.state_dir, creds, net)
        threading.Thread(
            target=dns.publish_forever, args=(api, net, stop), name="kube-dns", daemon=True
        ).start()
    loops: list[NodeLoop] = []
    for spec in nodes:
        i = spec.index
        ips = IpAllocator(net.node_subnet(i))
        port = args.kubelet_port + i if args.kubelet_port else 0
        serving = port > 0 and _serve_endpoint(port, pods_dir, args.state_dir / "pki", stop, stream_addr)
        shape = dataclasses.replace(
            base_shape, kubelet_port=port if serving else 0, gpus=spec.gpus, pod_cidr=net.node_subnet(i)
        )
        agent = NodeAgent(api, spec.name, NODE_IP, shape)
        if port and not serving:
            threading.Thread(
                target=_endpoint_later,
                args=(agent, port, pods_dir, args.state_dir / "pki", stop, stream_addr),
                name=f"endpoint-{agent.name}",
                daemon=True,
            ).start()
        while not stop.is_set():
            try:
                agent.register()
                break
            except ApiError as exc:
                log.warning("registering node %s: %s; retrying", agent.name, exc)
                stop.wait(1.0)
        loop = NodeLoop(api, cfg, ips, agent, stop, i)
        loops.append(loop)
        threading.Thread(
            target=agent.heartbeat_forever, args=(stop,), name=f"heartbeat-{agent.name}", daemon=True
        ).start()
        threading.Thread(target=loop.watch_forever, name=f"pods-{agent.name}", daemon=True).start()
        log.info("node %s registered", agent.name)

    stop.wait()
    log.info("stopping: killing pod processes")
    for loop in loops:
        loop.shutdown()
    cgroups.Cgroups(cgroup_name(args.state_dir)).remove_all()
    if dns_proc is not None:
        streaming.stop_child(dns_proc, pods_dir, "coredns")
    if proxy_proc is not None:
        streaming.stop_child(proxy_proc, pods_dir, "kube-proxy")
    if stream_proc is not None:
        streaming.stop_child(stream_proc, pods_dir, "streaming")
    return 0


if __name__ == "__main__":
    sys.exit(main())

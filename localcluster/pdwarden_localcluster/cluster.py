"""Start, stop and inspect the embedded local cluster (`pdwarden cluster ...`, `ensure_up()`).

Processes (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, the process
kubelet, the volume provisioner, kube-network-policies) run detached, each recorded in
`<state>/pids/<name>.json`, so they outlive the CLI and `down` finds them. A fresh start
wipes the etcd data and pod directories of an earlier run, so a run that was killed leaves
nothing that trips the next one.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import urllib3
import yaml

from pdwarden_localcluster import (
    build,
    netpolicy,
    network,
    port_holders,
    procs,
    provisioner,
    reserved_ports,
    teardown,
    topology,
)
from pdwarden_localcluster.errors import ClusterError
from pdwarden_localcluster.kubeapi import ApiError, KubeApi
from pdwarden_localcluster.kubelet.container import kill_recorded
from pdwarden_localcluster.paths import state_dir
from pdwarden_localcluster.pki import FRONT_PROXY_CLIENT, Pki, ensure_pki
from pdwarden_operator.kube.credentials import Credentials

Progress = Callable[[str], None]
# Every port of the default cluster (28249-28614) lies below the kernel's ephemeral range
# (32768-60999 by default), where no outgoing connection can take one before `up` binds it,
# and outside the ranges the test kit hands out (pdwarden_testkit/ports.py).
DEFAULT_PORT_BASE = 28000
# Start order; `down` stops them in reverse (the kubelet early, so pods stop while the API is up).
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "provisioner",
    netpolicy.COMPONENT,  # reaches the API server through the kubelet's relay
)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Ports:
    base: int

    @property
    def etcd_client(self) -> int:
        return self.base + 379

    @property
    def etcd_peer(self) -> int:
        return self.base + 380

    @property
    def apiserver(self) -> int:
        return self.base + 443

    @property
    def controller_manager(self) -> int:
        return self.base + 257

    @property
    def scheduler(self) -> int:
        return self.base + 259

    @property
    def net(self) -> network.NetPlan:
        """The cluster's addresses and network names (they derive from the port base)."""
        return network.plan(self.base)

    @property
    def kube_proxy_healthz(self) -> int:
        return self.base + 256

    @property
    def kube_proxy_metrics(self) -> int:
        return self.base + 249

    @property
    def kubelet(self) -> int:
        """Node i's kubelet endpoint (for `kubectl logs`) is this + i."""
        return self.base + 600

    def listening(self, nodes: int) -> list[int]:
        """Every port the cluster's processes listen on, with `nodes` nodes."""
        return [*self.all().values(), *(self.kubelet + i for i in range(nodes))]

    def all(self) -> dict[str, int]:
        return {
            "etcd": self.etcd_client,
            "etcd peer": self.etcd_peer,
            "kube-apiserver": self.apiserver,
            "kube-controller-manager": self.controller_manager,
            "kube-scheduler": self.scheduler,
            "kube-proxy healthz": self.kube_proxy_healthz,
            "kube-proxy metrics": self.kube_proxy_metrics,
        }


def ports() -> Ports:
    raw = os.environ.get("PDWARDEN_CLUSTER_PORT_BASE", str(DEFAULT_PORT_BASE))
    if not raw.isdigit() or not 1024 <= int(raw) <= 65000:
        raise ClusterError(f"PDWARDEN_CLUSTER_PORT_BASE={raw!r}: want a number between 1024 and 65000")
    return Ports(int(raw))


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd-data"

    @property
    def pods(self) -> Path:
        return self.root / "pods"

    @property
    def volumes(self) -> Path:
        """Directories of the local PersistentVolumes (`provisioner`)."""
        return self.root / "volumes"

    @property
    def pki(self) -> Pki:
        return Pki(self.root / "pki")

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    def component_kubeconfig(self, who: str) -> Path:
        return self.root / f"kubeconfig-{who}"

    def pid_file(self, name: str) -> Path:
        return self.pids / f"{name}.json"

    def log_file(self, name: str) -> Path:
        return self.logs / f"{name}.log"


@dataclass
class ClusterInfo:
    kubeconfig: Path
    server: str
    state_dir: Path
    kubernetes_version: str
    nodes: list[str]
    started: bool  # True when this call started the cluster (so the caller may stop it)
    processes: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "kubeconfig": str(self.kubeconfig),
            "server": self.server,
            "state_dir": str(self.state_dir),
            "kubernetes_version": self.kubernetes_version,
            "nodes": self.nodes,
            "started": self.started,
            "processes": self.processes,
            "seconds": round(self.seconds, 1),
        }


def layout() -> Layout:
    return Layout(state_dir())


def node_names(settings: Settings) -> list[str]:
    return [n.name for n in settings.node_plan()]


@contextlib.contextmanager
def _locked(lay: Layout) -> Iterator[None]:
    lay.root.mkdir(parents=True, exist_ok=True)
    with (lay.root / "lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def admin_api(lay: Layout | None = None) -> KubeApi:
    lay = lay or layout()
    pki = lay.pki
    return KubeApi(
        Credentials(
            f"https://127.0.0.1:{_load_settings(lay).ports.apiserver}",
            pki.ca_cert,
            pki.client_cert("admin"),
            pki.client_key("admin"),
        ),
        timeout=5.0,
    )


def _records(lay: Layout) -> dict[str, procs.Recorded]:
    out = {}
    for name in COMPONENTS:
        rec = procs.read_record(lay.pid_file(name))
        if rec is not None:
            out[name] = rec
    return out


def _healthy(lay: Layout) -> bool:
    recs = _records(lay)
    if set(recs) != set(COMPONENTS) or not all(r.alive() for r in recs.values()):
        return False
    if not lay.pki.complete():
        return False
    try:
        return admin_api(lay).request("GET", "/readyz", timeout=3.0) is not None
    except (ApiError, ValueError):
        return False


# --- up ---------------------------------------------------------------------------------


def ensure_up(
    nodes: int | None = None,
    gpus: int = topology.DEFAULT_GPUS,
    progress: Progress = _stderr,
    cpu_nodes: int | None = None,
) -> ClusterInfo:
    """The running cluster, started first if it is not up. `started` says which.

    `nodes` and `cpu_nodes` default to PDWARDEN_CLUSTER_NODES and PDWARDEN_CLUSTER_CPU_NODES
    (`topology`); a running cluster is reused as it is.
    """
    lay = layout()
    nodes = topology.default_nodes() if nodes is None else nodes
    cpu_nodes = topology.default_cpu_nodes(nodes) if cpu_nodes is None else cpu_nodes
    settings = Settings(nodes=nodes, gpus=gpus, cpu_nodes=cpu_nodes, port_base=ports().base)
    settings.node_plan()  # a bad count is an error before anything runs
    with _locked(lay):
        running = _load_settings(lay)
        if running.port_base != settings.port_base:
            if _healthy(lay):
                progress(
                    f"the running cluster listens on port base {running.port_base}, not on "
                    f"{settings.port_base} (PDWARDEN_CLUSTER_PORT_BASE or the default): "
                    "starting it afresh there"
                )
            return _start(lay, settings, running, progress)
        if _healthy(lay):
            _reserve_ports(running.ports, running.nodes, progress)  # one started before they were
            _upgrade_kubelet(lay, progress)
            return _info(lay, started=False)
        if _repair(lay, progress):
            return _info(lay, started=False)
        return _start(lay, settings, running, progress)


# The code each long-running Python component runs besides the standard library and the venv.
CODE = {
    # build.py: where the monitoring images' binaries are (kubelet/images.py)
    "kubelet": (
        "kubelet/*.py",
        "kubeapi.py",
        "procs.py",
        "network.py",
        "topology.py",
        "errors.py",
        "build.py",
        "gomod.py",
    ),
    "provisioner": ("provisioner.py", "kubeapi.py", "pki.py"),
}


def python_environment(python: str | None = None) -> Path:
    """The environment an interpreter belongs to: its bin directory's parent (a virtualenv's
    root). `.venv/bin/python` and `.venv/bin/python3` are one environment: `python -m pytest`
    runs the one and the `pdwarden` script's shebang names the other, and each difference
    restarted the kubelet, killing every pod of the tests running beside it."""
    return Path(python or sys.executable).absolute().parent.parent


def code_fingerprint(component: str, python: str | None = None) -> str:
    """Hash of a Python component's code and environment: one running older code, or from
    another checkout's virtualenv (whose code its pods would run), is restarted."""
    digest = hashlib.sha256()
    digest.update(str(python_environment(python)).encode())
    package = Path(__file__).resolve().parent
    for path in sorted({p for pattern in CODE[component] for p in package.glob(pattern)}):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def kubelet_fingerprint(python: str | None = None) -> str:
    return code_fingerprint("kubelet", python)


def _fingerprint_file(lay: Layout, component: str) -> Path:
    return lay.root / f"{component}.fingerprint"


def _upgrade_kubelet(lay: Layout, progress: Progress) -> None:
    """Restart the kubelet (its pods restart, keep their IPs) or the provisioner if its code
    changed since it started."""
    stale = []
    for component in CODE:
        try:
            running = _fingerprint_file(lay, component).read_text().strip()
        except OSError:
            running = ""
        if running != code_fingerprint(component):
            stale.append(component)
    if not stale:
        return
    progress(
        f"the code or virtualenv of {' and '.join(stale)} changed since it started: restarting it"
        + (" (its pods restart)" if "kubelet" in stale else "")
    )
    _stop_recorded(lay, grace=5.0, only=stale)
    _repair(lay, progress)


up = ensure_up


def _info(lay: Layout, started: bool, seconds: float = 0.0) -> ClusterInfo:
    names: list[str] = []
    api = admin_api(lay)
    try:
        listing = api.get("/api/v1/nodes", params={"labelSelector": "pdwarden.io/local-node=true"})
        names = [n["metadata"]["name"] for n in listing.get("items", [])]
    except ApiError:
        pass
    return ClusterInfo(
        kubeconfig=lay.kubeconfig,
        server=api.creds.server,
        state_dir=lay.root,
        kubernetes_version=build.kubernetes_version(),
        nodes=names,
        started=started,
        processes={name: rec.pid for name, rec in _records(lay).items() if rec.alive()},
        seconds=seconds,
    )


@dataclass(frozen=True)
class Settings:
    """What `up` was asked for; saved so a repair restarts the kubelet the same way."""

    nodes: int = topology.DEFAULT_NODES
    gpus: int = topology.DEFAULT_GPUS
    cpu_nodes: int = topology.DEFAULT_CPU_NODES
    # where it listens and which address slot it holds: `down` and a repair use the running
    # cluster's, whatever PDWARDEN_CLUSTER_PORT_BASE says in the shell that runs them
    port_base: int = DEFAULT_PORT_BASE

    @property
    def ports(self) -> Ports:
        return Ports(self.port_base)

    def node_plan(self) -> list[topology.NodeSpec]:
        return topology.plan(self.nodes, self.cpu_nodes, self.gpus)


def _save_settings(lay: Layout, settings: Settings) -> None:
    (lay.root / "settings.json").write_text(json.dumps(settings.__dict__) + "\n")


def _kubeconfig_port_base(lay: Layout) -> int | None:
    """The port base of a cluster whose settings predate `port_base`: its admin kubeconfig's
    server is https://127.0.0.1:<base + 443>."""
    try:
        doc = yaml.safe_load(lay.kubeconfig.read_text())
        server = doc["clusters"][0]["cluster"]["server"]
        return int(server.rsplit(":", 1)[1]) - Ports(0).apiserver
    except (OSError, yaml.YAMLError, LookupError, TypeError, ValueError):
        return None


def _load_settings(lay: Layout) -> Settings:
    """The settings the state directory's cluster was started with (the defaults, on the
    ports PDWARDEN_CLUSTER_PORT_BASE says, where none was ever started)."""
    try:
        data = json.loads((lay.root / "settings.json").read_text())
        base = data.get("port_base") or _kubeconfig_port_base(lay) or ports().base
        return Settings(
            nodes=int(data["nodes"]),
            gpus=int(data["gpus"]),
            cpu_nodes=int(data.get("cpu_nodes", 0)),
            port_base=int(base),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return Settings(port_base=ports().base)


def _argv(name: str, lay: Layout, bins: Path, p: Ports, settings: Settings) -> list[str]:
    pki = lay.pki
    if name == "etcd":
        return [
            str(bins / "pdwarden-etcd"),
            f"--data-dir={lay.etcd_data}",
            f"--listen-client-url=http://127.0.0.1:{p.etcd_client}",
            f"--listen-peer-url=http://127.0.0.1:{p.etcd_peer}",
        ]
    if name == "kube-apiserver":
        return _apiserver_args(bins, lay, pki, p)
    if name == "kube-controller-manager":
        return [
            str(bins / "kube-controller-manager"),
            f"--kubeconfig={lay.component_kubeconfig('controller-manager')}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={p.controller_manager}",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--root-ca-file={pki.ca_cert}",
            f"--cluster-signing-cert-file={pki.ca_cert}",
            f"--cluster-signing-key-file={pki.ca_key}",
            "--use-service-account-credentials=true",
        ]
    if name == "kube-scheduler":
        return [
            str(bins / "kube-scheduler"),
            f"--kubeconfig={lay.component_kubeconfig('scheduler')}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={p.scheduler}",
        ]
    if name == "kubelet":
        return [
            sys.executable,
            "-m",
            "pdwarden_localcluster.kubelet",
            f"--server=https://127.0.0.1:{p.apiserver}",
            f"--ca-file={pki.ca_cert}",
            f"--cert-file={pki.client_cert('kubelet')}",
            f"--key-file={pki.client_key('kubelet')}",
            f"--state-dir={lay.root}",
            f"--nodes={settings.nodes}",
            f"--cpu-nodes={settings.cpu_nodes}",
            f"--gpus={settings.gpus}",
            f"--kubelet-version={build.kubernetes_version()}",
            f"--kubelet-port={p.kubelet}",
            f"--network-base={p.base}",
            f"--streaming-binary={bins / build.STREAMING_COMMAND}",
            f"--kube-proxy-binary={bins / 'kube-proxy'}",
            f"--coredns-binary={build.coredns_binary()}",
            f"--kube-proxy-ports={p.kube_proxy_healthz},{p.kube_proxy_metrics}",
        ]
    if name == netpolicy.COMPONENT:
        netns = p.net.gateway_netns
        binary = netpolicy.kernel_support(netns).binary
        return netpolicy.argv(binary, netns, lay.component_kubeconfig(name), node_names(settings))
    if name == "provisioner":
        return [
            sys.executable,
            "-m",
            "pdwarden_localcluster.provisioner",
            f"--server=https://127.0.0.1:{p.apiserver}",
            f"--ca-file={pki.ca_cert}",
            f"--cert-file={pki.client_cert('provisioner')}",
            f"--key-file={pki.client_key('provisioner')}",
            f"--volumes-dir={lay.volumes}",
        ]
    raise ValueError(f"unknown component {name!r}")


def _wait_ready(name: str, lay: Layout, p: Ports, settings: Settings) -> None:
    api = admin_api(lay)
    if name == "etcd":
        _wait(lay, name, lambda: _http_ok(f"http://127.0.0.1:{p.etcd_client}/health"), 60)
    elif name == "kube-apiserver":
        _wait(lay, name, lambda: _api_ok(api, "/readyz"), 180)
    elif name == "kube-controller-manager":
        _wait(lay, name, lambda: _http_ok(f"https://127.0.0.1:{p.controller_manager}/healthz"), 120)
        _wait(
            lay,
            name,
            lambda: _api_ok(api, "/api/v1/namespaces/default/serviceaccounts/default"),
            120,
            what="ServiceAccount default/default",
        )
    elif name == "kube-scheduler":
        _wait(lay, name, lambda: _http_ok(f"https://127.0.0.1:{p.scheduler}/healthz"), 120)
    elif name == "kubelet":
        for node in node_names(settings):
            _wait(lay, name, lambda n=node: _node_ready(api, n), 120, what=f"node {node} Ready")  # type: ignore[misc]
    elif name == "provisioner":
        path = f"/apis/storage.k8s.io/v1/storageclasses/{provisioner.CLASS_NAME}"
        _wait(lay, name, lambda: _api_ok(api, path), 60, what=f"StorageClass {provisioner.CLASS_NAME}")
    elif name == netpolicy.COMPONENT:
        netns, nodes = p.net.gateway_netns, node_names(settings)
        try:
            _wait(lay, name, lambda: not netpolicy.missing(netns, nodes), 120, what=f"{name} in {netns}")
        except ClusterError as exc:
            raise ClusterError(f"{exc}\nnot there: {', '.join(netpolicy.missing(netns, nodes))}") from None


@contextlib.contextmanager
def _stop_on_failure(lay: Layout, names: list[str]) -> Iterator[None]:
    """If start-up fails or is interrupted (Ctrl-C, SIGTERM), stop what this call started."""

    def on_signal(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old_term = signal.signal(signal.SIGTERM, on_signal)
    try:
        yield
    except KeyboardInterrupt as exc:
        _stop_recorded(lay, grace=5.0, only=names)
        raise ClusterError(f"interrupted ({exc or 'Ctrl-C'}); stopped the processes it had started") from None
    except BaseException:
        _stop_recorded(lay, grace=5.0, only=names)
        raise
    finally:
        signal.signal(signal.SIGTERM, old_term)


def _start(lay: Layout, settings: Settings, earlier: Settings, progress: Progress) -> ClusterInfo:
    """Start afresh with `settings`; `earlier` are those of the state directory's last run."""
    begun = time.monotonic()
    settings.node_plan()  # a clear error for a bad count
    leftovers = _stop_recorded(lay, grace=5.0)
    leftovers += teardown.clean(lay.root)
    if earlier.port_base != settings.port_base:  # its network and reserved ports are not ours
        leftovers += _release_host(earlier, keep_blackhole=True)
    if leftovers:
        progress(f"stopped leftovers of an earlier run: {', '.join(leftovers)}")
    bins = build.ensure_built(progress)
    p = settings.ports
    _reserve_ports(p, settings.nodes, progress)
    try:
        _check_ports_free(p, settings.nodes, progress)
    except ClusterError:  # nothing starts: keep no reservation either
        with contextlib.suppress(OSError):
            reserved_ports.release(p.listening(settings.nodes))
        raise
    _reset_run_state(lay, progress)
    network.ensure(p.net, settings.nodes)
    # a kernel that cannot enforce NetworkPolicies is refused before anything runs
    netpolicy.kernel_support(p.net.gateway_netns)
    ensure_pki(lay.root / "pki", [p.net.host_addr, p.net.kubernetes_service_ip])
    _write_kubeconfigs(lay, p)
    _save_settings(lay, settings)
    with _stop_on_failure(lay, list(COMPONENTS)):
        # etcd and the apiserver must be up before the rest; the others start together
        for name in COMPONENTS[:2]:
            _spawn(lay, name, _argv(name, lay, bins, p, settings), progress)
            _wait_ready(name, lay, p, settings)
        for name in COMPONENTS[2:]:
            _spawn(lay, name, _argv(name, lay, bins, p, settings), progress)
        for name in COMPONENTS[2:]:
            _wait_ready(name, lay, p, settings)
    return _info(lay, started=True, seconds=time.monotonic() - begun)


def _repair(lay: Layout, progress: Progress) -> bool:
    """etcd and the apiserver serve, but a later component died: restart only that one.

    Keeps the cluster's objects (other users' namespaces survive). False if it cannot.
    """
    recs = _records(lay)
    core_alive = all(n in recs and recs[n].alive() for n in COMPONENTS[:2])
    if not core_alive or not lay.pki.complete() or not _api_ok(admin_api(lay), "/readyz"):
        return False
    dead = [n for n in COMPONENTS[2:] if n not in recs or not recs[n].alive()]
    if not dead:
        return True
    settings = _load_settings(lay)
    p, bins = settings.ports, build.ensure_built(progress)
    progress(f"restarting {', '.join(dead)} (the rest of the cluster is running)")
    _reserve_ports(p, settings.nodes, progress)  # a cluster started before ports were reserved
    with _stop_on_failure(lay, dead):
        for name in dead:
            if name == "kubelet":  # its pods' processes died with it or must go now
                for pid_file in lay.pods.glob("*/*.pid"):
                    kill_recorded(pid_file)
            _spawn(lay, name, _argv(name, lay, bins, p, settings), progress)
        for name in dead:
            _wait_ready(name, lay, p, settings)
    return True


def _apiserver_args(bins: Path, lay: Layout, pki: Pki, p: Ports) -> list[str]:
    return [
        str(bins / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{p.etcd_client}",
        "--bind-address=127.0.0.1",
        # The `kubernetes` Service's endpoint: the kubelet's API relay on the host's end of the
        # cluster link (same port), so pods reach the API through the Service's ClusterIP.
        f"--advertise-address={p.net.host_addr}",
        f"--secure-port={p.apiserver}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        f"--service-cluster-ip-range={p.net.service_cidr}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        "--authorization-mode=RBAC",
        # As on hardened clusters (OpenShift's default): setting blockOwnerDeletion on a child
        # needs `update` on the owner's finalizers subresource, which the chart must grant.
        "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
        "--allow-privileged=true",
        # `kubectl logs` reaches the process kubelet at its node's InternalIP (127.0.0.1)
        "--kubelet-preferred-address-types=InternalIP",
        "--enable-priority-and-fairness=false",
        "--profiling=false",
        f"--cert-dir={lay.root / 'pki' / 'generated'}",
        "--event-ttl=30m",
        # The aggregation layer, as kubeadm sets it up: APIServices (an external metrics API
        # for HPA) are reached with the front proxy's client cert and the caller in headers.
        f"--requestheader-client-ca-file={pki.front_proxy_ca_cert}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.front_proxy_client_cert}",
        f"--proxy-client-key-file={pki.front_proxy_client_key}",
    ]


def _grant(lay: Layout) -> None:
    """The provisioner's ClusterRole and binding (idempotent; with the admin's credentials)."""
    api = admin_api(lay)
    for obj in provisioner.rbac():
        kind = "clusterroles" if obj["kind"] == "ClusterRole" else "clusterrolebindings"
        try:
            api.post(f"/apis/rbac.authorization.k8s.io/v1/{kind}", obj)
        except ApiError as exc:
            if exc.status != 409:
                raise ClusterError(f"cannot grant the volume provisioner its role: {exc}") from exc


def _spawn(lay: Layout, name: str, argv: list[str], progress: Progress) -> None:
    if name == "provisioner":
        _grant(lay)
    if name == netpolicy.COMPONENT:
        p = _load_settings(lay).ports
        server = f"https://{p.net.host_addr}:{p.apiserver}"  # from the gateway namespace
        netpolicy.write_kubeconfig(admin_api(lay), lay.component_kubeconfig(name), server, lay.pki.ca_cert)
        if note := netpolicy.kernel_support(p.net.gateway_netns).note:
            progress(note)
    rec = procs.spawn_detached(name, argv, lay.log_file(name), lay.pid_file(name))
    if name in CODE:
        _fingerprint_file(lay, name).write_text(code_fingerprint(name) + "\n")
    progress(f"started {name} (pid {rec.pid}, log {lay.log_file(name)})")


def _wait(lay: Layout, name: str, check: Callable[[], bool], timeout: float, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    rec = procs.read_record(lay.pid_file(name))
    while time.monotonic() < deadline:
        if check():
            return
        if rec is not None and not rec.alive():
            raise ClusterError(
                f"{name} exited during start-up; last lines of {lay.log_file(name)}:\n{_tail(lay, name)}"
            )
        time.sleep(0.3)
    log = lay.log_file(name)
    raise ClusterError(
        f"{what or name} not ready after {timeout:.0f}s; last lines of {log}:\n{_tail(lay, name)}"
    )


def _tail(lay: Layout, name: str, lines: int = 20) -> str:
    try:
        return "\n".join(lay.log_file(name).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _http_ok(url: str) -> bool:
    try:
        with warnings_off():
            return requests.get(url, timeout=2, verify=False).status_code == 200
    except requests.RequestException:
        return False


@contextlib.contextmanager
def warnings_off() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        yield


def _api_ok(api: KubeApi, path: str) -> bool:
    try:
        api.request("GET", path, timeout=3.0)
    except (ApiError, ValueError):
        return False
    return True


def _node_ready(api: KubeApi, name: str) -> bool:
    try:
        node = api.get(f"/api/v1/nodes/{name}")
    except ApiError:
        return False
    conds = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _reserve_ports(p: Ports, nodes: int, progress: Progress) -> None:
    try:
        reserved_ports.reserve(p.listening(nodes))
    except OSError as exc:
        progress(
            f"cannot reserve the cluster's ports in {reserved_ports.SYSCTL} ({exc}): an outgoing "
            "connection may take one of them, and a component that restarts then cannot bind it"
        )


def _held_by(port: int) -> str:
    """Who holds a busy port, and why that can happen to it, for the error that names it."""
    said = "; ".join(port_holders.describe(port)) or f"a socket `ss -tanp | grep :{port}` shows"
    with contextlib.suppress(OSError, ValueError):
        low, high = reserved_ports.ephemeral_range()
        if low <= port <= high:
            said += (
                f"; it lies in the kernel's ephemeral range ({low}-{high}), where any outgoing "
                f"connection may take it: a base whose ports stay below {low} avoids that"
            )
    return said


def _check_ports_free(p: Ports, nodes: int, progress: Progress) -> None:
    """The control plane's ports must be free. A node's endpoint port (`kubectl logs`/`exec`)
    may be held for a while by another process's connection: the kubelet binds it once it is
    free, so that is only said."""
    for i in range(nodes):
        if not _port_free(p.kubelet + i):
            progress(
                f"port {p.kubelet + i} (kubelet endpoint of node {i}) is in use ({_held_by(p.kubelet + i)}): "
                "`kubectl logs` and `exec` on that node work once it is free (`pdwarden cluster logs` "
                "works now)"
            )
    for what, port in p.all().items():
        if not _port_free(port):
            raise ClusterError(
                f"port {port} on 127.0.0.1 (for {what}) is in use ({_held_by(port)}): stop that, or "
                "run `pdwarden cluster down` if it is a leftover local cluster, or pick other ports "
                f"with PDWARDEN_CLUSTER_PORT_BASE=<n> (now {p.base})"
            ) from None


def _reset_run_state(lay: Layout, progress: Progress) -> None:
    """A fresh start: no etcd data and no pod directories from an earlier run."""
    for pid_file in lay.pods.glob("*/*.pid"):
        kill_recorded(pid_file)
    if lay.etcd_data.exists():
        progress(f"removing etcd data of an earlier run ({lay.etcd_data})")
        shutil.rmtree(lay.etcd_data)
    shutil.rmtree(lay.pods, ignore_errors=True)
    shutil.rmtree(lay.volumes, ignore_errors=True)  # their PersistentVolumes went with etcd's data
    lay.logs.mkdir(parents=True, exist_ok=True)
    for name in COMPONENTS:  # keep one previous log per component for post-mortems
        log = lay.log_file(name)
        if log.exists():
            log.replace(log.with_suffix(".log.prev"))


def _write_kubeconfigs(lay: Layout, p: Ports) -> None:
    pki = lay.pki
    server = f"https://127.0.0.1:{p.apiserver}"
    for who, path in (
        ("admin", lay.kubeconfig),
        ("controller-manager", lay.component_kubeconfig("controller-manager")),
        ("scheduler", lay.component_kubeconfig("scheduler")),
    ):
        doc = kubeconfig_doc(
            server,
            pki.ca_cert.read_bytes(),
            pki.client_cert(who).read_bytes(),
            pki.client_key(who).read_bytes(),
            user=who,
        )
        tmp = path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
        tmp.chmod(0o600)
        tmp.replace(path)


def kubeconfig_doc(server: str, ca: bytes, cert: bytes, key: bytes, user: str) -> dict[str, Any]:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "pdwarden-local", "cluster": {"server": server, "certificate-authority-data": b64(ca)}}
        ],
        "users": [
            {"name": user, "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)}}
        ],
        "contexts": [{"name": "pdwarden-local", "context": {"cluster": "pdwarden-local", "user": user}}],
        "current-context": "pdwarden-local",
    }


# --- down / status ------------------------------------------------------------------------


def _stop_recorded(lay: Layout, grace: float, only: list[str] | None = None) -> list[str]:
    stopped = []
    for name in reversed(COMPONENTS):
        if only is not None and name not in only:
            continue
        rec = procs.read_record(lay.pid_file(name))
        if rec is None:
            continue
        if procs.stop(rec, grace=25.0 if name == "kubelet" else grace):
            stopped.append(name)
        lay.pid_file(name).unlink(missing_ok=True)
    if only is None or "kubelet" in only:
        # pod processes of a kubelet that was killed before it could stop them
        for pid_file in lay.pods.glob("*/*.pid"):
            kill_recorded(pid_file)
    return stopped


def _release_host(settings: Settings, keep_blackhole: bool) -> list[str]:
    """Give back what a cluster run with `settings` claimed on the host: its network (returns
    what went) and its reserved ports."""
    removed = network.teardown(settings.ports.net, keep_blackhole=keep_blackhole)
    with contextlib.suppress(OSError):  # none were reserved where the kernel refused them
        reserved_ports.release(settings.ports.listening(settings.nodes))
    return removed


def down(progress: Progress = _stderr) -> list[str]:
    """Stop every process the cluster started (pods included). Returns the names stopped."""
    lay = layout()
    with _locked(lay):
        running = _load_settings(lay)
        stopped = _stop_recorded(lay, grace=10.0)
        # what a killed kubelet could not clean: stray processes, its cgroups, mounts
        removed = teardown.clean(lay.root)
        removed += _release_host(running, keep_blackhole=False)
    if removed:
        progress(f"removed: {', '.join(removed)}")
    progress(f"stopped: {', '.join(stopped)}" if stopped else "the local cluster was not running")
    return stopped


def status() -> dict[str, Any]:
    lay = layout()
    recs = _records(lay)
    components = {
        name: {
            "pid": recs[name].pid if name in recs else None,
            "running": name in recs and recs[name].alive(),
        }
        for name in COMPONENTS
    }
    ready = _healthy(lay)
    info: dict[str, Any] = {"running": ready, "components": components, "state_dir": str(lay.root)}
    if ready:
        info.update(_info(lay, started=False).as_dict())
        with contextlib.suppress(ApiError):
            info["server_version"] = admin_api(lay).get("/version").get("gitVersion")
    return info

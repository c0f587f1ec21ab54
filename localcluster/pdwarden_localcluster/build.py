"""Build the control-plane binaries from Go modules, cached outside the checkout.

`ensure_built()` produces kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy,
pdwarden-etcd and pdwarden-streaming in `<cache>/bin/<key>/`, where the key names the pinned
kubernetes version and a hash of the Go sources and the Go toolchain version. A hit costs a
stat; a miss builds (about 4 min cold on 2 cores, every module downloaded) under a file lock so
concurrent callers build once. CoreDNS and kube-network-policies come from Go modules of their
own, each cached the same way under a key of its own, and so do the monitoring stack's binaries
(`ensure_monitoring_built()`). `python -m pdwarden_localcluster.build` (`make binaries`, which
`make test` runs before pytest so that no test's time limit is spent on a cold build) builds
them all and prints their directories.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pdwarden_localcluster import gomod
from pdwarden_localcluster.errors import ClusterError
from pdwarden_localcluster.paths import (
    COREDNS_MODULE_DIR,
    GO_MODULE_DIR,
    MONITORING_MODULE_DIR,
    NETPOL_MODULE_DIR,
    cache_dir,
)

KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy")
ETCD_COMMAND = "pdwarden-etcd"
STREAMING_COMMAND = "pdwarden-streaming"  # the kubelet's exec and port-forward endpoints
OWN_COMMANDS = (ETCD_COMMAND, STREAMING_COMMAND)
BINARIES = (*KUBE_COMMANDS, *OWN_COMMANDS)
_COMPLETE_MARKER = ".complete"

Progress = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# where the official Go tarball installs; used when `go` is not on PATH
GO_FALLBACK = Path("/usr/local/go/bin/go")


def go_binary() -> str:
    go = shutil.which("go") or (str(GO_FALLBACK) if GO_FALLBACK.exists() else None)
    if go is None:
        raise ClusterError(
            "the Go toolchain is needed to build the local control plane, and `go` is not on PATH: "
            "install Go >= 1.25 (https://go.dev/dl/) and put its bin directory on PATH"
        )
    return go


def go_env() -> dict[str, str]:
    """Environment for every go command: module and build caches outside the checkout."""
    root = cache_dir() / "go"
    env = dict(os.environ)
    env.update(
        GOMODCACHE=str(root / "mod"),
        GOCACHE=str(root / "build"),
        GOFLAGS="-trimpath -mod=mod",
        CGO_ENABLED="0",
        GOTOOLCHAIN="local",
        GOWORK="off",
    )
    return env


def kubernetes_version() -> str:
    return gomod.pinned_version((GO_MODULE_DIR / "go.mod").read_text())


def _go_sources(module: Path = GO_MODULE_DIR) -> list[Path]:
    return sorted(p for p in module.rglob("*") if p.is_file() and p.suffix in (".go", ".mod"))


def _source_hash(module: Path, recipe: str = "") -> str:
    """Of the module's Go files, the toolchain and `recipe` (what else shapes the binaries)."""
    digest = hashlib.sha256(recipe.encode())
    for path in _go_sources(module):
        digest.update(str(path.relative_to(module)).encode())
        digest.update(path.read_bytes())
    digest.update(_go_version().encode())
    return digest.hexdigest()[:12]


def build_key() -> str:
    """`k8s-<version>-<hash>`: the pin, the Go sources and the toolchain version."""
    return f"k8s-{kubernetes_version()}-{_source_hash(GO_MODULE_DIR)}"


def _go_version() -> str:
    try:
        out = subprocess.run([go_binary(), "env", "GOVERSION"], capture_output=True, text=True, check=True)
    except ClusterError:
        return "no-go"
    return out.stdout.strip()


def bin_dir() -> Path:
    return cache_dir() / "bin" / build_key()


def is_built(directory: Path | None = None) -> bool:
    directory = directory or bin_dir()
    return (directory / _COMPLETE_MARKER).exists() and all((directory / b).exists() for b in BINARIES)


def version_ldflags(version: str) -> str:
    """-X flags so the binaries report the real release (else v0.0.0 and Helm's kubeVersion breaks)."""
    minor = version.split(".")[1]
    pkg = "k8s.io/component-base/version"
    flags = {
        "gitVersion": version,
        "gitMajor": "1",
        "gitMinor": minor,
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
    }
    return "-s -w " + " ".join(f"-X {pkg}.{k}={v}" for k, v in flags.items())


def ensure_built(progress: Progress = _stderr) -> Path:
    """The directory holding the binaries, building them first on a cache miss.

    CoreDNS and kube-network-policies (their own modules and directories, see coredns_binary()
    and network_policies_binary()) are built here too.
    """
    target = bin_dir()
    _locked_build(target, lambda: is_built(target), lambda: _build(target, progress), progress)
    dns = coredns_bin_dir()
    _locked_build(dns, lambda: _coredns_built(dns), lambda: _build_coredns(dns, progress), progress)
    netpol = network_policies_bin_dir()
    _locked_build(
        netpol, lambda: _netpol_built(netpol), lambda: _build_network_policies(netpol, progress), progress
    )
    return target


def _locked_build(
    target: Path, done: Callable[[], bool], build: Callable[[], None], progress: Progress
) -> None:
    if done():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f"{target.name}.lock"
    with lock_path.open("w") as lock:
        progress(f"waiting for the build lock {lock_path} ...")
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done():
            build()


# --- CoreDNS: a module of its own (it needs a newer Go and client-go than kubernetes) -------

COREDNS_COMMAND = "pdwarden-coredns"


def coredns_bin_dir() -> Path:
    return cache_dir() / "bin" / f"coredns-{_source_hash(COREDNS_MODULE_DIR)}"


def coredns_binary() -> Path:
    return coredns_bin_dir() / COREDNS_COMMAND


def _coredns_built(directory: Path) -> bool:
    return (directory / _COMPLETE_MARKER).exists() and (directory / COREDNS_COMMAND).exists()


def _fresh_workdir(module_dir: Path, target: Path) -> Path:
    """A new copy of a Go module to build `target` in (outside the checkout, under the cache)."""
    work = cache_dir() / "gobuild" / target.name
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(module_dir, work)
    return work


def _publish(
    staging: Path, target: Path, names: tuple[str, ...], marker: dict[str, object], log: Path
) -> None:
    """Move a complete build into place atomically: the bin dir appears whole or not at all."""
    for name in names:
        if not (staging / name).exists():
            raise ClusterError(f"go build did not produce {name}; see {log}")
    (staging / _COMPLETE_MARKER).write_text(json.dumps(marker) + "\n")
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)


def _build_commands(
    target: Path,
    parts: list[tuple[Path, dict[str, str]]],
    progress: Progress,
    ldflags: dict[str, str] | None = None,
) -> None:
    """Build each (module directory, {name: package}) part into `target`: a copy of the module
    outside the checkout, `go mod tidy` (which must keep every version the module pins), then
    `go build` of each package (with `ldflags[name]` added to its linker flags)."""
    go = go_binary()
    root = cache_dir() / "gobuild" / target.name
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    log = root / "build.log"
    staging = root / "out"
    staging.mkdir()
    started = time.monotonic()
    jobs = os.environ.get("PDWARDEN_GO_BUILD_JOBS", "2")
    for module_dir, packages in parts:
        work = root / module_dir.name
        shutil.copytree(module_dir, work)
        _run([go, "mod", "tidy"], work, progress, log)
        _check_pins(work, gomod.requirements((module_dir / "go.mod").read_text()), progress, log)
        for name, package in packages.items():
            flags = f"-s -w {(ldflags or {}).get(name, '')}".strip()
            _run(
                [go, "build", "-p", jobs, "-ldflags", flags, "-o", str(staging / name), package],
                work,
                progress,
                log,
            )
        shutil.copy(work / "go.mod", staging / f"{module_dir.name}.go.mod.generated")
        shutil.copy(work / "go.sum", staging / f"{module_dir.name}.go.sum")
    names = tuple(name for _, packages in parts for name in packages)
    _publish(staging, target, names, {"seconds": round(time.monotonic() - started, 1)}, log)
    progress(f"built {', '.join(names)} in {time.monotonic() - started:.0f}s -> {target}")


def _check_pins(work: Path, pins: dict[str, str], progress: Progress, log: Path) -> None:
    """What a module pins is what gets built: a tidy that moved a pin (another requirement
    needing newer) must become a visible change of that go.mod, never a silent one."""
    go = go_binary()
    for module, pinned in pins.items():
        found = json.loads(_run([go, "list", "-m", "-json", module], work, progress, log)).get("Version")
        if found != pinned:
            raise ClusterError(
                f"go mod tidy selects {module} {found} where {work.name}/go.mod pins {pinned}: "
                "raise the pin there"
            )


def _build_coredns(target: Path, progress: Progress) -> None:
    _build_commands(target, [(COREDNS_MODULE_DIR, {COREDNS_COMMAND: f"./cmd/{COREDNS_COMMAND}"})], progress)


# --- the monitoring stack: prometheus-operator, Prometheus and Alertmanager -----------------

MONITORING_MODULE = "github.com/prometheus-operator/prometheus-operator"
PROMETHEUS_MODULE = "github.com/prometheus/prometheus"
ALERTMANAGER_MODULE = "github.com/prometheus/alertmanager"
PROMETHEUS_OPERATOR_COMMAND = "prometheus-operator"
CONFIG_RELOADER_COMMAND = "prometheus-config-reloader"
PROMETHEUS_COMMAND = "prometheus"
ALERTMANAGER_COMMAND = "alertmanager"
# two modules: Prometheus needs an older client-go than the operator
OPERATOR_PART = MONITORING_MODULE_DIR / "operator"
SERVERS_PART = MONITORING_MODULE_DIR / "servers"
MONITORING_PARTS = [
    (
        OPERATOR_PART,
        {
            PROMETHEUS_OPERATOR_COMMAND: f"{MONITORING_MODULE}/cmd/operator",
            CONFIG_RELOADER_COMMAND: f"{MONITORING_MODULE}/cmd/prometheus-config-reloader",
        },
    ),
    (
        SERVERS_PART,
        {
            PROMETHEUS_COMMAND: f"{PROMETHEUS_MODULE}/cmd/prometheus",
            ALERTMANAGER_COMMAND: f"{ALERTMANAGER_MODULE}/cmd/alertmanager",
        },
    ),
]
MONITORING_COMMANDS = tuple(name for _, packages in MONITORING_PARTS for name in packages)


def monitoring_pin(module: str) -> str:
    """The version go-monitoring pins for `module` (in whichever of its modules requires it)."""
    for part, _ in MONITORING_PARTS:
        pins = gomod.requirements((part / "go.mod").read_text())
        if module in pins:
            return pins[module]
    raise ValueError(f"no go.mod under {MONITORING_MODULE_DIR} requires {module}")


def prometheus_operator_version() -> str:
    return monitoring_pin(MONITORING_MODULE)


def prometheus_release(module_version: str) -> str:
    """Prometheus' release for its Go module version: v0.305.0 is v3.5.0, v0.45.1 is v2.45.1
    (the module never left v0; from 3.0 the minor carries the major, times 100)."""
    minor, patch = module_version.removeprefix("v0.").split(".", 1)
    number = int(minor)
    if number >= 300:
        return f"v{number // 100}.{number % 100}.{patch}"
    return f"v2.{number}.{patch}"


def _monitoring_version_flags() -> dict[str, str]:
    """Each binary reports its release (`--version`, build_info metrics), as the image's does."""
    flag = "-X github.com/prometheus/common/version.Version="
    operator = prometheus_operator_version().removeprefix("v")
    return {
        PROMETHEUS_OPERATOR_COMMAND: flag + operator,
        CONFIG_RELOADER_COMMAND: flag + operator,
        PROMETHEUS_COMMAND: flag + prometheus_release(monitoring_pin(PROMETHEUS_MODULE)).removeprefix("v"),
        ALERTMANAGER_COMMAND: flag + monitoring_pin(ALERTMANAGER_MODULE).removeprefix("v"),
    }


def monitoring_bin_dir() -> Path:
    recipe = json.dumps(_monitoring_version_flags(), sort_keys=True)
    key = f"monitoring-{prometheus_operator_version()}-{_source_hash(MONITORING_MODULE_DIR, recipe)}"
    return cache_dir() / "bin" / key


def _monitoring_built(directory: Path) -> bool:
    return (directory / _COMPLETE_MARKER).exists() and all(
        (directory / c).exists() for c in MONITORING_COMMANDS
    )


def ensure_monitoring_built(progress: Progress = _stderr) -> Path:
    """The directory holding the monitoring stack's binaries (built on a miss: only
    `cluster up --monitoring` needs them, so a plain cluster never waits for this build)."""
    target = monitoring_bin_dir()
    _locked_build(
        target,
        lambda: _monitoring_built(target),
        lambda: _build_commands(target, MONITORING_PARTS, progress, ldflags=_monitoring_version_flags()),
        progress,
    )
    return target


# --- kube-network-policies: the NetworkPolicy enforcer, a module of its own -------------------

NETPOL_MODULE = "sigs.k8s.io/kube-network-policies"
NETPOL_COMMAND = "pdwarden-network-policies"
# the same command with the nftables library's queue expression sent as the xtables NFQUEUE
# target (go-netpol/_xtqueue/queue.go), for kernels without nftables' queue expression
NETPOL_XT_COMMAND = "pdwarden-network-policies-xtqueue"
NETPOL_COMMANDS = (NETPOL_COMMAND, NETPOL_XT_COMMAND)
NFTABLES_MODULE = "github.com/google/nftables"
NFTABLES_OVERLAID = "v0.3.0"  # the version whose expr/queue.go _xtqueue/queue.go replaces


def network_policies_version() -> str:
    return gomod.pinned_version((NETPOL_MODULE_DIR / "go.mod").read_text(), NETPOL_MODULE)


def network_policies_bin_dir() -> Path:
    key = f"netpol-{network_policies_version()}-{_source_hash(NETPOL_MODULE_DIR)}"
    return cache_dir() / "bin" / key


def network_policies_binary(xtqueue: bool = False) -> Path:
    return network_policies_bin_dir() / (NETPOL_XT_COMMAND if xtqueue else NETPOL_COMMAND)


def _netpol_built(directory: Path) -> bool:
    return (directory / _COMPLETE_MARKER).exists() and all((directory / c).exists() for c in NETPOL_COMMANDS)


def _build_network_policies(target: Path, progress: Progress) -> None:
    go = go_binary()
    work = _fresh_workdir(NETPOL_MODULE_DIR, target)
    log = work / "build.log"
    started = time.monotonic()
    _run([go, "mod", "tidy"], work, progress, log)
    staging = work / "out"
    staging.mkdir()
    jobs = os.environ.get("PDWARDEN_GO_BUILD_JOBS", "2")
    package = f"./cmd/{NETPOL_COMMAND}"
    _run(
        [go, "build", "-p", jobs, "-ldflags", "-s -w", "-o", str(staging / NETPOL_COMMAND), package],
        work,
        progress,
        log,
    )

    # The xtqueue build: the go command lays no overlay over the module cache, so a copy of the
    # nftables module (its queue.go replaced) stands in for it through a second go.mod.
    found = json.loads(_run([go, "list", "-m", "-json", NFTABLES_MODULE], work, progress, log))
    if found.get("Version") != NFTABLES_OVERLAID:
        raise ClusterError(
            f"{NETPOL_MODULE} now selects {NFTABLES_MODULE} {found.get('Version')}, and "
            f"go-netpol/_xtqueue/queue.go replaces the queue expression of {NFTABLES_OVERLAID}: "
            "check that file against the new version and update NFTABLES_OVERLAID"
        )
    library = work / "nftables-xtqueue"
    shutil.copytree(found["Dir"], library)
    for path in [library, *library.rglob("*")]:  # the module cache's copy is read-only
        path.chmod(path.stat().st_mode | 0o200)
    shutil.copy(work / "_xtqueue" / "queue.go", library / "expr" / "queue.go")
    modfile = work / "go.xtqueue.mod"
    modfile.write_text((work / "go.mod").read_text() + f"\nreplace {NFTABLES_MODULE} => ./{library.name}\n")
    shutil.copy(work / "go.sum", work / "go.xtqueue.sum")
    ldflags = '-s -w -X "main.queueEncoding=xtables NFQUEUE target (nft_compat)"'
    _run(
        [
            go,
            "build",
            "-p",
            jobs,
            f"-modfile={modfile}",
            "-ldflags",
            ldflags,
            "-o",
            str(staging / NETPOL_XT_COMMAND),
            package,
        ],
        work,
        progress,
        log,
    )
    shutil.copy(work / "go.mod", staging / "go.mod.generated")
    shutil.copy(work / "go.sum", staging / "go.sum")
    marker = {
        "kube-network-policies": network_policies_version(),
        "seconds": round(time.monotonic() - started, 1),
    }
    _publish(staging, target, NETPOL_COMMANDS, marker, log)
    progress(f"built {', '.join(NETPOL_COMMANDS)} in {time.monotonic() - started:.0f}s -> {target}")


def _run(cmd: list[str], cwd: Path, progress: Progress, log: Path) -> str:
    progress("$ " + " ".join(cmd))
    with log.open("a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.Popen(cmd, cwd=cwd, env=go_env(), stdout=subprocess.PIPE, stderr=fh, text=True)
        try:
            stdout, _ = proc.communicate()
        except BaseException:  # interrupted: no go process may outlive us and race the next build
            proc.kill()
            proc.wait()
            raise
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise ClusterError(f"`{' '.join(cmd[:3])} ...` failed (exit {proc.returncode}); log {log}:\n{tail}")
    return stdout


def _build(target: Path, progress: Progress) -> None:
    go = go_binary()
    version = kubernetes_version()
    work = _fresh_workdir(GO_MODULE_DIR, target)
    log = work / "build.log"
    started = time.monotonic()

    # 1. The kubernetes go.mod as the proxy serves it -> generated staging replace lines.
    info = json.loads(
        _run([go, "mod", "download", "-json", f"k8s.io/kubernetes@{version}"], work, progress, log)
    )
    if info.get("Error") or not info.get("GoMod"):
        raise ClusterError(f"cannot download k8s.io/kubernetes@{version}: {info.get('Error')}")
    our_go_mod = (work / "go.mod").read_text()
    (work / "go.mod").write_text(gomod.render_go_mod(our_go_mod, Path(info["GoMod"]).read_text()))

    # 2. Resolve (etcd at the version kubernetes selects), then build with version ldflags.
    _run([go, "mod", "tidy"], work, progress, log)
    staging = work / "out"
    staging.mkdir()
    packages = [f"k8s.io/kubernetes/cmd/{name}" for name in KUBE_COMMANDS] + [
        f"./cmd/{c}" for c in OWN_COMMANDS
    ]
    jobs = os.environ.get("PDWARDEN_GO_BUILD_JOBS", "2")
    ldflags = version_ldflags(version)
    _run(
        [go, "build", "-p", jobs, "-ldflags", ldflags, "-o", str(staging) + "/", *packages],
        work,
        progress,
        log,
    )

    # 3. Publish atomically, with the generated module files beside the binaries.
    shutil.copy(work / "go.mod", staging / "go.mod.generated")
    if (work / "go.sum").exists():
        shutil.copy(work / "go.sum", staging / "go.sum")
    marker = {"kubernetes": version, "seconds": round(time.monotonic() - started, 1)}
    _publish(staging, target, BINARIES, marker, log)
    progress(f"built {', '.join(BINARIES)} in {time.monotonic() - started:.0f}s -> {target}")


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        paths = (ensure_built(), ensure_monitoring_built())
    except ClusterError as exc:
        _stderr(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        _stderr("interrupted")
        return 130
    print(*paths, sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

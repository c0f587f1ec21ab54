"""What a cluster leaves on the host besides its recorded processes, found and removed by
`cluster down` even when the kubelet was killed before it could clean up: mounts under the
state directory (memory-backed emptyDirs), the kubelet's cgroups, and any process still
running for the cluster (one whose command line names the state directory, or that sits in
the cluster's cgroups). `leftovers()` says what remains (empty after a clean `down`).

The kubelet's cgroup is `pdwarden-<state dir name>` under its own cgroup (see
`cgroup_name`); that directory is looked for under /sys/fs/cgroup, at any depth up to
`CGROUP_DEPTH`, in the unified hierarchy or the v1 memory and cpu hierarchies.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_DEPTH = 8
MOUNTINFO = Path("/proc/self/mountinfo")


# Mount points the kubelet's sandbox made on the host's filesystem, one path a line (under
# the state dir): a container's volume at a path the host lacks (an image would have it).
CREATED_MOUNT_POINTS = "created-mount-points"


def cgroup_name(state_dir: Path) -> str:
    """The kubelet's cgroup of the cluster whose state lives in `state_dir`: its last name for
    a reader, a digest of the whole path so two clusters in `a/state` and `b/state` never share it."""
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:8]
    return f"pdwarden-{state_dir.name}-{digest}"


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040 ...)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_points(mountinfo: str) -> list[Path]:
    """The mount points listed in a mountinfo text, in mount order."""
    points = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            points.append(Path(_unescape(fields[4])))
    return points


def mounts_under(root: Path, mountinfo: str | None = None) -> list[Path]:
    """Mount points at or under `root`, deepest (latest) first: the order to unmount them."""
    text = mountinfo if mountinfo is not None else MOUNTINFO.read_text()
    root = root.resolve() if mountinfo is None else root
    found = [p for p in mount_points(text) if p == root or root in p.parents]
    return list(reversed(list(dict.fromkeys(found))))


def unmount_under(root: Path) -> list[str]:
    removed = []
    for point in mounts_under(root):
        proc = subprocess.run(["umount", "-l", str(point)], capture_output=True, text=True, timeout=30)
        if proc.returncode == 0:
            removed.append(f"mount {point}")
    return removed


def cgroup_dirs(name: str, root: Path = CGROUP_ROOT, depth: int = CGROUP_DEPTH) -> list[Path]:
    """Every cgroup directory called `name` (the cluster's), searched to `depth` levels."""
    found: list[Path] = []

    def walk(directory: Path, level: int) -> None:
        try:
            children = [c for c in directory.iterdir() if c.is_dir() and not c.is_symlink()]
        except OSError:
            return
        for child in children:
            if child.name == name:
                found.append(child)
            elif level < depth:
                walk(child, level + 1)

    walk(root, 1)
    return sorted(found)


def _subtree(top: Path) -> Iterator[Path]:
    """`top` and its descendants, deepest first (the order rmdir needs)."""
    for dirpath, _dirs, _files in os.walk(top, topdown=False):
        yield Path(dirpath)


def _pids_in(group: Path) -> list[int]:
    pids = []
    for d in _subtree(group):
        with contextlib.suppress(OSError, ValueError):
            pids += [int(x) for x in (d / "cgroup.procs").read_text().split()]
    return pids


def remove_cgroups(name: str, root: Path = CGROUP_ROOT) -> list[str]:
    """Kill what still runs in the cluster's cgroups, then remove them (deepest first)."""
    removed = []
    for top in cgroup_dirs(name, root):
        for pid in _pids_in(top):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for d in _subtree(top):
            for _ in range(50):  # a killed process leaves its group a moment later
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    _wait_a_little()
        if not top.exists():
            removed.append(f"cgroup {top}")
    return removed


def _wait_a_little() -> None:
    time.sleep(0.05)


# programs of a cluster (argv[0]'s name): control plane, kubelet children
PROGRAMS = frozenset(
    {
        "pdwarden-etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kube-proxy",
        "pdwarden-streaming",
        "pdwarden-coredns",
    }
)


def names_state_dir(cmdline: bytes, state_dir: Path) -> bool:
    """True if an argument is the state directory or a path in it (another directory whose
    name merely starts the same does not count)."""
    marker = str(state_dir).encode()
    return any(
        arg == marker
        or arg.startswith(marker + b"/")
        or (b"=" in arg and names_state_dir(arg.split(b"=", 1)[1], state_dir))
        for arg in cmdline.split(b"\0")
    )


def is_cluster_program(cmdline: bytes) -> bool:
    args = cmdline.split(b"\0")
    return Path(args[0].decode(errors="replace")).name in PROGRAMS or b"pdwarden_localcluster" in cmdline


def cluster_processes(state_dir: Path, cgroup: str) -> list[tuple[int, str]]:
    """Processes running for the cluster: a cluster program whose arguments name the state
    directory, or anything in its cgroups. (pid, command line) each; never this process."""
    dirs = {state_dir, state_dir.resolve()}  # as it was passed to the programs, and resolved
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            groups = (entry / "cgroup").read_text()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z" or not cmdline:
            continue
        in_group = any(f"/{cgroup}/" in line or line.endswith(f"/{cgroup}") for line in groups.splitlines())
        if in_group or (is_cluster_program(cmdline) and any(names_state_dir(cmdline, d) for d in dirs)):
            found.append((int(entry.name), cmdline.replace(b"\0", b" ").decode(errors="replace").strip()))
    return found


def kill_cluster_processes(state_dir: Path, cgroup: str) -> list[str]:
    killed = []
    for pid, cmd in cluster_processes(state_dir, cgroup):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed.append(f"process {pid} ({cmd[:80]})")
    return killed


def _only_empties(top: Path) -> bool:
    """`top` holds nothing but empty directories and empty files (what making mount points leaves)."""
    if top.is_symlink() or not top.exists():
        return False
    if top.is_file():
        return top.stat().st_size == 0
    return all(
        (p.is_dir() and not p.is_symlink()) or (p.is_file() and p.stat().st_size == 0) for p in top.rglob("*")
    )


def created_mount_points(state_dir: Path) -> list[Path]:
    """The recorded mount points still on the host and still empty, deepest first."""
    log = state_dir / CREATED_MOUNT_POINTS
    if not log.is_file():
        return []
    found = {Path(line) for line in log.read_text().splitlines() if line.startswith("/")}
    return sorted((p for p in found if _only_empties(p)), key=lambda p: len(p.parts), reverse=True)


def remove_created_mount_points(state_dir: Path) -> list[str]:
    """Take away the mount points the sandbox made, once no container uses them; a path that
    gained content since (someone else's now) is kept. Returns what it removed."""
    removed = []
    for top in created_mount_points(state_dir):
        with contextlib.suppress(OSError):
            if top.is_file():
                top.unlink()
            else:
                for path in sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                    if path.is_dir():
                        path.rmdir()
                    else:
                        path.unlink()
                top.rmdir()
            removed.append(f"mount point {top}")
    (state_dir / CREATED_MOUNT_POINTS).unlink(missing_ok=True)
    return removed


def clean(state_dir: Path) -> list[str]:
    """Remove what the recorded processes' shutdown left behind; returns what it removed."""
    name = cgroup_name(state_dir)
    removed = kill_cluster_processes(state_dir, name)
    removed += remove_cgroups(name)
    removed += unmount_under(state_dir)
    removed += remove_created_mount_points(state_dir)
    return removed


def leftovers(state_dir: Path) -> list[str]:
    """What of the cluster (besides its network: `network.leftovers`) is on the host now."""
    name = cgroup_name(state_dir)
    found = [f"process {pid} ({cmd[:80]})" for pid, cmd in cluster_processes(state_dir, name)]
    found += [f"cgroup {d}" for d in cgroup_dirs(name)]
    found += [f"mount {p}" for p in mounts_under(state_dir)]
    found += [f"mount point {p}" for p in created_mount_points(state_dir)]
    return found

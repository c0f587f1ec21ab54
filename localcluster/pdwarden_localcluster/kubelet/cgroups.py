"""Per-container cgroups: memory and CPU limits, OOM kills counted, removed with the pod.

cgroup v2 (memory.max, cpu.max, memory.events) where /sys/fs/cgroup is the unified
hierarchy with the memory controller; otherwise the v1 memory and cpu hierarchies
(memory.limit_in_bytes, cpu.cfs_quota_us, memory.oom_control). Groups are created under the
kubelet's own cgroup, so a cluster nests inside whatever limits the machine gives it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
MAX_WEIGHT = {True: "10000", False: "262144"}  # cpu.weight (v2), cpu.shares (v1)
_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "m": 10**-3,
}


def quantity(value: object) -> float:
    """A Kubernetes quantity ("64Mi", "500m", "2") as a number; ValueError if malformed."""
    m = _QUANTITY.match(str(value).strip())
    if not m or m.group(2) not in _SUFFIX:
        raise ValueError(f"not a quantity: {value!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


@dataclass(frozen=True)
class Limits:
    memory_bytes: int | None
    cpu_millis: int | None

    @classmethod
    def of(cls, container: dict[str, Any]) -> Limits:
        limits = (container.get("resources") or {}).get("limits") or {}
        mem, cpu = limits.get("memory"), limits.get("cpu")
        return cls(
            memory_bytes=int(quantity(mem)) if mem is not None else None,
            cpu_millis=max(1, round(quantity(cpu) * 1000)) if cpu is not None else None,
        )


def _own(controller: str, v2: bool) -> Path:
    """This process's cgroup in `controller`'s hierarchy."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, controllers, path = line.split(":", 2)
        if (v2 and hid == "0") or (not v2 and controller in controllers.split(",")):
            return Path(path.lstrip("/"))
    return Path()


def unified() -> bool:
    controllers = ROOT / "cgroup.controllers"
    return controllers.is_file() and "memory" in controllers.read_text().split()


class Cgroups:
    """The cgroups of one kubelet: <own cgroup>/<name>/pod<uid>/<container>."""

    def __init__(self, name: str) -> None:
        self.v2 = unified()
        if self.v2:
            self.bases = {"memory": ROOT / _own("", True) / name}
            self.bases["cpu"] = self.bases["memory"]
        else:
            self.bases = {c: ROOT / c / _own(c, False) / name for c in ("memory", "cpu")}
            self.bases = {c: b for c, b in self.bases.items() if b.parent.is_dir()}

    def pod_dirs(self, uid: str) -> list[Path]:
        return sorted({base / f"pod{uid}" for base in self.bases.values()})

    def create(self, uid: str, container: str, limits: Limits) -> list[Path]:
        """The container's groups with its limits set; their cgroup.procs files, to join."""
        bases = {c: b for c, b in self.bases.items() if c == "memory" or limits.cpu_millis or self.v2}
        dirs = sorted({base / f"pod{uid}" / container for base in bases.values()})
        for d in dirs:
            for level in (d.parent.parent, d.parent, d):
                level.mkdir(exist_ok=True)
                if self.v2 and level != d:  # a v2 group with processes cannot delegate
                    _enable_controllers(level)
                # grouping must not cost weight against the host's ungrouped processes: the
                # limits cap a container, its share of an idle-enough machine stays whole
                _write(
                    level / ("cpu.weight" if self.v2 else "cpu.shares"), MAX_WEIGHT[self.v2], optional=True
                )
        self._limit(uid, container, limits)
        return [d / "cgroup.procs" for d in dirs]

    def _limit(self, uid: str, container: str, limits: Limits) -> None:
        mem = self.bases.get("memory")
        if mem is not None:
            d = mem / f"pod{uid}" / container
            if self.v2:
                _write(d / "memory.max", str(limits.memory_bytes) if limits.memory_bytes else "max")
                _write(d / "memory.swap.max", "0", optional=True)
            else:
                value = str(limits.memory_bytes) if limits.memory_bytes else "-1"
                if limits.memory_bytes:
                    _write(d / "memory.limit_in_bytes", value)
                    _write(d / "memory.memsw.limit_in_bytes", value, optional=True)
                else:
                    _write(d / "memory.memsw.limit_in_bytes", value, optional=True)
                    _write(d / "memory.limit_in_bytes", value)
        cpu = self.bases.get("cpu")
        if cpu is not None and (limits.cpu_millis or self.v2):
            d = cpu / f"pod{uid}" / container
            quota = limits.cpu_millis * CPU_PERIOD_US // 1000 if limits.cpu_millis else None
            if self.v2:
                _write(d / "cpu.max", f"{quota or 'max'} {CPU_PERIOD_US}", optional=True)
            else:
                _write(d / "cpu.cfs_period_us", str(CPU_PERIOD_US), optional=True)
                _write(d / "cpu.cfs_quota_us", str(quota or -1), optional=True)

    def oom_kills(self, uid: str, container: str) -> int:
        """How many processes the kernel's OOM killer ended in the container's group."""
        mem = self.bases.get("memory")
        if mem is None:
            return 0
        d = mem / f"pod{uid}" / container
        name = "memory.events" if self.v2 else "memory.oom_control"
        with contextlib.suppress(OSError):
            for line in (d / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def remove_all(self) -> None:
        """Remove this kubelet's groups (it is stopping; its pods' processes are gone)."""
        for base in set(self.bases.values()):
            remove_tree(base)

    def remove_pod(self, uid: str) -> None:
        """Kill what is left in the pod's groups, then remove them (deepest first)."""
        for pod_dir in self.pod_dirs(uid):
            remove_tree(pod_dir)


def join_prefix(procs: list[Path]) -> list[str]:
    """argv prefix that moves itself into the groups, then execs the rest (same pid).

    It runs on the host's view of /sys: `ip netns exec` mounts the namespace's own /sys, where
    the cgroup hierarchies are not mounted.
    """
    if not procs:
        return []
    script = "".join(f"echo $$ > {shlex.quote(str(p))} && " for p in procs) + 'exec "$@"'
    return ["/bin/sh", "-c", script, "sh"]


def remove_tree(top: Path) -> None:
    if not top.is_dir():
        return
    dirs = [*sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)), top]
    for d in dirs:
        for _ in range(50):
            pids = _procs(d)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            try:
                d.rmdir()
                break
            except OSError:
                time.sleep(0.05)  # killed processes leave the group asynchronously


def _procs(d: Path) -> list[int]:
    try:
        return [int(x) for x in (d / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _enable_controllers(d: Path) -> None:
    with contextlib.suppress(OSError):
        available = (d / "cgroup.controllers").read_text().split()
        wanted = [f"+{c}" for c in ("memory", "cpu") if c in available]
        if wanted:
            (d / "cgroup.subtree_control").write_text(" ".join(wanted))


def _write(path: Path, value: str, optional: bool = False) -> None:
    try:
        path.write_text(value)
    except OSError:
        if not optional:
            raise

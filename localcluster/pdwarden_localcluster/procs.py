"""Detached background processes recorded in pid files, and stopping them safely.

A pid file holds the pid and the process's start time (from /proc), so a pid that the
kernel has reused for an unrelated process is never signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from field 3 (state) on, or None if no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    return stat.rsplit(")", 1)[1].split()


def start_time(pid: int) -> int | None:
    """Kernel start time of `pid` in clock ticks, or None if no such process."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] == "Z":  # a zombie has exited; it only waits to be reaped
        return None
    return int(fields[19])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time `pid` has used so far. A process that is gone raises
    ProcessLookupError: read as 0.0, a dead process would pass for an idle one."""
    fields = _stat_fields(pid)
    if fields is None:
        raise ProcessLookupError(f"no process {pid}")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Recorded:
    name: str
    pid: int
    started: int
    pgid: int

    def alive(self) -> bool:
        return start_time(self.pid) == self.started


def write_record(path: Path, name: str, pid: int) -> Recorded:
    started = start_time(pid) or 0
    rec = Recorded(name=name, pid=pid, started=started, pgid=pid)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec.__dict__) + "\n")
    tmp.replace(path)
    return rec


def read_record(path: Path) -> Recorded | None:
    try:
        data = json.loads(path.read_text())
        return Recorded(str(data["name"]), int(data["pid"]), int(data["started"]), int(data["pgid"]))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def spawn_detached(
    name: str, argv: Sequence[str], log: Path, pid_file: Path, env: Mapping[str, str] | None = None
) -> Recorded:
    """Start `argv` in its own session (it outlives us), output appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(
            list(argv),
            stdin=devnull,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            close_fds=True,
        )
    return write_record(pid_file, name, proc.pid)


def stop(rec: Recorded, grace: float = 10.0) -> bool:
    """SIGTERM the process group, wait up to `grace`, then SIGKILL. True if it was running."""
    if not rec.alive():
        # leftovers of a group whose leader is gone: only members started after the leader
        for pid in group_members(rec.pgid, rec.started):
            _kill(pid, signal.SIGKILL)
        return False
    _killpg(rec.pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not rec.alive() and not group_alive(rec.pgid):
            return True
        _reap(rec.pid)
        time.sleep(0.1)
    _killpg(rec.pgid, signal.SIGKILL)
    for _ in range(50):
        _reap(rec.pid)
        if not rec.alive():
            break
        time.sleep(0.1)
    return True


def group_members(pgid: int, not_before: int) -> list[int]:
    """Pids in process group `pgid` started at or after `not_before` (clock ticks)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and int(fields[19]) >= not_before and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _kill(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _reap(pid: int) -> None:
    """Collect our own exited child so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)

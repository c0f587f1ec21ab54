"""One container of a pod run as a local process group, with its log file and state."""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdwarden_localcluster.kubelet.probes import ProbeState, now
from pdwarden_localcluster.procs import group_members, start_time

JSON = dict[str, Any]


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ContainerRun:
    name: str
    spec: JSON
    pod_dir: Path
    init: bool = False
    proc: subprocess.Popen[bytes] | None = None
    pid_started: int = 0
    started_wall: str = ""
    started_mono: float = 0.0
    restart_count: int = 0
    attempts: int = 0  # start attempts, successful or not
    waiting_reason: str = "ContainerCreating"
    waiting_message: str = ""
    terminated: JSON | None = None
    last_terminated: JSON | None = None
    ready: bool = False
    started: bool = False
    probes: dict[str, ProbeState] = field(default_factory=dict)
    backoff_until: float = 0.0
    kill_deadline: float | None = None
    kill_message: str = ""
    env: dict[str, str] = field(default_factory=dict)
    user: tuple[int, int] = (0, 0)  # (uid, gid) its sandbox runs it as; exec probes enter as it

    @property
    def log_path(self) -> Path:
        return self.pod_dir / f"{self.name}.log"

    @property
    def pid_path(self) -> Path:
        return self.pod_dir / f"{self.name}.pid"

    def running(self) -> bool:
        return self.proc is not None and self.terminated is None

    def start(
        self, argv: list[str], env: Mapping[str, str], cwd: str | None, prefix: Sequence[str] = ()
    ) -> None:
        """Start the process (its own process group); a failure to exec is a StartError.

        `prefix` (e.g. `ip netns exec <ns>`) runs first and execs the command in place, so the
        recorded pid is the container's; the command is resolved here so that a missing
        executable is still a StartError rather than the prefix's exit status.
        """
        if self.terminated is not None:
            self.last_terminated = self.terminated
        self.terminated = None
        self.attempts += 1
        self.ready = False
        self.started = False
        self.env = dict(env)
        wall = utc_now()
        with self.log_path.open("ab") as log:
            log.write(f"--- pdwarden kubelet: starting {json.dumps(argv)} at {wall}\n".encode())
            log.flush()
            try:
                if cwd:
                    Path(cwd).mkdir(parents=True, exist_ok=True)
                if prefix:
                    argv = [resolve_executable(argv[0], env.get("PATH", "")), *argv[1:]]
                self.proc = subprocess.Popen(
                    [*prefix, *argv],
                    env=dict(env),
                    cwd=cwd or str(self.pod_dir),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                self.proc = None
                message = f"exec: {argv[0]!r}: {exc.strerror or exc}"
                log.write(f"--- pdwarden kubelet: StartError: {message}\n".encode())
                self.terminated = {
                    "exitCode": 128,
                    "reason": "StartError",
                    "message": message,
                    "startedAt": wall,
                    "finishedAt": wall,
                }
                return
        self.pid_started = start_time(self.proc.pid) or 0
        self.pid_path.write_text(json.dumps({"pid": self.proc.pid, "started": self.pid_started}) + "\n")
        self.started_wall = wall
        self.started_mono = now()
        self.kill_deadline = None
        self.waiting_reason = ""
        self.waiting_message = ""

    def poll(self) -> bool:
        """Check for exit; True when it has just exited. Leftover group members are killed."""
        if self.proc is None or self.terminated is not None:
            return False
        code = self.proc.poll()
        if code is None:
            if self.kill_deadline is not None and now() >= self.kill_deadline:
                self._signal_group(signal.SIGKILL)
            return False
        self._kill_leftovers()
        signum = -code if code < 0 else 0
        exit_code = 128 + signum if signum else code
        reason = "Completed" if exit_code == 0 else "Error"
        self.terminated = {
            "exitCode": exit_code,
            "reason": reason,
            "startedAt": self.started_wall,
            "finishedAt": utc_now(),
        }
        if signum:
            self.terminated["signal"] = signum
        if self.kill_message:
            self.terminated["message"] = self.kill_message
            self.kill_message = ""
        self.ready = False
        self.kill_deadline = None
        self.pid_path.unlink(missing_ok=True)
        with self.log_path.open("ab") as log:
            log.write(
                f"--- pdwarden kubelet: exited with {exit_code} at {self.terminated['finishedAt']}\n".encode()
            )
        return True

    def terminate(self, grace: float, message: str = "") -> None:
        """SIGTERM the group now; poll() sends SIGKILL once `grace` seconds have passed."""
        if not self.running() or self.kill_deadline is not None:
            return
        self.kill_message = message
        self._signal_group(signal.SIGTERM)
        self.kill_deadline = now() + max(grace, 0.0)

    def kill_now(self) -> None:
        if self.running():
            self._signal_group(signal.SIGKILL)
            assert self.proc is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            self.poll()

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def _kill_leftovers(self) -> None:
        # like a container's cgroup: when the main process ends, the rest of its tree ends too
        if self.proc is None:
            return
        for pid in group_members(self.proc.pid, self.pid_started):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def resolve_executable(name: str, path: str) -> str:
    """`name` as exec would find it on `path`; an OSError (ENOENT/EACCES) if it would not."""
    found = shutil.which(name, path=path) if "/" not in name else name
    if found is None or not os.path.isfile(found):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)
    if not os.access(found, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), name)
    return found


def kill_recorded(pid_file: Path) -> None:
    """Kill a container process group left behind by an earlier kubelet (from its pid file)."""
    try:
        data = json.loads(pid_file.read_text())
        pid, started = int(data["pid"]), int(data["started"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    for member in group_members(pid, started):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(member, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)

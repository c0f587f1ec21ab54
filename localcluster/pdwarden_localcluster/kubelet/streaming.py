"""The streaming server child process (pdwarden-streaming) and what it reads about pods.

It serves exec and port-forward (see logserver.relay); each pod worker writes the facts it
needs to `<pod dir>/exec.json`: the network namespace, the pod's address and each started
container's environment and working directory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
from pathlib import Path
from typing import Any

from pdwarden_localcluster.network import IP
from pdwarden_localcluster.procs import start_time

log = logging.getLogger("pdwarden.kubelet")
EXEC_INFO = "exec.json"
# children of the kubelet are recorded like containers' pid files, so the cluster's stop path
# kills them after a kubelet crash
PID_DIR = "_kubelet"


def record_child(pods_dir: Path, name: str, pid: int) -> Path:
    pid_dir = pods_dir / PID_DIR
    pid_dir.mkdir(parents=True, exist_ok=True)
    path = pid_dir / f"{name}.pid"
    path.write_text(json.dumps({"pid": pid, "started": start_time(pid) or 0}) + "\n")
    return path


def start_logged_child(
    state_dir: Path, name: str, argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a kubelet child whose output goes to `<state>/logs/<name>.log`; record its pid."""
    log_path = state_dir / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    record_child(state_dir / "pods", name, proc.pid)
    return proc


def stop_child(proc: subprocess.Popen[bytes], pods_dir: Path, name: str) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    (pods_dir / PID_DIR / f"{name}.pid").unlink(missing_ok=True)


def start(binary: Path, pods_dir: Path) -> tuple[subprocess.Popen[bytes], tuple[str, int]]:
    """Start the server on a free loopback port; returns the process and its address."""
    proc = subprocess.Popen(
        [str(binary), "--listen=127.0.0.1:0", f"--pods-dir={pods_dir}", f"--ip={IP}"],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()
    host, _, port = line.rpartition(":")
    if not port.isdigit():
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{binary.name} did not print its address (got {line!r})")
    record_child(pods_dir, "streaming", proc.pid)
    return proc, (host, int(port))


def write_exec_info(
    pod_dir: Path, netns: str, ip: str, order: list[str], name: str, env: dict[str, str], cwd: str
) -> None:
    """Record (atomically) what exec needs to run a command in container `name`."""
    path = pod_dir / EXEC_INFO
    info: dict[str, Any] = {"containers": {}}
    with contextlib.suppress(OSError, ValueError):
        info = json.loads(path.read_text())
    info.update(netns=netns, ip=ip, order=order)
    info.setdefault("containers", {})[name] = {"env": env, "cwd": cwd}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
    tmp.chmod(0o600)
    tmp.replace(path)

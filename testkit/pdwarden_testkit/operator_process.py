"""Run `pdwarden operator run` as a child process: the harness of the benchmarks and e2e tests.

Starts the operator with its own kubeconfig and ports (free ones unless given), waits for
its liveness endpoint, and always stops it (SIGTERM, then SIGKILL), also when the caller
fails. It lives with the benchmarks, not in the operator package: nothing in a deployed
operator runs it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO

from pdwarden_localcluster import procs
from pdwarden_localcluster.waits import WaitTimeout, wait_for
from pdwarden_testkit.ports import free_port


class OperatorExited(RuntimeError):
    """The operator process ended while starting (a port taken, a bad flag: see its log)."""


class OperatorProcess:
    def __init__(
        self,
        kubeconfig: str | Path,
        *,
        namespaces: tuple[str, ...] = (),
        health_port: int | None = None,
        metrics_port: int = 0,
        log_path: Path | None = None,
        extra_env: dict[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
        allow: tuple[str, ...] = ("faultInjection",),
        executable: str | Path | None = None,
    ) -> None:
        self.kubeconfig = str(kubeconfig)
        self.namespaces = namespaces
        self.health_port = health_port or free_port()
        self.metrics_port = metrics_port
        self.log_path = log_path
        self.extra_env = extra_env or {}
        self.extra_args = extra_args
        # the scenarios inject faults into their models' pods (the installation must allow it)
        self.allow = allow
        # the `pdwarden` to run (default: the one beside this Python)
        self.executable = executable
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def command(self) -> list[str]:
        exe = self.executable or shutil.which("pdwarden", path=str(Path(sys.executable).parent)) or "pdwarden"
        cmd = [str(exe), "operator", "run", "--bind-host", "127.0.0.1"]
        cmd += ["--health-port", str(self.health_port), "--metrics-port", str(self.metrics_port)]
        for ns in self.namespaces:
            cmd += ["--namespace", ns]
        for allowance in self.allow:
            cmd += ["--allow", allowance]
        return [*cmd, *self.extra_args]

    def start(self, timeout: float = 60.0) -> OperatorProcess:
        env = {**os.environ, "KUBECONFIG": self.kubeconfig, **self.extra_env}
        out: int | IO[bytes] = subprocess.DEVNULL
        if self.log_path is not None:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            out = self._log
        self.proc = subprocess.Popen(self.command(), env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for(self._started, timeout, f"the operator's liveness endpoint{self._log_hint()}", 0.3)
        except (WaitTimeout, OperatorExited):
            self.stop()
            raise
        return self

    def _started(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise OperatorExited(f"operator exited with {self.proc.returncode} at start{self._log_hint()}")
        return self.healthy()

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as a crash would be."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def rss_mib(self) -> tuple[float, float]:
        """(current, peak) resident memory of the operator process, MiB."""
        assert self.proc is not None
        fields = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            fields[key] = value.strip()
        kib = [float(fields.get(k, "0 kB").split()[0]) for k in ("VmRSS", "VmHWM")]
        return kib[0] / 1024, kib[1] / 1024

    def cpu_seconds(self) -> float:
        """User + system CPU time the operator process has used so far."""
        assert self.proc is not None
        return procs.cpu_seconds(self.proc.pid)

    def _log_hint(self) -> str:
        return f" (log: {self.log_path})" if self.log_path else ""

    def __enter__(self) -> OperatorProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

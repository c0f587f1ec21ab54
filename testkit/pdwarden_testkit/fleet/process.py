"""Run the simulated fleet as a child process (benchmarks and tests); always stopped, and its
node and network gone with it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import IO

from pdwarden_localcluster.cluster import ports
from pdwarden_testkit.fleet.node import DEFAULT_NAME


class FleetExited(RuntimeError):
    """The fleet process ended while starting (no IPv6, the API refused its node: see its log)."""


class FleetProcess:
    def __init__(self, kubeconfig: str | Path, *, log_path: Path, name: str = DEFAULT_NAME) -> None:
        self.kubeconfig = str(kubeconfig)
        self.log_path = log_path
        self.name = name
        self.proc: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "pdwarden_testkit.fleet",
            "--kubeconfig",
            self.kubeconfig,
            "--network-base",
            str(ports().base),
            "--name",
            self.name,
        ]

    def start(self) -> FleetProcess:
        self._log = open(self.log_path, "a")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=self._log, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "READY":
            self.stop()
            tail = self.log_path.read_text()[-2000:]
            raise FleetExited(f"the simulated fleet did not start (exit {self.proc.poll()}):\n{tail}")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> FleetProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

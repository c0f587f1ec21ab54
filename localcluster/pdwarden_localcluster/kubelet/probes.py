"""Container probes (httpGet, exec, tcpSocket) with the kubelet's thresholds and timing."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdwarden_localcluster import network

JSON = dict[str, Any]


def resolve_port(port: Any, container: JSON) -> int:
    """A probe port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    if isinstance(port, str) and port.isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"probe port {port!r} is not a number nor a named container port")


def run_probe(
    probe: JSON,
    container: JSON,
    pod_ip: str,
    env: Mapping[str, str],
    cwd: str | None,
    exec_prefix: Sequence[str] = (),
    node_netns: str | None = None,
) -> tuple[bool, str]:
    """One probe attempt: (success, message).

    `node_netns`: the network namespace a connection to `pod_ip` leaves from (the node's
    stack, as a kubelet's leave from its node); None: this process's own.
    """
    timeout = float(probe.get("timeoutSeconds") or 1)
    try:
        if "httpGet" in probe:
            spec = probe["httpGet"]
            with _leaving_from(node_netns, spec, pod_ip):
                return _http(spec, container, pod_ip, timeout)
        if "exec" in probe:
            return _exec(list(probe["exec"].get("command") or []), env, cwd, timeout, exec_prefix)
        if "tcpSocket" in probe:
            spec = probe["tcpSocket"]
            with (
                _leaving_from(node_netns, spec, pod_ip),
                socket.create_connection(
                    (spec.get("host") or pod_ip, resolve_port(spec.get("port"), container)), timeout=timeout
                ),
            ):
                return True, ""
    except (OSError, ValueError) as exc:
        return False, str(exc)
    return True, "probe kind not supported by the local kubelet; treated as success"


def _leaving_from(netns: str | None, spec: JSON, pod_ip: str) -> contextlib.AbstractContextManager[None]:
    """A probe of the pod's own address from `netns`; one naming another host, from here."""
    if netns is None or spec.get("host") not in (None, "", pod_ip):
        return contextlib.nullcontext()
    return network.entered(netns)


def _http(spec: JSON, container: JSON, pod_ip: str, timeout: float) -> tuple[bool, str]:
    scheme = str(spec.get("scheme") or "HTTP").lower()
    host = spec.get("host") or pod_ip
    path = spec.get("path") or "/"
    url = f"{scheme}://{host}:{resolve_port(spec.get('port'), container)}{path}"
    req = urllib.request.Request(url, headers={h["name"]: h["value"] for h in spec.get("httpHeaders") or []})
    req.add_header("User-Agent", "kube-probe/pdwarden")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            code = resp.status
    except urllib.error.HTTPError as exc:
        code = exc.code
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        return False, f"Get {url}: {exc}"
    if 200 <= code < 400:
        return True, ""
    return False, f"HTTP probe failed with statuscode: {code}"


def _exec(
    command: list[str], env: Mapping[str, str], cwd: str | None, timeout: float, prefix: Sequence[str] = ()
) -> tuple[bool, str]:
    if not command:
        return False, "exec probe without a command"
    try:
        proc = subprocess.Popen(
            [*prefix, *command],
            env=dict(env),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        return False, str(exc)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return False, f"command timed out after {timeout:g}s"
    if proc.returncode == 0:
        return True, ""
    return False, f"exit code {proc.returncode}: {out.decode('utf-8', 'replace')[-200:]}"


@dataclass
class ProbeState:
    """Schedule and thresholds of one probe of one container run."""

    probe: JSON
    started_at: float
    next_at: float = 0.0
    successes: int = 0
    failures: int = 0
    result: bool | None = None  # None until the thresholds decide
    message: str = field(default="")

    def __post_init__(self) -> None:
        self.next_at = self.started_at + float(self.probe.get("initialDelaySeconds") or 0)

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def record(self, ok: bool, message: str, now: float) -> None:
        self.next_at = now + float(self.probe.get("periodSeconds") or 10)
        self.message = message
        if ok:
            self.failures = 0
            self.successes += 1
            if self.successes >= int(self.probe.get("successThreshold") or 1):
                self.result = True
        else:
            self.successes = 0
            self.failures += 1
            if self.failures >= int(self.probe.get("failureThreshold") or 3):
                self.result = False


def now() -> float:
    return time.monotonic()

"""Helpers for tests, benchmarks and the demo on the local cluster: kubectl, waiting, readiness.

Fixtures live in tests/e2e/conftest.py; these are plain functions/classes so any test,
benchmark or the demo can import them. `wait_for` is the one way anything here waits for a
condition.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pdwarden_localcluster.tools import require

T = TypeVar("T")


class KubectlError(AssertionError):
    """kubectl exited non-zero (an AssertionError, so a test shows it as a failed check)."""


class WaitTimeout(AssertionError):
    """`wait_for` ran out of time; the message names what it waited for and the last value."""


# Failures that are expected while things start (kubectl against a warming API server, HTTP
# to a process not listening yet): `wait_for` keeps polling through them by default.
TRANSIENT: tuple[type[BaseException], ...] = (KubectlError, OSError)


class Kubectl:
    """The pinned kubectl bound to one kubeconfig."""

    def __init__(self, kubeconfig: str | Path) -> None:
        self.exe = str(require("kubectl"))
        self.kubeconfig = Path(kubeconfig)
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig)}

    def __call__(
        self, *args: str, check: bool = True, stdin: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [self.exe, *args], env=self.env, input=stdin, capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise KubectlError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    run = __call__

    def json(self, *args: str, timeout: float = 60) -> Any:
        """`kubectl <args> -o json`, parsed."""
        return json.loads(self(*args, "-o", "json", timeout=timeout).stdout)

    def apply(self, manifest: str | dict[str, Any], namespace: str | None = None) -> None:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        args = ["apply", "-f", "-"] + (["-n", namespace] if namespace else [])
        self(*args, stdin=text)

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        proc = self("get", kind, name, "-n", namespace, "-o", "json", check=False)
        if proc.returncode != 0:
            if "NotFound" in proc.stderr:
                return None
            raise KubectlError(f"kubectl get {kind} {name}: {proc.stderr.strip()}")
        return dict(json.loads(proc.stdout))

    def items(
        self, kind: str, namespace: str, selector: str | None = None, *, managed_fields: bool = False
    ) -> list[dict[str, Any]]:
        args = ["get", kind, "-n", namespace] + (["-l", selector] if selector else [])
        if managed_fields:  # server-side apply tests read them
            args.append("--show-managed-fields")
        return list(self.json(*args)["items"])


def wait_for(
    check: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = 0.5,
    retry_on: tuple[type[BaseException], ...] = TRANSIENT,
) -> T:
    """Poll `check` until it returns something truthy, and return that.

    Raises WaitTimeout naming `what` and the last value. An exception of a `retry_on` type
    counts as a falsy value (e.g. kubectl failing while things start); any other propagates.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except retry_on as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what}; last value: {last!r}")
        time.sleep(interval)


def unique_namespace(hint: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", hint.lower()).strip("-")[:40].strip("-") or "test"
    return f"e2e-{slug}-{uuid.uuid4().hex[:6]}"


def create_namespace(kubectl: Kubectl, name: str, timeout: float = 60) -> str:
    """Create `name` and wait for its default ServiceAccount (pods are refused until it exists)."""
    kubectl("create", "namespace", name)
    wait_for(
        lambda: kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
        timeout,
        f"ServiceAccount {name}/default",
        interval=0.3,
    )
    return name


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """The kubelet's verdict: condition Ready is True (a terminating pod may still be Ready)."""
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def serving(pod: Mapping[str, Any]) -> bool:
    """Ready, not terminating and with an IP: a pod to send traffic to."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return pod_ready(pod) and not meta.get("deletionTimestamp") and bool(status.get("podIP"))

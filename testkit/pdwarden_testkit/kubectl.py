"""The pinned kubectl bound to one kubeconfig, and test namespaces."""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

from pdwarden_localcluster.tools import require
from pdwarden_localcluster.waits import TransientError, wait_for


class KubectlError(TransientError):
    """kubectl exited non-zero (transient for `wait_for`: the API server may be warming)."""


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

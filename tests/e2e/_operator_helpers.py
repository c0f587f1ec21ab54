"""Shared helpers of the operator e2e tests: kubectl, waiting, the operator process."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pdwarden_localcluster.testing import Kubectl as SharedKubectl

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "pdwarden.io_disaggregatedmodels.yaml"
T = TypeVar("T")


class Kubectl(SharedKubectl):
    """The local cluster's kubectl helper, plus managed fields on listings (SSA tests read them)."""

    def items(
        self, kind: str, ns: str, selector: str | None = None, *, managed_fields: bool = False
    ) -> list[dict[str, Any]]:
        args = ["get", kind, "-n", ns]
        if selector:
            args += ["-l", selector]
        if managed_fields:
            args.append("--show-managed-fields")
        return list(self.json(*args)["items"])


def wait_for(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.5) -> T:
    """Poll `check` until it returns something truthy; fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except AssertionError as exc:  # transient kubectl failures while things start
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")


def new_namespace(kubectl: Kubectl, prefix: str) -> Iterator[str]:
    ns = f"{prefix}{uuid.uuid4().hex[:6]}"
    kubectl.run("create", "namespace", ns)
    try:
        yield ns
    finally:
        kubectl.run("delete", "namespace", ns, "--wait=false", check=False)


def condition(dm: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    for c in ((dm or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return dict(c)
    return {}

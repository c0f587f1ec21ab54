"""`helm test` for the pdwarden chart: templates/tests/test-operator.yaml runs this with
`python3 -c` in the operator's own image. It checks that

1. the operator answers: its metrics Service (METRICS_URL) serves OPERATOR_METRIC, which every
   replica exports, the leader and the standbys alike (skipped when METRICS_URL is empty:
   metricsService.enabled=false);
2. the API server serves the CRD: API discovery of CRD_GROUP at each of CRD_VERSIONS lists
   CRD_PLURAL. Discovery is open to every authenticated identity (the system:discovery
   ClusterRole), so the pod's ServiceAccount needs no Role at all.

Each check is tried CHECK_ATTEMPTS times, CHECK_PAUSE_SECONDS apart (a Service whose endpoints
are still joining after an upgrade). Standard library only; exit status 0 when both pass.
"""

from __future__ import annotations

import functools
import json
import os
import ssl
import sys
import time
import urllib.request
from collections.abc import Callable

SERVICEACCOUNT_DIR = os.environ.get("SERVICEACCOUNT_DIR", "/var/run/secrets/kubernetes.io/serviceaccount")
TIMEOUT_S = 5.0  # per request: with 10 attempts 3 s apart, every check ends within the pod's deadline


def get(url: str, context: ssl.SSLContext | None = None, token: str | None = None) -> bytes:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=context) as response:
        body: bytes = response.read()
        return body


def operator_answers(url: str, metric: str) -> str:
    text = get(url).decode("utf-8", "replace")
    samples = [line for line in text.splitlines() if line.split("{")[0].split(" ")[0] == metric]
    if not samples:
        raise RuntimeError(f"{url} answered without {metric}")
    return f"the operator answers at {url}: {samples[0]}"


def crd_served(group: str, version: str, plural: str) -> str:
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    context = ssl.create_default_context(cafile=os.path.join(SERVICEACCOUNT_DIR, "ca.crt"))
    with open(os.path.join(SERVICEACCOUNT_DIR, "token")) as f:
        token = f.read().strip()
    url = f"https://{host}:{port}/apis/{group}/{version}"
    resources = json.loads(get(url, context, token)).get("resources") or []
    if plural not in {r.get("name") for r in resources}:
        raise RuntimeError(f"the API server does not serve {plural}.{group}/{version} (discovery: {url})")
    return f"the API server serves {plural}.{group}/{version}"


def attempt(what: Callable[[], str], attempts: int, pause: float) -> bool:
    for n in range(1, attempts + 1):
        try:
            print(f"ok: {what()}", flush=True)
            return True
        except Exception as exc:  # an HTTP error, a refused connection, a missing series
            print(f"attempt {n}/{attempts}: {type(exc).__name__}: {exc}", flush=True)
            if n < attempts:
                time.sleep(pause)
    return False


def main() -> int:
    attempts = int(os.environ.get("CHECK_ATTEMPTS", "10"))
    pause = float(os.environ.get("CHECK_PAUSE_SECONDS", "3"))
    checks: list[Callable[[], str]] = []
    metrics_url = os.environ.get("METRICS_URL", "")
    if metrics_url:
        metric = os.environ["OPERATOR_METRIC"]
        checks.append(functools.partial(operator_answers, metrics_url, metric))
    else:
        print("skipped: the operator's metrics (metricsService.enabled=false)", flush=True)
    group, plural = os.environ["CRD_GROUP"], os.environ["CRD_PLURAL"]
    for version in os.environ["CRD_VERSIONS"].split(","):
        checks.append(functools.partial(crd_served, group, version, plural))
    failed = [check for check in checks if not attempt(check, attempts, pause)]
    if failed:
        print(f"FAILED: {len(failed)} of {len(checks)}", flush=True)
        return 1
    print(f"passed: {len(checks)} of {len(checks)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

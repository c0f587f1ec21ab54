"""`pdwarden bench remediation`: the same wedge remediated by `restart` and by `drain`, side by side.

On the local cluster (started if down), in one fresh namespace with one operator, two models
run at once, each 2 prefill + 2 decode synthetic pods under the same steady router-like load
(`--concurrency` requests in flight per model) and the same watchdog figures; they differ
only in `watchdog.action`. The emulated port's race wedges ONE prefill pod of each; from the
remediation's decision until the model has recovered (the wedged pod gone, its role back to
its desired Ready pods, nothing in flight) the role's pods are sampled every half second.

Per action: `requests_failed_during_remediation` (load requests that failed from the wedge
to recovery; the race's own request, on the stuck room, is not part of the load),
`capacity_gap_seconds` (time with fewer Ready pods of the role than desired, a quarantined
pod counted: it still finishes its requests), `serving_gap_seconds` (fewer Ready pods in the
role's selector, i.e. taking new requests), `time_to_recovered_seconds` (decision to
recovery). The pair case (`pods_remediated`, `right_pod_remediated`) needs a decode-side
stall fault the runtime does not have. Bounded: every wait has a deadline; the namespace is
deleted at the end. Progress on stderr, one JSON line last.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click

from pdwarden_bench.cluster_env import (
    API_TRANSIENT,
    EMULATED_PORT_PREFILL,
    STUCK,
    WATCHDOG,
    Env,
    Load,
    epoch,
    open_env,
    remediations,
    wedge,
)
from pdwarden_localcluster.testing import serving, wait_for
from pdwarden_runtime import contract

ACTIONS = ("restart", "drain")
DRAIN_SECONDS = 150
SAMPLE_S = 0.5
RECOVERY_TIMEOUT_S = 420.0
DETECTION_TIMEOUT_S = STUCK + 120.0


def _say(msg: str) -> None:
    print(f"[bench remediation] {msg}", file=sys.stderr, flush=True)


def _model_pods(env: Env, name: str) -> list[dict[str, Any]]:
    sel = f"{contract.LABEL_MODEL}={name}"
    items = env.call("GET", f"/api/v1/namespaces/{env.namespace}/pods?labelSelector={sel}")["items"]
    return list(items)


def _served_role(pod: dict[str, Any]) -> str | None:
    labels = pod["metadata"].get("labels") or {}
    role = labels.get(contract.LABEL_ROLE)
    return labels.get(contract.LABEL_QUARANTINED_ROLE) if role == contract.ROLE_QUARANTINED else role


def _scenario(env: Env, action: str, concurrency: int) -> dict[str, Any]:
    name = f"rem-{action}"
    role, desired = contract.ROLE_PREFILL, 2
    with Load(env, name, concurrency=concurrency) as load:
        load.wait_flowing(timeout=180)
        victim = env.live_ready_pods(name, role)[0]
        victim_name, victim_uid = victim["metadata"]["name"], victim["metadata"]["uid"]
        failed_before = len(load.failed)
        _say(f"{action}: wedging {victim_name}")
        wedge(env, name, victim)
        decided = epoch(
            wait_for(
                lambda: remediations(env, name, victim_name),
                DETECTION_TIMEOUT_S,
                f"{action}: the remediation of {victim_name}",
                0.5,
                API_TRANSIENT,
            )[0]["time"]
        )
        _say(f"{action}: remediation decided; sampling until recovered")
        capacity_gap = serving_gap = 0.0
        last = time.time()
        recovered_at: float | None = None
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                pods = [p for p in _model_pods(env, name) if _served_role(p) == role]
                in_flight = (env.dm(name).get("status") or {}).get("watchdog", {}).get("inFlight")
            except API_TRANSIENT:
                time.sleep(SAMPLE_S)
                continue
            now = time.time()
            ready = [p for p in pods if serving(p)]
            in_selector = [p for p in ready if p["metadata"]["labels"].get(contract.LABEL_ROLE) == role]
            step = now - max(last, decided)
            if step > 0:
                capacity_gap += step if len(ready) < desired else 0.0
                serving_gap += step if len(in_selector) < desired else 0.0
            last = now
            gone = all(p["metadata"]["uid"] != victim_uid for p in pods)
            if gone and len(in_selector) >= desired and not in_flight:
                recovered_at = now
                break
            time.sleep(SAMPLE_S)
        if recovered_at is not None:
            load.wait_flowing(8, timeout=60)  # late failures (decode rooms of a deleted pod) show now
        failed = len(load.failed) - failed_before
        completed = len(load.ok)
    entry = next(iter(remediations(env, name, victim_name)), {})
    _say(f"{action}: {failed} failed, recovered in {recovered_at and round(recovered_at - decided, 1)}s")
    return {
        "action": action,
        "requests_failed_during_remediation": failed,
        "capacity_gap_seconds": round(capacity_gap, 1),
        "serving_gap_seconds": round(serving_gap, 1),
        "time_to_recovered_seconds": None if recovered_at is None else round(recovered_at - decided, 1),
        "recovered": recovered_at is not None,
        "outcome": entry.get("outcome"),
        "phases": [p["phase"] for p in entry.get("phases") or []],
        "requests_completed": completed,
    }


def _run(kubeconfig: Path, concurrency: int) -> dict[str, Any]:
    namespace = f"bench-rem-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory(prefix="pdwarden-bench-remediation-") as tmp:
        envs = open_env(kubeconfig, namespace, Path(tmp))
        env = next(envs)
        try:
            env.call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
            env.start_operator()
            for action in ACTIONS:
                settings = {**WATCHDOG, "action": action, "drainSeconds": DRAIN_SECONDS}
                env.create_dm(f"rem-{action}", settings, EMULATED_PORT_PREFILL)
            _say("waiting for 2 models x (2 prefill + 2 decode) Ready pods")
            wait_for(
                lambda: all(
                    len(env.live_ready_pods(f"rem-{a}", r)) == 2
                    for a in ACTIONS
                    for r in contract.RUNTIME_ROLES
                ),
                300,
                "every runtime pod Ready",
                1.0,
                API_TRANSIENT,
            )
            started = time.monotonic()
            with ThreadPoolExecutor(len(ACTIONS)) as pool:
                results = list(pool.map(lambda a: _scenario(env, a, concurrency), ACTIONS))
            elapsed = time.monotonic() - started
        finally:
            with contextlib.suppress(StopIteration):
                next(envs)  # stops the operator, deletes the namespace, waits for its pods
    return {
        "benchmark": "remediation",
        "actions": results,
        "concurrency_per_model": concurrency,
        "stuck_after_seconds": STUCK,
        "drain_seconds": DRAIN_SECONDS,
        "pair_case": "not measured: the runtime has no decode-side stall fault yet",
        "elapsed_s": round(elapsed, 1),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }


@click.command()
@click.option("--concurrency", type=click.IntRange(1, 32), default=4, show_default=True)
@click.option(
    "--kubeconfig", default=None, help="Default: $KUBECONFIG, else the local cluster (started if down)."
)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line on stdout.")
def remediation(concurrency: int, kubeconfig: str | None, as_json: bool) -> None:
    """One wedge remediated by restart and by drain under the same load; failures, capacity gap, recovery."""
    if kubeconfig is None:
        if os.environ.get("KUBECONFIG"):
            kubeconfig = os.environ["KUBECONFIG"]
        else:
            from pdwarden_localcluster.cluster import ensure_up

            kubeconfig = str(ensure_up().kubeconfig)
    result = _run(Path(kubeconfig), concurrency)
    if not as_json:
        for r in result["actions"]:
            _say(
                f"{r['action']}: {r['requests_failed_during_remediation']} failed, capacity gap "
                f"{r['capacity_gap_seconds']}s, recovered in {r['time_to_recovered_seconds']}s"
            )
    print(json.dumps(result), flush=True)

"""`pdwarden bench remediation`: the same wedge remediated by `restart` and by `drain`, side by side.

On the local cluster (started if down), in one fresh namespace with one operator, two models
run at once, each 2 prefill + 2 decode synthetic pods under the same steady router-like load
(`--concurrency` requests in flight per model) and the same watchdog figures; they differ
only in `watchdog.action`. The emulated port's race wedges ONE prefill pod of each; from the
remediation's decision until the model has recovered (the wedged pod gone, its role back to
its desired Ready pods, nothing in flight) the role's pods are sampled every half second.

Per action: `requests_failed_during_remediation` (load requests that failed from the
remediation's decision to recovery; `requests_failed_since_wedge` counts from the wedge; the
race's own request, on the stuck room, is not part of the load),
`capacity_gap_seconds` (time with fewer Ready pods of the role than desired, a quarantined
pod counted: it still finishes its requests), `serving_gap_seconds` (fewer Ready pods in the
role's selector, i.e. taking new requests), `time_to_recovered_seconds` (decision to
recovery).

Then the pair case, on a third model with action drain under the same load: the decode-side
transfer stall (`stall-kv-receive`) in ONE decode pod, which every prefill pod sending to it
sees as stuck rooms. `pods_remediated` names every pod the watchdog acted on until the model
recovered, `right_pod_remediated` is true when that is the stalled decode and nothing else.
Bounded: every wait has a deadline; the namespace is deleted at the end. Progress on stderr,
one JSON line last.
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

import pdwarden_contract as contract
from pdwarden_localcluster.waits import serving, wait_for
from pdwarden_testkit.cluster_env import (
    API_TRANSIENT,
    CHARGED,
    EMULATED_PORT_PREFILL,
    STUCK,
    WATCHDOG,
    Env,
    Load,
    epoch,
    inject,
    open_env,
    remediations,
    wedge,
)

ACTIONS = ("restart", "drain")
DRAIN_SECONDS = 300  # above this machine's replacement start-up under load, so the drain can wait for it
SAMPLE_S = 0.5
RECOVERY_TIMEOUT_S = 420.0
READY_TIMEOUT_S = 600.0
PAIR_MODEL = "rem-pair"
GROUP, VERSION, PLURAL = contract.API_GROUP, contract.API_VERSION, contract.PLURAL
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


def _failed_since(load: Load, epoch_s: float) -> int:
    """Load requests that failed at or after wall time `epoch_s` (the load stamps monotonic time)."""
    since = time.monotonic() - (time.time() - epoch_s)
    return sum(1 for t in list(load.failed) if t >= since)


def _all_ready(env: Env, name: str) -> bool:
    return all(len(env.live_ready_pods(name, r)) == 2 for r in contract.RUNTIME_ROLES)


def _until_recovered(
    env: Env, name: str, role: str, victim_uid: str, decided: float, desired: int = 2
) -> tuple[float | None, float, float]:
    """Sample the role's pods until the victim is gone, the role has `desired` Ready pods in its
    selector and no remediation is in flight: (recovered at or None, capacity gap, serving gap)."""
    capacity_gap = serving_gap = 0.0
    last = time.time()
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
            return now, capacity_gap, serving_gap
        time.sleep(SAMPLE_S)
    return None, capacity_gap, serving_gap


def _scenario(env: Env, action: str, concurrency: int) -> dict[str, Any]:
    name = f"rem-{action}"
    role = contract.ROLE_PREFILL
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
        recovered_at, capacity_gap, serving_gap = _until_recovered(env, name, role, victim_uid, decided)
        if recovered_at is not None:
            load.wait_flowing(8, timeout=60)  # late failures (decode rooms of a deleted pod) show now
        failed = _failed_since(load, decided)
        failed_since_wedge = len(load.failed) - failed_before
        completed = len(load.ok)
    entry = next(iter(remediations(env, name, victim_name)), {})
    _say(f"{action}: {failed} failed, recovered in {recovered_at and round(recovered_at - decided, 1)}s")
    return {
        "action": action,
        "requests_failed_during_remediation": failed,
        "requests_failed_since_wedge": failed_since_wedge,
        "capacity_gap_seconds": round(capacity_gap, 1),
        "serving_gap_seconds": round(serving_gap, 1),
        "time_to_recovered_seconds": None if recovered_at is None else round(recovered_at - decided, 1),
        "recovered": recovered_at is not None,
        "outcome": entry.get("outcome"),
        "phases": [p["phase"] for p in entry.get("phases") or []],
        "requests_completed": completed,
    }


def _pair_scenario(env: Env, concurrency: int) -> dict[str, Any]:
    name, role = PAIR_MODEL, contract.ROLE_DECODE
    with Load(env, name, concurrency=concurrency) as load:
        load.wait_flowing(timeout=180)
        victim = env.live_ready_pods(name, role)[0]
        victim_name, victim_uid = victim["metadata"]["name"], victim["metadata"]["uid"]
        failed_before = len(load.failed)
        _say(f"pair: stalling KV receive on decode {victim_name}")
        inject(victim, contract.FAULT_STALL_KV_RECEIVE)
        first = wait_for(
            lambda: [r for r in remediations(env, name) if r["outcome"] in CHARGED],
            DETECTION_TIMEOUT_S + 60,
            "pair: a remediation",
            0.5,
            API_TRANSIENT,
        )[0]
        decided = epoch(first["time"])
        _say(f"pair: {first['role']} pod {first['pod']} remediated; sampling until recovered")
        recovered_at, capacity_gap, _ = _until_recovered(env, name, role, victim_uid, decided)
        if recovered_at is not None:
            load.wait_flowing(8, timeout=60)
        failed = _failed_since(load, decided)
        failed_since_fault = len(load.failed) - failed_before
    acted = sorted({r["pod"] for r in remediations(env, name) if r["outcome"] in CHARGED})
    return {
        "action": "drain",
        "fault": contract.FAULT_STALL_KV_RECEIVE,
        "stalled_pod": victim_name,
        "pods_remediated": acted,
        "right_pod_remediated": acted == [victim_name],
        "requests_failed_during_remediation": failed,
        # rooms sent to the stalled decode before it was blamed fail at their deadline
        "requests_failed_since_fault": failed_since_fault,
        "capacity_gap_seconds": round(capacity_gap, 1),
        "time_to_recovered_seconds": None if recovered_at is None else round(recovered_at - decided, 1),
        "recovered": recovered_at is not None,
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
                lambda: all(_all_ready(env, f"rem-{a}") for a in ACTIONS),
                READY_TIMEOUT_S,
                "every runtime pod Ready",
                1.0,
                API_TRANSIENT,
            )
            started = time.monotonic()
            with ThreadPoolExecutor(len(ACTIONS)) as pool:
                results = list(pool.map(lambda a: _scenario(env, a, concurrency), ACTIONS))
            for action in ACTIONS:  # their pods stop before the pair case starts its own
                env.call("DELETE", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/rem-{action}")
            env.create_dm(PAIR_MODEL, {**WATCHDOG, "action": "drain", "drainSeconds": DRAIN_SECONDS})
            _say("pair case: waiting for 2 prefill + 2 decode Ready pods")
            wait_for(
                lambda: _all_ready(env, PAIR_MODEL), READY_TIMEOUT_S, "pair pods Ready", 1.0, API_TRANSIENT
            )
            pair = _pair_scenario(env, concurrency)
            elapsed = time.monotonic() - started
        finally:
            with contextlib.suppress(StopIteration):
                next(envs)  # stops the operator, deletes the namespace, waits for its pods
    return {
        "benchmark": "remediation",
        "actions": results,
        "pair": pair,
        "concurrency_per_model": concurrency,
        "stuck_after_seconds": STUCK,
        "drain_seconds": DRAIN_SECONDS,
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

"""`pdwarden bench metrics-bomb`: N hostile /metrics endpoints beside M healthy ones, through the
real operator, on the local cluster (started if down).

One operator process (`OperatorProcess`, leader election on: its Lease is renewed all along)
watches one fresh namespace with two models of 1 prefill + 1 decode synthetic runtime pods:
`calm` and `bomb`. Beside them run pods of this module, handed to the models the way a drain
hands a pod over (quarantined, the model their controller), so the operator's own pod list,
ownership check, scrape, parse and wedge rule see them as the model's pods:

- M **healthy** pods in `calm` serve the runtime's real metrics (`RuntimeMetrics`: rooms that
  keep concluding, watched threads, per-peer figures naming calm's decode pod);
- N **hostile** pods in `bomb` serve 1 MiB bodies of random long labels on the contract's
  names and others, different on every request.

Measured over `--seconds` once every pod is up (after a baseline window without the hostile
pods): the operator's peak RSS, its CPU per watchdog round, whether it lost the Lease (exited,
another holder, or a renewal gap beyond the renew deadline), and `healthy_rounds_late`: rounds
of `calm` that came later than their interval allows, took longer than the scrape timeout, or
failed a healthy pod's scrape. Bounded: every wait has a deadline and the namespace is deleted
at the end. Progress on stderr, one JSON line last.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import http.server
import itertools
import json
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

import pdwarden_contract as contract
from pdwarden_localcluster.waits import serving, wait_for
from pdwarden_testkit.cluster_env import (
    API_TRANSIENT,
    Env,
    open_env,
    operator_page,
    synthetic_model,
)
from pdwarden_testkit.promtext import metric_sum, samples

GROUP, VERSION, PLURAL = contract.API_GROUP, contract.API_VERSION, contract.PLURAL
BODY_BYTES = 1 << 20  # the watchdog's body limit: a hostile body as big as it may be
LEASE_NAME = "pdwarden-operator"
RENEW_DEADLINE_S = 10.0  # the operator's (leader.Timing)
SAMPLE_S = 0.5
READY_TIMEOUT_S = 600.0
CALM, BOMB = "calm", "bomb"
# the contract's names (so the lines pass the watchdog's name filter) and others
HOSTILE_NAMES = (
    contract.METRIC_KV_PEER_INFLIGHT,
    contract.METRIC_KV_PEER_TRANSFERS_TOTAL,
    contract.METRIC_RUNTIME_THREADS,
    contract.METRIC_KV_TRANSFERS_TOTAL,
    contract.METRIC_INFLIGHT_REQUESTS,
    "sglang_noise",
    "process_noise",
)
HOSTILE_LABELS = (
    contract.LABEL_METRIC_PEER,
    contract.LABEL_METRIC_OUTCOME,
    contract.LABEL_METRIC_THREAD,
    "x",
)


def _say(msg: str) -> None:
    print(f"[bench metrics-bomb] {msg}", file=sys.stderr, flush=True)


# --- the endpoints (run inside the pods: `python -m pdwarden_bench.metrics_bomb --serve KIND`) ---


def hostile_body(size: int = BODY_BYTES) -> bytes:
    """`size` bytes of samples with random label values of 16 B to 8 KiB, new on every call."""
    lines: list[str] = []
    total = 0
    while total < size:
        labels = ",".join(
            f'{random.choice(HOSTILE_LABELS)}="{os.urandom(random.randint(8, 4096)).hex()}"'
            for _ in range(random.randint(1, 4))
        )
        line = f"{random.choice(HOSTILE_NAMES)}{{{labels}}} {random.random()}\n"
        lines.append(line)
        total += len(line)
    return "".join(lines).encode()[:size]


class HealthyRuntime:
    """A runtime's real metrics: 3 rooms in flight, each concluded by the next scrape (so the
    pod makes progress and none is stuck), bound to `peers`, with watched threads."""

    def __init__(self, peers: list[str]) -> None:
        from pdwarden_runtime.hardening.threads import ThreadWatch
        from pdwarden_runtime.inflight import InflightTracker
        from pdwarden_runtime.metrics import RuntimeMetrics
        from pdwarden_runtime.status import RoomStatusTable

        self._peers = peers or [contract.PEER_OTHER]
        self._lock = threading.Lock()
        self._table = RoomStatusTable("sticky")
        watch = ThreadWatch()
        self._alive = threading.Event()
        for kind in (contract.THREAD_NIXL_BOOTSTRAP, contract.THREAD_NIXL_TRANSFER_WORKER):
            thread = threading.Thread(target=self._alive.wait, daemon=True)
            thread.start()
            watch.watch(thread, kind=kind)
        self.metrics = RuntimeMetrics(
            contract.ROLE_PREFILL,
            self._table,
            InflightTracker(self._table),
            engine="synthetic",
            transfer_backend="nixl",
            threads=watch,
        )
        self._open: list[int] = []
        self._next = 1

    def body(self) -> bytes:
        from pdwarden_runtime.kvpoll import KVPoll

        with self._lock:
            for room in self._open:
                self._table.update(room, KVPoll.Success)
            self._open = []
            for _ in range(3):
                room, self._next = self._next, self._next + 1
                self._table.open(room, KVPoll.Bootstrapping)
                self.metrics.peers.bind(room, [self._peers[room % len(self._peers)]])
                self._table.update(room, KVPoll.Transferring)
                self._open.append(room)
            return self.metrics.exposition()[0]


def serve(kind: str, port: int) -> None:
    healthy = HealthyRuntime(os.environ.get("PEERS", "").split(",")) if kind == "healthy" else None

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = healthy.body() if healthy is not None else hostile_body()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()


# --- the cluster side ---------------------------------------------------------------------------


def _fake_pod(model: dict[str, Any], name: str, kind: str, env: dict[str, str]) -> dict[str, Any]:
    """A pod of this module, handed to `model` as a drain hands over a quarantined pod."""
    meta = model["metadata"]
    port = contract.DEFAULT_METRICS_PORT
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                contract.LABEL_MODEL: meta["name"],
                contract.LABEL_ROLE: contract.ROLE_QUARANTINED,
                contract.LABEL_QUARANTINED_ROLE: contract.ROLE_PREFILL,
                contract.LABEL_QUARANTINE_REASON: contract.QUARANTINE_REASON_WEDGED,
                "pdwarden.io/bench": kind,
            },
            "annotations": {
                contract.ANNOTATION_QUARANTINED_AT: dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            },
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": contract.KIND,
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            # spread over every node: the GPU nodes' taint is tolerated (no GPU is asked for)
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "endpoint",
                    "image": "pdwarden-bench",
                    "command": ["python", "-m", "pdwarden_bench.metrics_bomb", "--serve", kind, str(port)],
                    "env": [{"name": k, "value": v} for k, v in env.items()],
                    "ports": [{"name": contract.PORT_NAME_METRICS, "containerPort": port}],
                    "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 1},
                }
            ],
        },
    }


def _fake_pods(env: Env, kind: str) -> list[dict[str, Any]]:
    path = f"/api/v1/namespaces/{env.namespace}/pods?labelSelector=pdwarden.io/bench={kind}"
    return list(env.call("GET", path)["items"])


@dataclass
class Window:
    """What one measured stretch saw, sampled every SAMPLE_S."""

    interval: float
    timeout: float
    started: float = field(default_factory=time.monotonic)
    cpu0: float = 0.0
    # model -> (at, seconds, a healthy pod's scrape failed) per round
    rounds: dict[str, list[tuple[float, float, bool]]] = field(default_factory=dict)
    calm_errors: float = 0.0
    healthy_errors_beside_hostile: float = 0.0
    hostile_unobserved_min: float | None = None
    renewals: list[float] = field(default_factory=list)  # when the Lease's renewTime changed
    holders: set[str] = field(default_factory=set)
    operator_exited: bool = False
    cpu: float = 0.0
    rss: tuple[float, float] = (0.0, 0.0)  # (current, peak) MiB at the last sample
    api_unreachable: int = 0  # samples whose read of the Lease failed


def _measure(env: Env, op: Any, seconds: float, interval: float, timeout: float) -> Window:
    window = Window(interval, timeout, cpu0=op.cpu_seconds())
    counts: dict[str, tuple[float, float]] = {}
    errors: dict[tuple[str, str], float] = {}
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{env.namespace}/leases/{LEASE_NAME}"
    renew_time = None
    count_name = f"{contract.METRIC_OPERATOR_SCRAPE_DURATION}_count"
    sum_name = f"{contract.METRIC_OPERATOR_SCRAPE_DURATION}_sum"
    end = window.started + seconds
    while time.monotonic() < end:
        now = time.monotonic()
        try:
            window.cpu = op.cpu_seconds() - window.cpu0
            window.rss = op.rss_mib()
        except (ProcessLookupError, FileNotFoundError):
            window.operator_exited = True
            break
        with contextlib.suppress(*API_TRANSIENT):
            page = samples(operator_page(op, timeout=5))
            failed = {CALM: False, BOMB: False}  # did a healthy pod's scrape fail since the last sample
            for key in (
                (CALM, contract.ROLE_PREFILL),
                (CALM, contract.ROLE_DECODE),
                (BOMB, contract.ROLE_DECODE),
            ):
                value = metric_sum(
                    page, contract.METRIC_OPERATOR_SCRAPE_ERRORS_TOTAL, model=key[0], role=key[1]
                )
                if key in errors and value > errors[key]:
                    failed[key[0]] = True
                    if key[0] == CALM:
                        window.calm_errors += value - errors[key]
                    else:
                        window.healthy_errors_beside_hostile += value - errors[key]
                errors[key] = value
            for model in (CALM, BOMB):
                count, total = (
                    metric_sum(page, count_name, model=model),
                    metric_sum(page, sum_name, model=model),
                )
                before = counts.get(model)
                if before is not None and count > before[0]:
                    # each round is one observation; two between samples share the time
                    seconds_each = (total - before[1]) / (count - before[0])
                    window.rounds.setdefault(model, []).extend(
                        [(now, seconds_each, failed[model])] * int(count - before[0])
                    )
                counts[model] = (count, total)
            unobserved = metric_sum(
                page, contract.METRIC_OPERATOR_UNOBSERVED_PODS, model=BOMB, role=contract.ROLE_PREFILL
            )
            if now - window.started > 2 * interval:  # every hostile pod scraped once by then
                low = window.hostile_unobserved_min
                window.hostile_unobserved_min = unobserved if low is None else min(low, unobserved)
        try:
            spec = env.call("GET", lease_path).get("spec") or {}
        except API_TRANSIENT:
            window.api_unreachable += 1  # an API server down explains a lost Lease
        else:
            window.holders.add(str(spec.get("holderIdentity")))
            if spec.get("renewTime") != renew_time:
                renew_time = spec.get("renewTime")
                window.renewals.append(now)
        time.sleep(max(0.0, SAMPLE_S - (time.monotonic() - now)))
    with contextlib.suppress(ProcessLookupError, FileNotFoundError):
        window.cpu = op.cpu_seconds() - window.cpu0
    window.renewals.append(time.monotonic())  # the gap up to the end counts too
    return window


def _late_rounds(window: Window) -> int:
    """Rounds of the calm model that came later than its interval allows (plus the timeout and
    the sampling's resolution), took longer than the timeout, or failed a healthy pod."""
    rounds = window.rounds.get(CALM, [])
    late = sum(1 for _, took, failed in rounds if took > window.timeout or failed)
    times = [window.started] + [at for at, _, _ in rounds] + [time.monotonic()]
    allowed = window.interval + window.timeout + 2 * SAMPLE_S
    return late + sum(1 for a, b in itertools.pairwise(times) if b - a > allowed)


def _gap(times: list[float]) -> float:
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def _wait_ready(env: Env, what: str, ready: Any) -> None:
    _say(f"waiting for {what}")
    wait_for(ready, READY_TIMEOUT_S, what, 1.0, API_TRANSIENT)


def _run(kubeconfig: Path, hostile: int, healthy: int, seconds: float, interval: int) -> dict[str, Any]:
    namespace = f"bench-bomb-{uuid.uuid4().hex[:6]}"
    timeout = max(0.5, min(5.0, interval / 2))  # the watchdog's per-pod timeout at this interval
    watchdog = {
        "stuckAfterSeconds": 60,
        "scrapeIntervalSeconds": interval,
        "action": "alert",
        "maxRemediations": 3,
        "budgetWindowSeconds": 600,
        "maxUnavailable": 1,
        # the endpoints are handed over as quarantined pods: far above the run, none is deleted
        "drainSeconds": 3600,
    }
    transfer = {"inflightDeadlineSeconds": 50, "transferDeadlineSeconds": 10}
    with tempfile.TemporaryDirectory(prefix="pdwarden-bench-bomb-") as tmp:
        envs = open_env(kubeconfig, namespace, Path(tmp))
        env = next(envs)
        try:
            env.call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
            wait_for(
                lambda: env.call("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default"),
                60,
                "the namespace's default ServiceAccount",
                0.5,
                API_TRANSIENT,
            )
            op = env.start_operator()
            for name in (CALM, BOMB):
                model = synthetic_model(namespace, name, replicas=1, transfer=transfer, watchdog=watchdog)
                # the operator runs on the host here, outside any pod a policy could name: let it scrape
                model["spec"]["networkPolicy"] = {"enabled": False}
                env.create_model(model)
            _wait_ready(
                env,
                "1 prefill + 1 decode runtime pods per model",
                lambda: all(env.live_ready_pods(m, r) for m in (CALM, BOMB) for r in contract.RUNTIME_ROLES),
            )
            calm = env.dm(CALM)
            decode_ips = [p["status"]["podIP"] for p in env.live_ready_pods(CALM, contract.ROLE_DECODE)]
            for i in range(healthy):
                env.call(
                    "POST",
                    f"/api/v1/namespaces/{namespace}/pods",
                    _fake_pod(calm, f"healthy-{i}", "healthy", {"PEERS": ",".join(decode_ips)}),
                )
            _wait_ready(
                env,
                f"{healthy} healthy endpoints",
                lambda: sum(map(serving, _fake_pods(env, "healthy"))) == healthy,
            )
            time.sleep(3 * interval)  # every healthy endpoint scraped before the baseline
            _say("baseline: the healthy endpoints alone")
            baseline = _measure(env, op, 4 * interval, interval, timeout)
            if baseline.operator_exited:
                raise click.ClickException(
                    f"the operator exited before the bomb:\n{env.operator_logs()[-3000:]}"
                )
            baseline_rss = op.rss_mib()[0]
            bomb = env.dm(BOMB)
            for i in range(hostile):
                env.call(
                    "POST",
                    f"/api/v1/namespaces/{namespace}/pods",
                    _fake_pod(bomb, f"hostile-{i}", "hostile", {}),
                )
            _wait_ready(
                env,
                f"{hostile} hostile endpoints",
                lambda: sum(map(serving, _fake_pods(env, "hostile"))) == hostile,
            )
            _say(f"measuring for {seconds:g}s: {hostile} hostile beside {healthy} healthy endpoints")
            window = _measure(env, op, seconds, interval, timeout)
            rss_now, rss_peak = window.rss if window.operator_exited else op.rss_mib()
            log_tail = env.operator_logs()
        finally:
            with contextlib.suppress(StopIteration):
                next(envs)  # stops the operator, deletes the namespace, waits for its pods
    rounds = sum(len(r) for r in window.rounds.values())
    baseline_rounds = sum(len(r) for r in baseline.rounds.values())
    renew_gap = _gap(window.renewals)
    return {
        "benchmark": "metrics-bomb",
        "N": hostile,
        "M": healthy,
        "rounds": rounds,
        "seconds": round(seconds, 1),
        "operator_rss_mib_max": round(rss_peak, 1),
        "lease_lost": window.operator_exited
        or "leadership lost" in log_tail
        or len(window.holders) > 1
        or renew_gap >= RENEW_DEADLINE_S,
        "healthy_rounds_late": _late_rounds(window),
        "cpu_per_round": round(window.cpu / rounds, 4) if rounds else None,
        "operator_rss_mib_end": round(rss_now, 1),
        "baseline_rss_mib": round(baseline_rss, 1),
        "baseline_cpu_per_round": round(baseline.cpu / baseline_rounds, 4) if baseline_rounds else None,
        "operator_cpu_cores": round(window.cpu / seconds, 3),
        "lease_renew_gap_max_s": round(renew_gap, 2),
        "operator_exited": window.operator_exited,
        "api_unreachable_samples": window.api_unreachable,
        "hostile_unobserved_min": window.hostile_unobserved_min,
        "healthy_scrape_errors": window.calm_errors,
        "healthy_errors_beside_hostile": window.healthy_errors_beside_hostile,
        "calm_round_seconds_max": round(max((s for _, s, _ in window.rounds.get(CALM, [])), default=0.0), 3),
        "bomb_round_seconds_max": round(max((s for _, s, _ in window.rounds.get(BOMB, [])), default=0.0), 3),
        "scrape_interval_s": interval,
        "runtime_pods": 4,
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }


@click.command("metrics-bomb")
@click.option("--hostile", "-N", type=click.IntRange(1, 200), default=16, show_default=True)
@click.option("--healthy", "-M", type=click.IntRange(1, 200), default=8, show_default=True)
@click.option(
    "--seconds", type=click.FloatRange(10, 3600), default=60, show_default=True, help="measured time"
)
@click.option(
    "--interval", type=click.IntRange(2, 60), default=5, show_default=True, help="scrape interval (s)"
)
@click.option(
    "--kubeconfig", default=None, help="Default: $KUBECONFIG, else the local cluster (started if down)."
)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line on stdout.")
def metrics_bomb(
    hostile: int, healthy: int, seconds: float, interval: int, kubeconfig: str | None, as_json: bool
) -> None:
    """Hostile /metrics beside healthy ones, through the real operator: memory, CPU, Lease, lateness."""
    if kubeconfig is None:
        if os.environ.get("KUBECONFIG"):
            kubeconfig = os.environ["KUBECONFIG"]
        else:
            from pdwarden_localcluster.cluster import ensure_up

            kubeconfig = str(ensure_up().kubeconfig)
    result = _run(Path(kubeconfig), hostile, healthy, seconds, interval)
    if not as_json:
        for key, value in result.items():
            _say(f"{key}: {value}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]))
    else:
        metrics_bomb()

"""`pdwarden bench reconcile`: how fast the operator turns DisaggregatedModels into children.

Applies N synthetic models with 0 replicas (so no pod processes start) into a fresh
namespace, one after another, while a real operator process watches that namespace (after
one warm-up model has been reconciled, so operator start-up is not measured). For
each model it measures the seconds from its apply returning to its status being written
(the reconciler writes status only after every child was applied), then checks that every
model has all its children, and reads the operator's resident memory. Then the operator's CPU
per minute while the cluster's controllers catch up with the children (each Deployment
observed), then with every model and child unchanged (steady), and a new operator process
resuming them (seconds
until it handled each, start-up included, its CPU, and the server-side applies it sent,
from the API server's own request counter). Then the API server's own share (`--floor`): the
same number of models in another namespace, no operator running, each model's Secret and
children rendered by the operator's own builders and applied in the operator's waves by one
client with the operator's connection pool, every model at once: the seconds that leaves no
operator could beat on this cluster; and the same again with the models arriving back to back as
the operator arm's do, each one's writes sent as it arrives (the same clock as the operator arm's
`all_reconciled_s`). Last line: JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

import pdwarden_contract as contract
from pdwarden_localcluster.kubeapi import ApiError, KubeApi
from pdwarden_operator.kube import apply as kube_apply

if TYPE_CHECKING:
    from pdwarden_operator.kube.client import KubeClient
    from pdwarden_testkit.operator_process import OperatorProcess

TEARDOWN_WAIT_S = 180.0


@dataclass(frozen=True)
class Goal:
    p50_s: float
    all_reconciled_s: float | None
    rss_mib: float


# Up to 100 models: the first reconcile goal; beyond, the thousand-model one (p50 2 s, every
# model within 30 s, 300 MiB).
SMALL_GOAL = Goal(p50_s=1.0, all_reconciled_s=None, rss_mib=150.0)
LARGE_GOAL = Goal(p50_s=2.0, all_reconciled_s=30.0, rss_mib=300.0)


def goal_for(models: int) -> Goal:
    return SMALL_GOAL if models <= 100 else LARGE_GOAL


def goal_met(
    goal: Goal, *, p50_s: float, all_reconciled_s: float, peak_rss_mib: float, complete: bool
) -> bool:
    """The earlier goal in seconds (`queue_goal_met`): in a burst, p50 measures the queue."""
    return (
        complete
        and p50_s <= goal.p50_s
        and (goal.all_reconciled_s is None or all_reconciled_s <= goal.all_reconciled_s)
        and peak_rss_mib <= goal.rss_mib
    )


# The goals, each a ratio or a bound measured in the same run (`goals`).
BURST_OVER_FLOOR = 1.3  # a burst: every model reconciled within 1.3x the API server's own share
RSS_MIB = 300.0
RATE_P50_S, RATE_P99_S = 2.0, 10.0  # models arriving at --rate (a GitOps sync): create to status
IDLE_CPU_S_PER_MIN = 0.05  # a settled fleet between resync passes
FULL_PASS_OVER_MODEL_PASSES = 2.0  # a full resync pass over one model's reconcile CPU x models


def ratio(numerator: float | None, denominator: float | None, digits: int = 3) -> float | None:
    """`numerator / denominator`, None when either is unknown or the denominator is not positive."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return round(numerator / denominator, digits)


def idle_cpu_s_per_min(
    window_cpu_s: float, window_s: float, passes_cpu_s: float, passes_s: float
) -> float | None:
    """CPU-s a minute between resync passes: the window's CPU less its full passes' CPU, over
    the window's time less theirs (None when nothing of the window is left)."""
    quiet_s = window_s - passes_s
    if quiet_s < 1.0:
        return None
    return round(max(0.0, window_cpu_s - passes_cpu_s) * 60.0 / quiet_s, 4)


def _within(value: float | None, bound: float) -> bool | None:
    return None if value is None else value <= bound


def _all(parts: list[bool | None]) -> bool:
    """Met when every part was measured and met (an unmeasured part is not met)."""
    return all(p is True for p in parts)


def goals(
    *,
    rate: float | None,
    complete: bool,
    p50_s: float,
    p99_s: float,
    peak_rss_mib: float,
    all_reconciled_over_floor: float | None,
    idle_cpu_s_per_min: float | None,
    full_resync_over_model_passes: float | None,
) -> dict[str, Any]:
    """`goal_met` of the run's mode (burst without `rate`, else the paced arrivals) and of the
    settled fleet, each part None when the run did not measure it; `goal_met` itself needs
    the mode's part and the settled part both measured and met."""
    if rate is None:
        mode = _all([complete, _within(all_reconciled_over_floor, BURST_OVER_FLOOR), peak_rss_mib <= RSS_MIB])
    else:
        mode = _all([complete, p50_s <= RATE_P50_S, p99_s <= RATE_P99_S, peak_rss_mib <= RSS_MIB])
    idle = _within(idle_cpu_s_per_min, IDLE_CPU_S_PER_MIN)
    full = _within(full_resync_over_model_passes, FULL_PASS_OVER_MODEL_PASSES)
    settled = None if idle is None or full is None else idle and full
    return {
        "goal_met_burst": mode if rate is None else None,
        "goal_met_rate": mode if rate is not None else None,
        "goal_met_settled": settled,
        "goal_met": _all([mode, settled]),
    }


WARMUP = "bench-warmup"  # reconciled first, left out of the figures


def _say(msg: str) -> None:
    print(f"[bench reconcile] {msg}", file=sys.stderr, flush=True)


def _model(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
        "kind": contract.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"path": "synthetic/bench"},
            "engine": "synthetic",
            "prefill": {"replicas": 0},
            "decode": {"replicas": 0},
            "router": {"replicas": 0},
        },
    }


def children_per_model() -> int:
    """The children the operator's builders render for one of the bench's models (its worker
    key's Secret is written beside them, not counted)."""
    from pdwarden_operator.models import parse_spec
    from pdwarden_operator.render.children import render_children
    from pdwarden_operator.render.meta import Owner

    body = _model("sample", "sample")
    owner = Owner(name="sample", namespace="sample", uid=str(uuid.UUID(int=0)))
    return len(render_children(owner, parse_spec(body["spec"])))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[k]


class StatusWatch:
    """Records when each model's status first reports its current generation (own thread)."""

    def __init__(self, kubeconfig: str, namespace: str) -> None:
        self.namespace = namespace
        self.done: dict[str, float] = {}
        self._stop = threading.Event()
        self._api = KubeApi.from_kubeconfig(Path(kubeconfig))
        self._thread = threading.Thread(target=self._run, name="status-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        path = (
            f"/apis/{contract.API_GROUP}/{contract.API_VERSION}/namespaces/{self.namespace}/{contract.PLURAL}"
        )
        while not self._stop.is_set():
            try:
                # No resourceVersion: each (re)opened watch starts with every model as ADDED.
                for kind, obj in self._api.watch(path, {}, timeout_seconds=30):
                    if kind in ("ADDED", "MODIFIED"):
                        meta, status = obj.get("metadata", {}), obj.get("status") or {}
                        seen = int(status.get("observedGeneration") or 0)
                        if seen and seen >= int(meta.get("generation") or 1):
                            self.done.setdefault(meta["name"], time.monotonic())
                    if self._stop.is_set():
                        break
            except Exception as exc:  # a dropped watch is re-opened
                _say(f"watch restarted: {exc}")
                time.sleep(0.5)

    def stop(self) -> None:
        self._stop.set()


async def _run(
    models: int,
    kubeconfig: str,
    health_port: int,
    timeout: float,
    steady_s: float,
    floor: bool,
    rate: float | None = None,
) -> dict[str, Any]:
    from pdwarden_operator.kube.client import connect

    client = connect(kubeconfig)
    try:
        result = await _operator_arm(client, models, kubeconfig, health_port, timeout, steady_s, rate)
        if floor:
            result |= await _floor(client, models, kubeconfig)
        return with_goals(result, rate)
    finally:
        await client.aclose()


async def _operator_arm(
    client: KubeClient,
    models: int,
    kubeconfig: str,
    health_port: int,
    timeout: float,
    steady_s: float,
    rate: float | None,
) -> dict[str, Any]:
    from pdwarden_operator.crd import CRD_NAME, build_crd
    from pdwarden_operator.render.kinds import CHILD_KINDS
    from pdwarden_testkit.operator_process import OperatorProcess

    await kube_apply.apply(client, build_crd())
    for _ in range(100):
        crd = await kube_apply.get(
            client, "apiextensions.k8s.io/v1", "CustomResourceDefinition", None, CRD_NAME
        )
        status = (crd or {}).get("status") or {}  # a fresh CRD may have no conditions yet
        conds = {c["type"]: c["status"] for c in status.get("conditions") or []}
        if conds.get("Established") == "True":
            break
        await asyncio.sleep(0.1)
    namespace = await _new_namespace(client, "reconcile")
    log_path = Path(tempfile.gettempdir()) / f"{namespace}-operator.log"
    op = OperatorProcess(
        kubeconfig, namespaces=(namespace,), health_port=health_port or None, log_path=log_path
    )
    watch = StatusWatch(kubeconfig, namespace)
    try:
        await asyncio.to_thread(op.start)
        _say(f"operator up (pid {op.proc.pid if op.proc else '?'}, log {log_path}); applying {models} models")
        watch.start()
        # Measure steady state, not start-up: a model the operator has reconciled proves its
        # watches are open (a just-created CRD answers 429 "storage is initializing" for a while).
        await kube_apply.apply(client, _model(WARMUP, namespace))
        warm_deadline = time.monotonic() + timeout
        while WARMUP not in watch.done:
            if time.monotonic() > warm_deadline:
                raise click.ClickException(f"the operator did not reconcile a first model; see {log_path}")
            await asyncio.sleep(0.1)
        cpu_before = op.cpu_seconds()
        load_before = os.getloadavg()[0]
        started: dict[str, float] = {}
        requests_before = await asyncio.to_thread(_apiserver_requests, kubeconfig)
        first_apply = time.monotonic()
        for i in range(models):
            name = f"bench-{i:04d}"
            if rate is not None:  # paced arrivals (a GitOps sync); else back to back
                await asyncio.sleep(max(0.0, first_apply + i / rate - time.monotonic()))
            await kube_apply.apply(client, _model(name, namespace))
            started[name] = time.monotonic()
            if (i + 1) % 25 == 0:
                _say(f"applied {i + 1}/{models}, status written for {sum(n in watch.done for n in started)}")
        deadline = time.monotonic() + timeout
        while sum(n in watch.done for n in started) < models and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        rss, peak = op.rss_mib()
        cpu = op.cpu_seconds() - cpu_before
        requests_after = await asyncio.to_thread(_apiserver_requests, kubeconfig)
        load_after = os.getloadavg()[0]
        # The cluster's controllers then catch up with the children (on a small machine the
        # Deployment controller observes a thousand new Deployments minutes later): each status
        # update it writes is a watch event the operator answers. Measured apart from...
        settle_from, settle_cpu_from = time.monotonic(), op.cpu_seconds()
        behind = await _controllers_caught_up(client, namespace, timeout)
        settled_s = time.monotonic() - settle_from
        settle_cpu = op.cpu_seconds() - settle_cpu_from
        # ...steady state: every model and child unchanged, nothing but the periodic resync and
        # the watches' own traffic left to cost CPU (by default over one whole period of the full
        # resync, most of what is left: a minute's window holds it once or not at all).
        steady_from, log_from = op.cpu_seconds(), log_path.stat().st_size
        await asyncio.sleep(steady_s)
        steady_cpu = op.cpu_seconds() - steady_from
        passes = full_resyncs(log_path.read_bytes()[log_from:].decode(errors="replace"))
        # Resume: a new operator process over the same unchanged models, as after an upgrade,
        # a restart or a change of leader.
        await asyncio.to_thread(op.stop)
        resume_log = log_path.with_name(f"{namespace}-operator-resumed.log")
        op = OperatorProcess(
            kubeconfig, namespaces=(namespace,), health_port=health_port or None, log_path=resume_log
        )
        resume = await _resume(op, kubeconfig, resume_log, models + 1, timeout)
        counts: Counter[str] = Counter()
        for api_version, kind in CHILD_KINDS:
            selector = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
            for obj in await kube_apply.list_objects(client, api_version, kind, namespace, selector):
                counts[obj["metadata"]["labels"].get(contract.LABEL_MODEL, "?")] += 1
        per_model = children_per_model()
        complete = sum(1 for n in started if counts.get(n) == per_model)
        latencies = [watch.done[n] - started[n] for n in started if n in watch.done]
        finished = [watch.done[n] for n in started if n in watch.done]
    finally:
        watch.stop()
        await asyncio.to_thread(op.stop)
        await _delete_namespace(client, namespace)
    if not latencies:
        raise click.ClickException(f"no model got a status within {timeout:.0f}s; see {log_path}")
    goal = goal_for(models)
    full_pass = passes[-1] if passes else None
    yardstick = await asyncio.to_thread(model_pass_cpu_s, client)  # asyncio.run on a thread of its own
    return {
        "bench": "reconcile",
        "models": models,
        "status_written": len(latencies),
        "children_complete": complete,
        "p50_s": round(statistics.median(latencies), 3),
        "p99_s": round(_percentile(latencies, 0.99), 3),
        "max_s": round(max(latencies), 3),
        # Throughput context: the models arrive back to back, as `kubectl apply -f dir/` sends them.
        "apply_all_s": round(max(started.values()) - first_apply, 3),
        "all_reconciled_s": round(max(finished) - first_apply, 3),
        "operator_rss_mib": round(rss, 1),
        "operator_peak_rss_mib": round(peak, 1),
        "operator_cpu_s": round(cpu, 2),
        # every client's requests from the first apply to the last status, the bench's own
        # applies of the models and the controllers' work included, per model
        "api_requests_per_model": requests_per_model(requests_before, requests_after, models),
        **resume,
        "controllers_caught_up_s": round(settled_s, 1),
        # not 0: the steady window began with the controllers still writing statuses, each a
        # watch event the operator answers (steady_cpu_s_per_min is then not a quiet cluster's)
        "deployments_unobserved_at_steady": behind,
        "catching_up_cpu_s_per_min": round(settle_cpu * 60.0 / settled_s, 2) if settled_s >= 1 else None,
        "steady_seconds": steady_s,
        "steady_cpu_s_per_min": round(steady_cpu * 60.0 / steady_s, 2) if steady_s else None,
        # the settled fleet: the full resync passes the steady window held (the operator's log),
        # the CPU between them, and the yardstick of a pass: one model's reconcile in this process
        "full_resyncs_in_steady": len(passes),
        "full_resync_models": full_pass.models if full_pass else None,
        "full_resync_s": full_pass.seconds if full_pass else None,
        "full_resync_cpu_s": full_pass.cpu_s if full_pass else None,
        "model_pass_cpu_ms": round(yardstick * 1000.0, 3),
        "full_resync_over_model_passes": (
            ratio(full_pass.cpu_s, yardstick * full_pass.models) if full_pass else None
        ),
        "idle_cpu_s_per_min": (
            idle_cpu_s_per_min(
                steady_cpu, steady_s, sum(p.cpu_s for p in passes), sum(p.seconds for p in passes)
            )
            if steady_s
            else None
        ),
        # The machine is shared: say how busy it was, since that moves every latency.
        "loadavg_1m": [round(load_before, 2), round(load_after, 2)],
        "cpus": os.cpu_count(),
        "mode": "burst" if rate is None else "rate",
        "rate_per_s": rate,
        "goal_p50_s": goal.p50_s,
        "goal_all_reconciled_s": goal.all_reconciled_s,
        "goal_rss_mib": goal.rss_mib,
        "queue_goal_met": goal_met(
            goal,
            p50_s=statistics.median(latencies),
            all_reconciled_s=max(finished) - first_apply,
            peak_rss_mib=peak,
            complete=complete == models,
        ),
    }


async def _new_namespace(client: KubeClient, purpose: str) -> str:
    """A fresh namespace of this run's, `pdw-bench-<purpose>-<suffix>` (`_delete_namespace` ends it)."""
    namespace = f"pdw-bench-{purpose}-{uuid.uuid4().hex[:6]}"
    await kube_apply.apply(client, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    return namespace


async def _delete_namespace(client: KubeClient, namespace: str) -> None:
    """Delete `namespace` and wait for the namespace controller to finish, so what follows is
    not measured against this teardown (thousands of objects to delete)."""
    try:
        await kube_apply.delete(client, "v1", "Namespace", None, namespace)
        gone_by = time.monotonic() + TEARDOWN_WAIT_S
        while time.monotonic() < gone_by:
            if await kube_apply.get(client, "v1", "Namespace", None, namespace) is None:
                return
            await asyncio.sleep(0.5)
        _say(f"namespace {namespace} is still terminating after {TEARDOWN_WAIT_S:.0f}s")
    except Exception as exc:
        _say(f"could not delete namespace {namespace}: {exc}")


async def _first_pass(client: KubeClient, body: dict[str, Any]) -> int:
    """What the operator's first pass over a new model writes, built by its own functions (its
    worker key's Secret, then its children in `plan.apply_waves` order) and sent by its client
    (its connection pool bounds the requests in flight), with nothing else: no reads, no
    dry-runs, no status. Returns the writes."""
    from dataclasses import replace

    from pdwarden_operator import plan, worker_key_secret
    from pdwarden_operator.models import parse_spec
    from pdwarden_operator.reconcile.executor import with_worker_key
    from pdwarden_operator.render.children import render_children
    from pdwarden_operator.render.meta import Owner

    spec = parse_spec(dict(body["spec"]))
    owner = Owner.from_body(body)
    # a new model: no workload uses a key yet (the Secret's name is still the stand-in)
    use = worker_key_secret.plan_use([], owner.name, spec.worker_key.enabled)
    owner = replace(owner, worker_key=use)
    rendered = plan.stamped(render_children(owner, spec))
    _, objs, secret = await with_worker_key(client, spec, owner, rendered)
    for wave in plan.apply_waves(objs):
        await asyncio.gather(*(kube_apply.apply(client, o) for o in wave))
    return len(objs) + (secret is not None)


async def _floor(client: KubeClient, models: int, kubeconfig: str) -> dict[str, Any]:
    """The API server's own share of a reconcile, no operator watching, twice:

    - `floor_all_written_s`: `models` models applied first (not timed), then every one's first
      pass (`_first_pass`) at once: seconds from the first write to the last answer;
    - `floor_arrivals_all_written_s`: the models arriving as the operator arm's do (back to back
      from a client of their own, on a thread), each one's first pass sent as soon as its apply
      returns: seconds from the first model's apply to the last answer. The operator cannot
      reconcile a model before it arrives, and its writes slow the arrivals as these do: this
      one is the same clock as `all_reconciled_s`."""
    namespace = await _new_namespace(client, "floor")
    try:
        _say(f"floor: {models} models in {namespace}, no operator")
        bodies = [await kube_apply.apply(client, _model(f"floor-{i:04d}", namespace)) for i in range(models)]
        before = await asyncio.to_thread(_apiserver_requests, kubeconfig)
        begun = time.monotonic()
        writes = sum(await asyncio.gather(*(_first_pass(client, b) for b in bodies)))
        seconds = time.monotonic() - begun
        after = await asyncio.to_thread(_apiserver_requests, kubeconfig)
    finally:
        await _delete_namespace(client, namespace)
    arrivals = await _floor_with_arrivals(client, models, kubeconfig)
    return {
        "floor_all_written_s": round(seconds, 3),
        "floor_writes": writes,
        "floor_writes_per_s": round(writes / seconds, 1) if seconds > 0 else None,
        "floor_api_requests_per_model": requests_per_model(before, after, models),
        **arrivals,
    }


async def _floor_with_arrivals(client: KubeClient, models: int, kubeconfig: str) -> dict[str, Any]:
    namespace = await _new_namespace(client, "arrivals")
    api = KubeApi.from_kubeconfig(Path(kubeconfig))
    loop = asyncio.get_running_loop()
    arrived: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    collection = f"/apis/{contract.API_GROUP}/{contract.API_VERSION}/namespaces/{namespace}/{contract.PLURAL}"

    def arrive() -> None:
        try:
            for i in range(models):
                name = f"arrive-{i:04d}"
                body = api.request(
                    "PATCH",
                    f"{collection}/{name}",
                    _model(name, namespace),
                    params={"fieldManager": "pdwarden-bench", "force": "true", "fieldValidation": "Strict"},
                    content_type="application/apply-patch+yaml",
                )
                loop.call_soon_threadsafe(arrived.put_nowait, body)
        finally:
            loop.call_soon_threadsafe(arrived.put_nowait, None)

    try:
        _say(f"floor with arrivals: {models} models in {namespace}, no operator")
        begun = time.monotonic()
        applier = asyncio.ensure_future(asyncio.to_thread(arrive))
        passes = []
        while (body := await arrived.get()) is not None:
            passes.append(asyncio.ensure_future(_first_pass(client, body)))
        applied_s = time.monotonic() - begun
        await applier  # its error, if it failed
        writes = sum(await asyncio.gather(*passes))
        seconds = time.monotonic() - begun
    finally:
        await _delete_namespace(client, namespace)
    return {
        "floor_arrivals_all_written_s": round(seconds, 3),
        "floor_arrivals_apply_all_s": round(applied_s, 3),
        "floor_arrivals_writes": writes,
    }


async def _controllers_caught_up(client: KubeClient, namespace: str, timeout: float) -> int:
    """Until the Deployment controller has observed every child Deployment's generation (or
    `timeout` seconds passed: said, and the steady window starts anyway). Returns how many it
    had not observed yet (0: caught up)."""
    selector = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
    deadline = time.monotonic() + timeout
    while True:
        items = await kube_apply.list_objects(client, "apps/v1", "Deployment", namespace, selector)
        behind = sum(
            1
            for d in items
            if (d.get("status") or {}).get("observedGeneration") != d["metadata"].get("generation")
        )
        if not behind:
            return 0
        if time.monotonic() > deadline:
            _say(f"{behind} Deployments still not observed by their controller after {timeout:.0f}s")
            return behind
        await asyncio.sleep(2.0)


RECONCILED = ": reconciled generation "  # handlers._reconcile_full's line, once per model handled
# handlers._resync_loop's line after each full resync pass
FULL_RESYNC = re.compile(r": full resync: (\d+) models in ([0-9.]+)s, ([0-9.]+) CPU-s")


@dataclass(frozen=True)
class FullResync:
    models: int
    seconds: float
    cpu_s: float


def full_resyncs(log_text: str) -> list[FullResync]:
    """The full resync passes an operator's log reports, in order."""
    return [FullResync(int(m[1]), float(m[2]), float(m[3])) for m in FULL_RESYNC.finditer(log_text)]


def model_pass_cpu_s(client: KubeClient, reps: int = 300) -> float:
    """One model's reconcile CPU, the yardstick of a full resync pass: `run.reconcile` of
    one of the bench's models over children exactly as rendered (render, compare, status; no
    API call is made, though the pass is given `client`), in this process. Median of `reps`
    passes, seconds."""
    from dataclasses import replace

    from pdwarden_operator import plan, worker_key_secret
    from pdwarden_operator.models import parse_spec
    from pdwarden_operator.podpolicy import PodPolicy
    from pdwarden_operator.reconcile import run
    from pdwarden_operator.reconcile.observe import Baseline
    from pdwarden_operator.render.children import child_key, render_children
    from pdwarden_operator.render.meta import Owner
    from pdwarden_operator.status_writer import StatusWriter

    body = _model("sample", "sample")
    body["metadata"] |= {"uid": str(uuid.UUID(int=1)), "generation": 1}
    spec = parse_spec(dict(body["spec"]))
    owner = Owner.from_body(body)
    use = worker_key_secret.plan_use([], owner.name, spec.worker_key.enabled)
    if use is not None:  # as after the first pass: a Secret of its own
        pending = worker_key_secret.pending(owner.name)
        use = use.renamed(pending, f"{owner.name}-worker-key-bench0")
    rendered = plan.stamped(render_children(replace(owner, worker_key=use), spec))
    children = {child_key(o): o for o in rendered}

    async def no_write(*_: Any) -> None:
        return None

    parts = run.ReconcileParts(client, StatusWriter(no_write), Baseline(), PodPolicy(allow=frozenset()))

    async def passes() -> list[float]:
        out = []
        for _ in range(reps):
            begun = time.thread_time()
            done = await run.reconcile(parts, body, children, None)
            out.append(time.thread_time() - begun)
            if done.applied:
                raise RuntimeError(f"the yardstick's pass applied {done.applied_names}")
        return out

    return statistics.median(asyncio.run(passes()))


def with_goals(result: dict[str, Any], rate: float | None) -> dict[str, Any]:
    """The run's figures with the ratios and goals (`goals`)."""
    over_floor = ratio(result.get("all_reconciled_s"), result.get("floor_all_written_s"))
    over_arrivals = ratio(result.get("all_reconciled_s"), result.get("floor_arrivals_all_written_s"))
    return result | {
        "all_reconciled_over_floor": over_floor,
        # the same bound on the same clock: the floor's models arriving as the operator arm's do
        "all_reconciled_over_arrivals_floor": over_arrivals,
        "goal_met_burst_over_arrivals": (
            None if rate is not None or over_arrivals is None else over_arrivals <= BURST_OVER_FLOOR
        ),
        "goal_all_reconciled_over_floor": BURST_OVER_FLOOR,
        "goal_rate_p50_s": RATE_P50_S,
        "goal_rate_p99_s": RATE_P99_S,
        "goal_idle_cpu_s_per_min": IDLE_CPU_S_PER_MIN,
        "goal_full_resync_over_model_passes": FULL_PASS_OVER_MODEL_PASSES,
        **goals(
            rate=rate,
            complete=result["children_complete"] == result["models"],
            p50_s=result["p50_s"],
            p99_s=result["p99_s"],
            peak_rss_mib=result["operator_peak_rss_mib"],
            all_reconciled_over_floor=over_floor,
            idle_cpu_s_per_min=result.get("idle_cpu_s_per_min"),
            full_resync_over_model_passes=result.get("full_resync_over_model_passes"),
        ),
    }


def _apiserver_requests(kubeconfig: str) -> Counter[str] | None:
    """Requests the API server has answered so far, every client's, by verb (a write of a
    status subresource as `<verb> status`); None if its /metrics cannot be read."""
    from pdwarden_testkit import promtext

    try:
        text = KubeApi.from_kubeconfig(Path(kubeconfig), timeout=30).text("/metrics")
        found = promtext.samples(text, {"apiserver_request_total"})
    except (ApiError, OSError, ValueError) as exc:
        _say(f"cannot read the API server's metrics: {exc}")
        return None
    counts: Counter[str] = Counter()
    for sample in found:
        verb = sample.labels.get("verb", "?")
        if sample.labels.get("subresource") == "status":
            verb += " status"
        counts[verb] += int(sample.value)
    return counts


def requests_per_model(
    before: Counter[str] | None, after: Counter[str] | None, models: int
) -> dict[str, float] | None:
    """The requests between two `_apiserver_requests` readings, by verb, per model."""
    if before is None or after is None or models <= 0:
        return None
    return {
        verb: round((after[verb] - before[verb]) / models, 2)
        for verb in sorted(after)
        if after[verb] - before[verb] > 0 and verb != "WATCH"
    }


def _apiserver_applies(kubeconfig: str) -> float | None:
    """Server-side applies the API server has answered so far, dry-runs included (nothing
    but the operator applies in the local cluster); None if its /metrics cannot be read."""
    counts = _apiserver_requests(kubeconfig)
    return None if counts is None else counts["APPLY"]


async def _resume(
    op: OperatorProcess, kubeconfig: str, log_path: Path, expected: int, timeout: float
) -> dict[str, Any]:
    """Start `op` over models it finds unchanged; seconds until it has handled all
    `expected`, its CPU and the applies it sent meanwhile (goal: none)."""
    before = await asyncio.to_thread(_apiserver_applies, kubeconfig)
    begun = time.monotonic()
    await asyncio.to_thread(op.start)
    handled = 0
    while time.monotonic() - begun < timeout:
        handled = log_path.read_text(errors="replace").count(RECONCILED)
        if handled >= expected:
            break
        await asyncio.sleep(0.2)
    seconds = time.monotonic() - begun
    cpu = op.cpu_seconds()
    after = await asyncio.to_thread(_apiserver_applies, kubeconfig)
    return {
        "resume_seconds": round(seconds, 2) if handled >= expected else None,
        "resume_models_handled": handled,
        "resume_operator_cpu_s": round(cpu, 2),
        "resume_applies": int(after - before) if after is not None and before is not None else None,
    }


def _kubeconfig(explicit: str | None) -> str:
    if explicit:
        return explicit
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    from pdwarden_localcluster.cluster import ensure_up

    return str(ensure_up().kubeconfig)


@click.command()
@click.option("--models", type=click.IntRange(1, 5000), default=100, show_default=True)
@click.option(
    "--kubeconfig", default=None, help="Default: $KUBECONFIG, else the local cluster (started if down)."
)
@click.option(
    "--health-port",
    type=int,
    default=0,
    show_default=True,
    help="The operator's liveness port (0: a free one).",
)
@click.option(
    "--timeout", type=float, default=300.0, show_default=True, help="Seconds to wait for all statuses."
)
@click.option(
    "--steady-seconds",
    type=click.FloatRange(0, 3600),
    default=None,
    help="Then measure the operator's CPU this long with every model unchanged (0: skip). "
    "Default: one period of the operator's full resync, which a shorter window holds once or not at all.",
)
@click.option(
    "--floor/--no-floor",
    default=True,
    show_default=True,
    help="Then write the same models' Secrets and children with no operator (the API server's share).",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Apply the models at this many a second (a GitOps sync). Default: back to back (a burst).",
)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line on stdout.")
def reconcile(
    models: int,
    kubeconfig: str | None,
    health_port: int,
    timeout: float,
    steady_seconds: float | None,
    floor: bool,
    rate: float | None,
    as_json: bool,
) -> None:
    """Apply N zero-replica models; p50/p99 seconds to children + status, operator RSS, then
    the operator's CPU per minute with all of them unchanged, then the API server's own share."""
    if steady_seconds is None:
        from pdwarden_operator.handlers import FULL_RESYNC_INTERVAL_S

        steady_seconds = FULL_RESYNC_INTERVAL_S
    result = asyncio.run(
        _run(models, _kubeconfig(kubeconfig), health_port, timeout, steady_seconds, floor, rate)
    )
    if not as_json:
        _say(
            f"p50 {result['p50_s']}s p99 {result['p99_s']}s, RSS {result['operator_rss_mib']} MiB "
            f"(peak {result['operator_peak_rss_mib']}), {result['children_complete']}/{models} complete"
        )
    print(json.dumps(result), flush=True)

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
operator could beat on this cluster. Last line: JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
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

if TYPE_CHECKING:
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
    return (
        complete
        and p50_s <= goal.p50_s
        and (goal.all_reconciled_s is None or all_reconciled_s <= goal.all_reconciled_s)
        and peak_rss_mib <= goal.rss_mib
    )


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
    from pdwarden_operator import render
    from pdwarden_operator.models import parse_spec

    body = _model("sample", "sample")
    owner = render.Owner(name="sample", namespace="sample", uid=str(uuid.UUID(int=0)))
    return len(render.render_children(owner, parse_spec(body["spec"])))


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
    models: int, kubeconfig: str, health_port: int, timeout: float, steady_s: float, floor: bool
) -> dict[str, Any]:
    from pdwarden_operator.kube import apply as kube
    from pdwarden_operator.kube.client import connect, set_client

    client = connect(kubeconfig)
    set_client(client)
    try:
        result = await _operator_arm(models, kubeconfig, health_port, timeout, steady_s)
        if floor:
            result |= await _floor(kube, models)
        return result
    finally:
        await client.aclose()


async def _operator_arm(
    models: int, kubeconfig: str, health_port: int, timeout: float, steady_s: float
) -> dict[str, Any]:
    from pdwarden_operator import render
    from pdwarden_operator.crd import CRD_NAME, build_crd
    from pdwarden_operator.kube import apply as kube
    from pdwarden_testkit.operator_process import OperatorProcess

    await kube.apply(build_crd())
    for _ in range(100):
        crd = await kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", None, CRD_NAME)
        status = (crd or {}).get("status") or {}  # a fresh CRD may have no conditions yet
        conds = {c["type"]: c["status"] for c in status.get("conditions") or []}
        if conds.get("Established") == "True":
            break
        await asyncio.sleep(0.1)
    namespace = f"pdw-bench-reconcile-{uuid.uuid4().hex[:6]}"
    await kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
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
        await kube.apply(_model(WARMUP, namespace))
        warm_deadline = time.monotonic() + timeout
        while WARMUP not in watch.done:
            if time.monotonic() > warm_deadline:
                raise click.ClickException(f"the operator did not reconcile a first model; see {log_path}")
            await asyncio.sleep(0.1)
        cpu_before = op.cpu_seconds()
        load_before = os.getloadavg()[0]
        started: dict[str, float] = {}
        first_apply = time.monotonic()
        for i in range(models):
            name = f"bench-{i:04d}"
            await kube.apply(_model(name, namespace))
            started[name] = time.monotonic()
            if (i + 1) % 25 == 0:
                _say(f"applied {i + 1}/{models}, status written for {sum(n in watch.done for n in started)}")
        deadline = time.monotonic() + timeout
        while sum(n in watch.done for n in started) < models and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        rss, peak = op.rss_mib()
        cpu = op.cpu_seconds() - cpu_before
        load_after = os.getloadavg()[0]
        # The cluster's controllers then catch up with the children (on a small machine the
        # Deployment controller observes a thousand new Deployments minutes later): each status
        # update it writes is a watch event the operator answers. Measured apart from...
        settle_from, settle_cpu_from = time.monotonic(), op.cpu_seconds()
        behind = await _controllers_caught_up(kube, namespace, timeout)
        settled_s = time.monotonic() - settle_from
        settle_cpu = op.cpu_seconds() - settle_cpu_from
        # ...steady state: every model and child unchanged, nothing but the periodic resync and
        # the watches' own traffic left to cost CPU (by default over one whole period of the full
        # resync, most of what is left: a minute's window holds it once or not at all).
        steady_from = op.cpu_seconds()
        await asyncio.sleep(steady_s)
        steady_cpu = op.cpu_seconds() - steady_from
        # Resume: a new operator process over the same unchanged models, as after an upgrade,
        # a restart or a change of leader.
        await asyncio.to_thread(op.stop)
        resume_log = log_path.with_name(f"{namespace}-operator-resumed.log")
        op = OperatorProcess(
            kubeconfig, namespaces=(namespace,), health_port=health_port or None, log_path=resume_log
        )
        resume = await _resume(op, kubeconfig, resume_log, models + 1, timeout)
        counts: Counter[str] = Counter()
        for api_version, kind in render.CHILD_KINDS:
            selector = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
            for obj in await kube.list_objects(api_version, kind, namespace, selector):
                counts[obj["metadata"]["labels"].get(contract.LABEL_MODEL, "?")] += 1
        per_model = children_per_model()
        complete = sum(1 for n in started if counts.get(n) == per_model)
        latencies = [watch.done[n] - started[n] for n in started if n in watch.done]
        finished = [watch.done[n] for n in started if n in watch.done]
    finally:
        watch.stop()
        await asyncio.to_thread(op.stop)
        await _delete_namespace(kube, namespace)
    if not latencies:
        raise click.ClickException(f"no model got a status within {timeout:.0f}s; see {log_path}")
    goal = goal_for(models)
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
        **resume,
        "controllers_caught_up_s": round(settled_s, 1),
        # not 0: the steady window began with the controllers still writing statuses, each a
        # watch event the operator answers (steady_cpu_s_per_min is then not a quiet cluster's)
        "deployments_unobserved_at_steady": behind,
        "catching_up_cpu_s_per_min": round(settle_cpu * 60.0 / settled_s, 2) if settled_s >= 1 else None,
        "steady_seconds": steady_s,
        "steady_cpu_s_per_min": round(steady_cpu * 60.0 / steady_s, 2) if steady_s else None,
        # The machine is shared: say how busy it was, since that moves every latency.
        "loadavg_1m": [round(load_before, 2), round(load_after, 2)],
        "cpus": os.cpu_count(),
        "goal_p50_s": goal.p50_s,
        "goal_all_reconciled_s": goal.all_reconciled_s,
        "goal_rss_mib": goal.rss_mib,
        "goal_met": goal_met(
            goal,
            p50_s=statistics.median(latencies),
            all_reconciled_s=max(finished) - first_apply,
            peak_rss_mib=peak,
            complete=complete == models,
        ),
    }


async def _delete_namespace(kube: Any, namespace: str) -> None:
    """Delete `namespace` and wait for the namespace controller to finish, so what follows is
    not measured against this teardown (thousands of objects to delete)."""
    try:
        await kube.delete("v1", "Namespace", None, namespace)
        gone_by = time.monotonic() + TEARDOWN_WAIT_S
        while time.monotonic() < gone_by:
            if await kube.get("v1", "Namespace", None, namespace) is None:
                return
            await asyncio.sleep(0.5)
        _say(f"namespace {namespace} is still terminating after {TEARDOWN_WAIT_S:.0f}s")
    except Exception as exc:
        _say(f"could not delete namespace {namespace}: {exc}")


async def _floor(kube: Any, models: int) -> dict[str, Any]:
    """The API server's own share of a reconcile: `models` models (no operator watches their
    namespace), then for every one at once what a first pass writes, built by the operator's own
    functions (its worker key's Secret, then its children in `plan.apply_waves` order) and sent
    by the operator's client (its connection pool bounds the requests in flight). Seconds from
    the first write to the last answer."""
    from dataclasses import replace

    from pdwarden_operator import plan, render, worker_key_secret
    from pdwarden_operator.models import parse_spec
    from pdwarden_operator.reconcile import with_worker_key

    namespace = f"pdw-bench-floor-{uuid.uuid4().hex[:6]}"
    await kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    try:
        _say(f"floor: {models} models in {namespace}, no operator")
        bodies = [await kube.apply(_model(f"floor-{i:04d}", namespace)) for i in range(models)]

        async def first_pass(body: dict[str, Any]) -> int:
            spec = parse_spec(dict(body["spec"]))
            owner = render.Owner.from_body(body)
            # a new model: no workload uses a key yet (the Secret's name is still the stand-in)
            use = worker_key_secret.plan_use([], owner.name, spec.worker_key.enabled)
            owner = replace(owner, worker_key=use)
            rendered = plan.stamped(render.render_children(owner, spec))
            objs, secret = await with_worker_key(body, spec, owner, rendered)
            for wave in plan.apply_waves(objs):
                await asyncio.gather(*(kube.apply(o) for o in wave))
            return len(objs) + (secret is not None)

        begun = time.monotonic()
        writes = sum(await asyncio.gather(*(first_pass(b) for b in bodies)))
        seconds = time.monotonic() - begun
    finally:
        await _delete_namespace(kube, namespace)
    return {
        "floor_all_written_s": round(seconds, 3),
        "floor_writes": writes,
        "floor_writes_per_s": round(writes / seconds, 1) if seconds > 0 else None,
    }


async def _controllers_caught_up(kube: Any, namespace: str, timeout: float) -> int:
    """Until the Deployment controller has observed every child Deployment's generation (or
    `timeout` seconds passed: said, and the steady window starts anyway). Returns how many it
    had not observed yet (0: caught up)."""
    selector = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
    deadline = time.monotonic() + timeout
    while True:
        items = await kube.list_objects("apps/v1", "Deployment", namespace, selector)
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


RECONCILED = ": reconciled generation "  # handlers.reconcile_model's line, once per model handled


def _apiserver_applies(kubeconfig: str) -> float | None:
    """Server-side applies the API server has answered so far, dry-runs included (nothing
    but the operator applies in the local cluster); None if its /metrics cannot be read."""
    from pdwarden_testkit import promtext

    try:
        text = KubeApi.from_kubeconfig(Path(kubeconfig), timeout=30).text("/metrics")
        found = promtext.samples(text, {"apiserver_request_total"})
    except (ApiError, OSError, ValueError) as exc:
        _say(f"cannot read the API server's metrics: {exc}")
        return None
    return promtext.metric_sum(found, "apiserver_request_total", verb="APPLY")


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
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line on stdout.")
def reconcile(
    models: int,
    kubeconfig: str | None,
    health_port: int,
    timeout: float,
    steady_seconds: float | None,
    floor: bool,
    as_json: bool,
) -> None:
    """Apply N zero-replica models; p50/p99 seconds to children + status, operator RSS, then
    the operator's CPU per minute with all of them unchanged, then the API server's own share."""
    if steady_seconds is None:
        from pdwarden_operator.handlers import FULL_RESYNC_INTERVAL_S

        steady_seconds = FULL_RESYNC_INTERVAL_S
    result = asyncio.run(_run(models, _kubeconfig(kubeconfig), health_port, timeout, steady_seconds, floor))
    if not as_json:
        _say(
            f"p50 {result['p50_s']}s p99 {result['p99_s']}s, RSS {result['operator_rss_mib']} MiB "
            f"(peak {result['operator_peak_rss_mib']}), {result['children_complete']}/{models} complete"
        )
    print(json.dumps(result), flush=True)

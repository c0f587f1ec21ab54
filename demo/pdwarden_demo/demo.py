"""`pdwarden demo`: a new user's first ten minutes, end to end on the local cluster (the run;
the scenario it follows is `pdwarden_demo.demo_scenario`, what it shows `pdwarden_demo.demo_report`).

Starts the embedded cluster, installs the Helm chart, deploys examples/synthetic.yaml
(2 prefill, 2 decode, 1 router), sends steady traffic through the router with some
clients cancelling, injects the emulated NIXL port's status race into ONE prefill pod, and shows the
wedge detected, the pod restarted, traffic recovering, the Events and status entries,
and the alerts that reached Alertmanager (the local cluster's Prometheus scrapes through the
chart's PodMonitor and ServiceMonitor and evaluates its PrometheusRule). Cleans up after
itself; exits non-zero if any of that did not happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import aiohttp
import click
import yaml
from rich.console import Console

import pdwarden_contract as contract
from pdwarden_demo import chart, demo_traffic
from pdwarden_demo.demo_kube import DemoCluster, DemoError, Obj, pod_ip, selector
from pdwarden_demo.demo_report import Steps, summary_table
from pdwarden_demo.demo_scenario import (
    ALERT_POLL_S,
    EXAMPLE,
    INFLIGHT_ALERTS,
    NAMESPACE,
    PREFILL_DEMO_ARGS,
    RECOVERY_SETTLE_S,
    RECOVERY_WINDOW_S,
    RELEASE,
    SCOPES,
    TRAFFIC,
    WARMUP_S,
    WEDGED_AFTER_S,
    AlertsSeen,
    DemoResult,
    Observed,
    chart_values,
    demo_manifest,
    event_relevant,
    operator_scope,
    recovered,
    remediations_for,
    wedge_seen,
)
from pdwarden_localcluster import monitoring, waits
from pdwarden_localcluster.errors import ClusterError
from pdwarden_localcluster.kubeapi import ApiError
from pdwarden_localcluster.waits import serving
from pdwarden_operator.render.meta import child_name
from pdwarden_runtime.worker_key import auth_headers

T = TypeVar("T")
FAULT = contract.FAULT_EMULATED_PORT_RACE


async def wait_for(check: Callable[[], T | None], timeout: float, what: str, interval: float) -> T:
    """The one `wait_for`, off the event loop; a timeout is a failed demo step."""
    try:
        return await asyncio.to_thread(waits.wait_for, check, timeout, what, interval)
    except waits.WaitTimeout as exc:
        raise DemoError(str(exc)) from None


def role_selector(role: str, model: str) -> str:
    return selector({contract.LABEL_MODEL: model, contract.LABEL_ROLE: role})


async def watch_alerts(alertmanager_url: str, seen: AlertsSeen, stop: asyncio.Event) -> None:
    """Ask Alertmanager every ALERT_POLL_S which of the demo namespace's alerts it holds, until
    stopped (a poll it does not answer is skipped: the next one asks again)."""
    while not stop.is_set():
        with contextlib.suppress(ClusterError):
            seen.add(await asyncio.to_thread(monitoring.alerts, alertmanager_url, namespace=NAMESPACE))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), ALERT_POLL_S)


def model_ready(kube: DemoCluster, name: str) -> bool:
    dm = kube.get_model(NAMESPACE, name) or {}
    if (dm.get("status") or {}).get("phase") != "Ready":
        return False
    want = {"prefill": 2, "decode": 2, "router": 1}
    return all(
        sum(serving(p) for p in kube.pods(NAMESPACE, role_selector(r, name))) >= n for r, n in want.items()
    )


def pods_summary(kube: DemoCluster, model: str) -> str:
    """`name: phase/ready (waiting reason)` of the model's pods, for an error message."""
    parts = []
    for pod in kube.pods(NAMESPACE, selector({contract.LABEL_MODEL: model})):
        statuses = pod.get("status", {}).get("containerStatuses") or [{}]
        waiting = (statuses[0].get("state") or {}).get("waiting") or {}
        reason = f" {waiting['reason']}" if waiting.get("reason") else ""
        parts.append(f"{pod['metadata']['name']} {'ready' if serving(pod) else 'not ready'}{reason}")
    return ", ".join(sorted(parts)) or "no pods"


def ready_pods(kube: DemoCluster, role: str, model: str) -> list[Obj]:
    return sorted(
        (p for p in kube.pods(NAMESPACE, role_selector(role, model)) if serving(p) and pod_ip(p)),
        key=lambda p: p["metadata"]["name"],
    )


async def inject_fault(ip: str, worker_key: str | None) -> Obj:
    url = f"http://{ip}:{contract.DEFAULT_HTTP_PORT}{contract.FAULT_PATH}"
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json={"fault": FAULT}, headers=auth_headers(worker_key), timeout=timeout) as resp,
    ):
        body = await resp.text()
        if resp.status != 200:
            raise DemoError(f"fault injection refused by {url}: {resp.status} {body[:300]}")
    try:
        answer: Obj = json.loads(body)
    except ValueError:
        answer = {"answer": body[:200]}
    return answer


async def run_demo(
    kube: DemoCluster,
    steps: Steps,
    result: DemoResult,
    seen: Observed,
    example: Obj,
    scope: str,
    alertmanager_url: str,
) -> None:
    manifest = demo_manifest(example)
    model = manifest["metadata"]["name"]
    served = (manifest["spec"].get("model") or {}).get("servedName") or model  # what clients send

    watched = "every namespace" if scope == "cluster" else f"only namespace {NAMESPACE}"
    steps.say(
        f"Installing the pdwarden chart (release {RELEASE}, namespace {NAMESPACE}, operator.scope "
        f"{scope}: it watches {watched})"
    )
    values = chart_values(scope)
    with steps.waiting("helm install --wait ..."):
        await asyncio.to_thread(kube.helm_install, RELEASE, NAMESPACE, values)
    result.operator_scope = scope
    steps.ok("operator running (its RBAC is the chart's, through its ServiceAccount)")

    steps.say(
        f"Deploying {EXAMPLE.name}: 2 prefill, 2 decode, 1 router (engine synthetic); prefill runs "
        f"with {' '.join(PREFILL_DEMO_ARGS)} (the emulated NIXL port) so that the race can wedge it: "
        "the operator is the last layer"
    )
    await asyncio.to_thread(kube.create_model, manifest)
    with steps.waiting("waiting for the model to be Ready ..."):
        try:
            await wait_for(
                lambda: model_ready(kube, model), 300, "the model to be Ready with all its pods", 2.0
            )
        except DemoError as exc:
            raise DemoError(f"{exc}: {await asyncio.to_thread(pods_summary, kube, model)}") from None
    router = ready_pods(kube, contract.ROLE_ROUTER, model)[0]
    # clients reach the router through its Service (kube-proxy picks a router pod)
    service = child_name(model, contract.ROLE_ROUTER)
    router_ip = await asyncio.to_thread(kube.cluster_ip, NAMESPACE, service) or ""
    if not router_ip:
        raise DemoError(f"the router's Service {NAMESPACE}/{service} has no ClusterIP")
    steps.ok(
        f"model Ready; router {router['metadata']['name']} behind Service {service} at "
        f"{router_ip}:{contract.ROUTER_HTTP_PORT}"
    )
    with steps.waiting("waiting for the router to route ..."):

        def routes() -> bool:
            return asyncio.run(demo_traffic.probe(router_ip, served))

        await wait_for(routes, 120, "a first request through the router", 2.0)

    alerts = AlertsSeen()
    log = demo_traffic.TrafficLog()
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(watch_alerts(alertmanager_url, alerts, stop)),
        asyncio.create_task(demo_traffic.run_traffic(router_ip, served, TRAFFIC, log, stop)),
    ]
    failure: DemoError | None = None
    try:
        await traffic_and_fault(kube, steps, result, seen, model, log)
    except DemoError as exc:
        failure = exc  # still show what was seen up to here: alerts, Events, status
        steps.say(f"[red]{exc}")
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    counts = log.counts()
    result.requests_ok = counts[demo_traffic.OK]
    result.requests_failed = counts[demo_traffic.FAILED]
    result.requests_cancelled = counts[demo_traffic.CANCELLED]
    if seen.inject_time is not None:
        wedged = log.slow(seen.inject_time, WEDGED_AFTER_S)
        result.wedged_requests, result.wedged_requests_p99_s = len(wedged), demo_traffic.p99(wedged)
    if seen.inject_time is not None:
        report_alerts(steps, result, alerts, seen.inject_time)
    await gather_status(kube, result, seen, model)
    if failure is not None:
        raise failure


def report_alerts(steps: Steps, result: DemoResult, alerts: AlertsSeen, inject_time: float) -> None:
    """What Alertmanager received from the cluster's Prometheus, which evaluated the chart's
    PrometheusRule over what it scraped through the chart's PodMonitor and ServiceMonitor."""
    result.alerts_before_fault = alerts.started_before(inject_time)
    result.alerts_fired = alerts.names()
    pod_alerts = result.alerts_for_wedged_pod = alerts.names(
        pod=result.wedged_pod or "", only=INFLIGHT_ALERTS
    )
    steps.ok(
        f"Alertmanager received: {', '.join(result.alerts_fired) or 'none'}; for {result.wedged_pod}: "
        f"{', '.join(pod_alerts) or 'none'}"
    )


async def gather_status(kube: DemoCluster, result: DemoResult, seen: Observed, model: str) -> None:
    dm = await asyncio.to_thread(kube.get_model, NAMESPACE, model) or {}
    seen.conditions = list((dm.get("status") or {}).get("conditions") or [])
    seen.remediation_entries = list((dm.get("status") or {}).get("remediations") or [])
    seen.events = sorted(
        [e for e in await asyncio.to_thread(kube.events, NAMESPACE) if event_relevant(e, model, result)],
        key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "",
    )


async def traffic_and_fault(
    kube: DemoCluster,
    steps: Steps,
    result: DemoResult,
    seen: Observed,
    model: str,
    log: demo_traffic.TrafficLog,
) -> None:
    steps.say(
        f"Sending steady traffic through the router for {WARMUP_S:.0f}s: {TRAFFIC.steady_clients} clients "
        f"with short prompts, {TRAFFIC.impatient_clients} with long prompts that give up after "
        f"{TRAFFIC.cancel_after_s:g}s (each cancel aborts the request on both sides)"
    )
    t_start = time.time()
    await asyncio.sleep(WARMUP_S)
    before = log.counts(t_start)
    seen.traffic_phases.append(("before the fault", before["ok"], before["failed"], before["cancelled"]))
    if before["ok"] == 0:
        raise DemoError(f"no request got through the router during warm-up ({dict(before)})")
    steps.ok(f"healthy: {before['ok']} ok, {before['failed']} failed, {before['cancelled']} cancelled")

    victim = ready_pods(kube, contract.ROLE_PREFILL, model)[0]
    victim_name, victim_ip = victim["metadata"]["name"], pod_ip(victim) or ""
    result.wedged_pod = victim_name
    steps.say(
        f"Injecting the emulated NIXL port's race ({FAULT}: max() status, eager pop on ABORT, late "
        f"Transferring write; stock SGLang 0.5.23 is not subject to it) into prefill pod {victim_name}: "
        "an ABORT that lands between a chunk's transfer and its status write now resurrects the room"
    )
    answer = await inject_fault(victim_ip, kube.worker_key(victim))
    t_inject = seen.inject_time = time.time()
    seen.fault = FAULT
    result.wedges_injected = 1
    steps.ok(f"fault active: {answer}")

    with steps.waiting(f"waiting for the operator to find {victim_name} wedged ..."):
        await wait_for(
            lambda: wedge_seen(kube.get_model(NAMESPACE, model) or {}, victim_name),
            150,
            "the operator to detect the wedge",
            0.5,
        )
    result.wedges_detected = 1
    result.detection_seconds = time.time() - t_inject
    steps.ok(f"wedge detected after {result.detection_seconds:.1f}s")

    with steps.waiting("waiting for the remediation ..."):
        entries = await wait_for(
            lambda: remediations_for(kube.get_model(NAMESPACE, model) or {}, victim_name),
            120,
            "a remediation of the wedged pod",
            0.5,
        )
    result.remediations = len(entries)
    last = entries[-1]
    steps.ok(
        f"remediated: action={last.get('action')} outcome={last.get('outcome')} reason={last.get('reason')}"
    )
    during = log.counts(t_inject)
    seen.traffic_phases.append(("during the wedge", during["ok"], during["failed"], during["cancelled"]))

    def replaced() -> str | None:
        pods = ready_pods(kube, contract.ROLE_PREFILL, model)
        names = [p["metadata"]["name"] for p in pods]
        if len(pods) >= 2 and victim_name not in names:
            return next(n for n in names if n != victim_name and n not in seen_pods)
        return None

    seen_pods = {p["metadata"]["name"] for p in ready_pods(kube, contract.ROLE_PREFILL, model)} - {
        victim_name
    }
    with steps.waiting("waiting for the replacement prefill pod ..."):
        result.replacement_pod = await wait_for(replaced, 300, "a replacement prefill pod to be Ready", 1.0)
    steps.ok(f"{victim_name} replaced by {result.replacement_pod}")

    await asyncio.sleep(RECOVERY_SETTLE_S)
    t_window = time.time()
    with steps.waiting(f"measuring traffic for {RECOVERY_WINDOW_S:.0f}s after the restart ..."):
        await asyncio.sleep(RECOVERY_WINDOW_S)
    after = log.counts(t_window)
    seen.traffic_phases.append(("after the restart", after["ok"], after["failed"], after["cancelled"]))
    result.recovered = recovered(after["ok"], after["failed"])
    recovery = f"traffic after the restart: {after['ok']} ok, {after['failed']} failed"
    if result.recovered:
        steps.ok(recovery)
    else:
        steps.say(f"[red]✗ {recovery}")
    # Let Prometheus evaluate the rules a few more times (PdwardenWedgeRemediated follows the
    # operator's remediation counter through its ServiceMonitor).
    await asyncio.sleep(RECOVERY_SETTLE_S)


def cleanup(kube: DemoCluster | None, steps: Steps, model: str) -> None:
    if kube is None:
        return
    steps.say("Cleaning up: model, chart, namespace")
    with contextlib.suppress(Exception):
        kube.delete_model(NAMESPACE, model)
        model_pods = selector({contract.LABEL_MODEL: model})
        waits.wait_for(lambda: not kube.pods(NAMESPACE, model_pods), 60, "the model's pods to stop", 1.0)
    with contextlib.suppress(Exception):
        kube.helm_uninstall(RELEASE, NAMESPACE)
    with contextlib.suppress(Exception):
        kube.delete_namespace(NAMESPACE)


@click.command()
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON line of results (progress goes to stderr)."
)
@click.option("--keep", is_flag=True, help="Leave the cluster, the chart and the model running afterwards.")
@click.option(
    "--scope",
    type=click.Choice(SCOPES),
    default="auto",
    show_default=True,
    help="The operator's scope: cluster (the chart's default: every namespace) or namespace (only "
    "the demo's); auto: cluster on a cluster the demo starts itself, else namespace, so that the "
    "demo never acts on models it did not create.",
)
def demo(as_json: bool, keep: bool, scope: str) -> None:
    """Wedge one prefill pod under traffic and watch pdwarden find it, restart it and alert."""
    console = Console(stderr=as_json, log_path=False)
    steps = Steps(console)
    result = DemoResult()
    seen = Observed()
    kube: DemoCluster | None = None
    started_cluster = False
    example = yaml.safe_load(EXAMPLE.read_text())
    model = str((example.get("metadata") or {}).get("name", "synthetic"))
    try:
        from pdwarden_localcluster import cluster, tools

        steps.say("Set-up: pinned kubectl and helm")
        tools.install(progress=False)
        steps.say("Starting the local Kubernetes cluster (first run builds it: minutes)")
        info = cluster.ensure_up(progress=lambda m: console.log(m))
        started_cluster = info.started
        steps.ok(f"cluster up: Kubernetes {info.kubernetes_version}, kubeconfig {info.kubeconfig}")
        steps.say(
            "Starting the monitoring stack: prometheus-operator, Prometheus, Alertmanager "
            "(the first run builds them)"
        )
        stack = monitoring.ensure_monitoring(info.kubeconfig, progress=lambda m: console.log(m))
        steps.ok(f"Prometheus at {stack.prometheus_url}, Alertmanager at {stack.alertmanager_url}")
        kube = DemoCluster(info.kubeconfig)
        kube.ensure_namespace(NAMESPACE)
        scope_used = operator_scope(scope, started_cluster)
        asyncio.run(run_demo(kube, steps, result, seen, example, scope_used, stack.alertmanager_url))
    except (DemoError, ClusterError, ApiError, chart.HelmError, chart.ToolMissing, RuntimeError) as exc:
        result.error = str(exc)
        console.log(f"[red]demo step failed: {exc}")
    except KeyboardInterrupt:
        result.error = "interrupted"
    finally:
        if not keep:
            cleanup(kube, steps, model)
            if started_cluster:
                from pdwarden_localcluster import cluster

                with contextlib.suppress(Exception):
                    cluster.down(progress=lambda m: console.log(m))

    for table in summary_table(result, seen):
        console.print(table)
    failures = result.failures()
    if failures:
        console.print("[red]demo FAILED: " + "; ".join(failures))
    else:
        console.print("[green]demo passed: wedge detected, pod restarted, traffic recovered, alert fired")
    if as_json:
        click.echo(result.json_line())
    sys.exit(1 if failures else 0)

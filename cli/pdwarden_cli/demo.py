"""`pdwarden demo`: a new user's first ten minutes, end to end on the local cluster.

Starts the embedded cluster, installs the Helm chart, deploys examples/synthetic.yaml
(2 prefill, 2 decode, 1 router), sends steady traffic through the router with some
clients cancelling, injects the emulated NIXL port's status race into ONE prefill pod, and shows the
wedge detected, the pod restarted, traffic recovering, the Events and status entries,
and the alerts that fired (the chart's rules evaluated by promtool over the scraped
series). Cleans up after itself; exits non-zero if any of that did not happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import click
import yaml
from rich.console import Console
from rich.table import Table

from pdwarden_cli import chart, demo_alerts, demo_traffic
from pdwarden_cli.demo_kube import DemoCluster, DemoError, Obj, pod_ip, pod_ready, selector
from pdwarden_cli.demo_scrape import SeriesStore, Target, scrape_once
from pdwarden_runtime import contract

NAMESPACE = "pdwarden-demo"
RELEASE = "pdwarden"
OPERATOR_JOB = f"{RELEASE}-metrics"  # the chart's metrics Service (release name contains the chart's)
EXAMPLE = chart.REPO_ROOT / "examples" / "synthetic.yaml"
SCRAPE_STEP_S = 2.0
WARMUP_S = 20.0
RECOVERY_SETTLE_S = 5.0
RECOVERY_WINDOW_S = 20.0
FAULT = "emulated-maxstatus-port-race"
TRAFFIC = demo_traffic.TrafficConfig()
PREFILL_DEMO_ARGS = ("--hardening", "emulated-port", "--race-window", "5")
# Alerts about the wedged pod's queue; either shows the wedge (a queue that still finishes
# its short requests keeps its progress counter moving, so only the age may fire).
INFLIGHT_ALERTS = ("PdwardenInflightStuck", "PdwardenInflightOldestAgeHigh")
# Cancelling clients make the hardened decode pods refuse late status writes (the race,
# caught: what the runtime's fix is for), so that informational alert may fire any time.
ALLOWED_BEFORE_FAULT = ("PdwardenStatusWritesRefused",)

# The operator watches only the demo's namespace, so the demo never touches other models.
CHART_VALUES = {"operator.scope": "namespace", "operator.watchNamespace": NAMESPACE}
# The chart's alert rules with windows sized for a demo that lasts minutes, not hours.
DEMO_RULE_VALUES = {
    "monitoring.prometheusRule.enabled": "true",
    "monitoring.prometheusRule.rules.inflightStuck.window": "20s",
    "monitoring.prometheusRule.rules.inflightStuck.for": "0s",
    "monitoring.prometheusRule.rules.inflightOldestAge.thresholdSeconds": "15",
    "monitoring.prometheusRule.rules.inflightOldestAge.for": "0s",
    "monitoring.prometheusRule.rules.wedgeRemediated.window": "30s",
    "monitoring.prometheusRule.rules.statusWritesRefused.window": "1m",
    "monitoring.prometheusRule.rules.podsUnobserved.for": "3m",
    "monitoring.prometheusRule.rules.operatorDown.for": "1m",
}


def demo_manifest(example: Obj, namespace: str = NAMESPACE) -> Obj:
    """The example model, shaped for the demo: 2+2+1 pods, fault injection allowed, a quick watchdog."""
    m = copy.deepcopy(example)
    meta = m.setdefault("metadata", {})
    meta["namespace"] = namespace
    meta.setdefault("annotations", {})[contract.ANNOTATION_ALLOW_FAULT_INJECTION] = "true"
    spec = m["spec"]
    # The runtime's in-pod fixes (terminal-sticky status, no silent skip, deadlines) would
    # catch the race inside the pod; the demo turns them off on prefill so the race wedges
    # it, and shows the operator, the last layer. The race window is the fault's: how long a
    # finished chunk's status write waits for an ABORT.
    spec["prefill"] = {
        **spec.get("prefill", {}),
        "replicas": 2,
        "args": [*PREFILL_DEMO_ARGS],
    }
    spec["decode"] = {**spec.get("decode", {}), "replicas": 2}
    spec["router"] = {**spec.get("router", {}), "replicas": 1}
    # The runtime's own deadline stays longer than the watchdog's, so the operator acts first.
    spec["transfer"] = {
        **spec.get("transfer", {}),
        "inflightDeadlineSeconds": 300,
        "transferDeadlineSeconds": 60,
    }
    spec["watchdog"] = {
        **spec.get("watchdog", {}),
        "stuckAfterSeconds": 20,
        "scrapeIntervalSeconds": 5,
        "action": "restart",
        "maxRemediations": 3,
        "budgetWindowSeconds": 600,
        "maxUnavailable": 1,
    }
    return m


@dataclass
class DemoResult:
    wedges_injected: int = 0
    wedges_detected: int = 0
    detection_seconds: float | None = None
    remediations: int = 0
    requests_ok: int = 0
    requests_failed: int = 0
    recovered: bool = False
    requests_cancelled: int = 0
    alerts_fired: list[str] = field(default_factory=list)
    alerts_for_wedged_pod: list[str] = field(default_factory=list)
    alerts_before_fault: list[str] | None = None  # None: not evaluated
    wedged_pod: str | None = None
    replacement_pod: str | None = None
    error: str | None = None

    def failures(self) -> list[str]:
        """What did not happen (empty: the demo showed everything it promises)."""
        if self.error:
            return [self.error]  # what did not happen after it is a consequence
        out = []
        if self.wedges_injected < 1:
            out.append("no wedge was injected")
        if self.wedges_detected < self.wedges_injected:
            out.append("the operator did not detect the wedge")
        if self.remediations < 1:
            out.append("the wedged pod was not remediated")
        if not self.recovered:
            out.append("traffic did not recover")
        if not set(INFLIGHT_ALERTS) & set(self.alerts_for_wedged_pod):
            out.append(f"no inflight alert ({' or '.join(INFLIGHT_ALERTS)}) fired for the wedged pod")
        if "PdwardenWedgeRemediated" not in self.alerts_fired:
            out.append("the PdwardenWedgeRemediated alert did not fire")
        early = [a for a in self.alerts_before_fault or [] if a not in ALLOWED_BEFORE_FAULT]
        if early:
            out.append(f"alerts fired before the fault was injected: {', '.join(early)}")
        return out

    def json_line(self) -> str:
        keys = (
            "wedges_injected",
            "wedges_detected",
            "detection_seconds",
            "remediations",
            "requests_ok",
            "requests_failed",
            "recovered",
            "requests_cancelled",
            "alerts_fired",
            "alerts_for_wedged_pod",
            "alerts_before_fault",
        )
        data = asdict(self)
        out = {k: data[k] for k in keys}
        if out["detection_seconds"] is not None:
            out["detection_seconds"] = round(out["detection_seconds"], 1)
        return json.dumps(out)


@dataclass
class Observed:
    """What the demo saw of the cluster, for the summary."""

    events: list[Obj] = field(default_factory=list)
    remediation_entries: list[Obj] = field(default_factory=list)
    conditions: list[Obj] = field(default_factory=list)
    traffic_phases: list[tuple[str, int, int, int]] = field(default_factory=list)
    inject_time: float | None = None  # wall clock of the fault injection


class Steps:
    """Progress output: one line per step, a spinner while waiting."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def say(self, msg: str) -> None:
        self.console.log(f"[bold]{msg}")

    def ok(self, msg: str) -> None:
        self.console.log(f"[green]✓[/green] {msg}")

    @contextlib.contextmanager
    def waiting(self, msg: str) -> Iterator[None]:
        with self.console.status(msg):
            yield


async def wait_for(
    what: str, check: Callable[[], Any], timeout_s: float, interval_s: float = 1.0
) -> Any:  # the first truthy value check() returns
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await asyncio.to_thread(check)
        if value:
            return value
        await asyncio.sleep(interval_s)
    raise DemoError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def role_selector(role: str, model: str) -> str:
    return selector({contract.LABEL_MODEL: model, contract.LABEL_ROLE: role})


def scrape_targets(kube: DemoCluster, model: str) -> list[Target]:
    targets = []
    for role in contract.RUNTIME_ROLES:
        for pod in kube.pods(NAMESPACE, role_selector(role, model)):
            ip = pod_ip(pod)
            if not ip or pod["metadata"].get("deletionTimestamp"):
                continue
            port = container_port(pod, contract.PORT_NAME_METRICS) or contract.DEFAULT_METRICS_PORT
            labels = {
                "job": f"{NAMESPACE}/{RELEASE}-runtime",
                "instance": f"{ip}:{port}",
                "namespace": NAMESPACE,
                "pod": pod["metadata"]["name"],
                "model": model,
            }
            targets.append(Target(f"http://{ip}:{port}{contract.METRICS_PATH}", labels))
    for pod in kube.pods(
        NAMESPACE, f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
    ):
        ip = pod_ip(pod)
        if ip and pod_ready(pod):
            port = container_port(pod, "metrics") or contract.OPERATOR_METRICS_PORT
            labels = {"job": OPERATOR_JOB, "instance": f"{ip}:{port}", "namespace": NAMESPACE}
            targets.append(Target(f"http://{ip}:{port}{contract.METRICS_PATH}", labels, honor_labels=True))
    return targets


def container_port(pod: Obj, name: str) -> int | None:
    for container in pod.get("spec", {}).get("containers", []):
        for port in container.get("ports") or []:
            if port.get("name") == name:
                return int(port["containerPort"])
    return None


async def collect(kube: DemoCluster, model: str, store: SeriesStore, stop: asyncio.Event) -> None:
    """Scrape every SCRAPE_STEP_S until stopped (targets re-listed each time: pods come and go)."""
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            began = time.monotonic()
            targets = await asyncio.to_thread(scrape_targets, kube, model)
            await scrape_once(session, store, targets)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.1, SCRAPE_STEP_S - (time.monotonic() - began)))


def model_ready(kube: DemoCluster, name: str) -> bool:
    dm = kube.get_model(NAMESPACE, name) or {}
    if (dm.get("status") or {}).get("phase") != "Ready":
        return False
    want = {"prefill": 2, "decode": 2, "router": 1}
    return all(
        sum(pod_ready(p) for p in kube.pods(NAMESPACE, role_selector(r, name))) >= n for r, n in want.items()
    )


def pods_summary(kube: DemoCluster, model: str) -> str:
    """`name: phase/ready (waiting reason)` of the model's pods, for an error message."""
    parts = []
    for pod in kube.pods(NAMESPACE, selector({contract.LABEL_MODEL: model})):
        statuses = pod.get("status", {}).get("containerStatuses") or [{}]
        waiting = (statuses[0].get("state") or {}).get("waiting") or {}
        reason = f" {waiting['reason']}" if waiting.get("reason") else ""
        parts.append(f"{pod['metadata']['name']} {'ready' if pod_ready(pod) else 'not ready'}{reason}")
    return ", ".join(sorted(parts)) or "no pods"


def ready_pods(kube: DemoCluster, role: str, model: str) -> list[Obj]:
    return sorted(
        (p for p in kube.pods(NAMESPACE, role_selector(role, model)) if pod_ready(p) and pod_ip(p)),
        key=lambda p: p["metadata"]["name"],
    )


def remediations_for(dm: Obj, pod: str) -> list[Obj]:
    return [r for r in (dm.get("status") or {}).get("remediations") or [] if r.get("pod") == pod]


def wedge_seen(dm: Obj, pod: str) -> bool:
    watchdog = (dm.get("status") or {}).get("watchdog") or {}
    return pod in (watchdog.get("wedgedPods") or []) or bool(remediations_for(dm, pod))


async def inject_fault(ip: str) -> Obj:
    url = f"http://{ip}:{contract.DEFAULT_HTTP_PORT}{contract.FAULT_PATH}"
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json={"fault": FAULT}, timeout=aiohttp.ClientTimeout(total=10)) as resp,
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
    kube: DemoCluster, steps: Steps, result: DemoResult, seen: Observed, example: Obj
) -> None:
    manifest = demo_manifest(example)
    model = manifest["metadata"]["name"]

    steps.say(f"Installing the pdwarden chart (release {RELEASE}, namespace {NAMESPACE})")
    with steps.waiting("helm install --wait ..."):
        await asyncio.to_thread(kube.helm_install, RELEASE, NAMESPACE, CHART_VALUES)
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
                "the model to be Ready with all its pods", lambda: model_ready(kube, model), 300, 2.0
            )
        except DemoError as exc:
            raise DemoError(f"{exc}: {await asyncio.to_thread(pods_summary, kube, model)}") from None
    router = ready_pods(kube, contract.ROLE_ROUTER, model)[0]
    router_ip = pod_ip(router) or ""
    steps.ok(f"model Ready; router {router['metadata']['name']} at {router_ip}:{contract.ROUTER_HTTP_PORT}")
    with steps.waiting("waiting for the router to route ..."):

        def routes() -> bool:
            return asyncio.run(demo_traffic.probe(router_ip))

        await wait_for("a first request through the router", routes, 120, 2.0)

    store = SeriesStore(start=time.time(), step=SCRAPE_STEP_S)
    log = demo_traffic.TrafficLog()
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(collect(kube, model, store, stop)),
        asyncio.create_task(demo_traffic.run_traffic(router_ip, TRAFFIC, log, stop)),
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
        await evaluate_alerts(steps, result, store, seen.inject_time)
    await gather_status(kube, result, seen, model)
    if failure is not None:
        raise failure


async def evaluate_alerts(steps: Steps, result: DemoResult, store: SeriesStore, inject_time: float) -> None:
    steps.say("Evaluating the chart's alert rules with promtool over the scraped series")
    groups = chart.rule_groups(
        await asyncio.to_thread(
            chart.helm_template, release=RELEASE, namespace=NAMESPACE, set_values=DEMO_RULE_VALUES
        )
    )
    result.alerts_before_fault = await asyncio.to_thread(
        demo_alerts.firing_alerts, groups, store, until_slot=max(0, store.slot(inject_time) - 1)
    )
    result.alerts_fired = await asyncio.to_thread(demo_alerts.firing_alerts, groups, store)
    pod_alerts = result.alerts_for_wedged_pod = await asyncio.to_thread(
        demo_alerts.firing_alerts,
        groups,
        store,
        matchers={"pod": result.wedged_pod or ""},
        only=INFLIGHT_ALERTS,
    )
    steps.ok(
        f"alerts fired: {', '.join(result.alerts_fired) or 'none'}; for {result.wedged_pod}: "
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


def event_relevant(event: Obj, model: str, result: DemoResult) -> bool:
    """Events on the model, or on the wedged pod (a restart or eviction is posted there too)."""
    involved = event.get("involvedObject") or {}
    on_model = involved.get("kind") == contract.KIND and involved.get("name") == model
    on_wedged_pod = involved.get("kind") == "Pod" and involved.get("name") == result.wedged_pod
    return on_model or on_wedged_pod


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
    answer = await inject_fault(victim_ip)
    t_inject = seen.inject_time = time.time()
    result.wedges_injected = 1
    steps.ok(f"fault active: {answer}")

    with steps.waiting(f"waiting for the operator to find {victim_name} wedged ..."):
        await wait_for(
            "the operator to detect the wedge",
            lambda: wedge_seen(kube.get_model(NAMESPACE, model) or {}, victim_name),
            150,
            0.5,
        )
    result.wedges_detected = 1
    result.detection_seconds = time.time() - t_inject
    steps.ok(f"wedge detected after {result.detection_seconds:.1f}s")

    with steps.waiting("waiting for the remediation ..."):
        entries = await wait_for(
            "a remediation of the wedged pod",
            lambda: remediations_for(kube.get_model(NAMESPACE, model) or {}, victim_name),
            120,
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
        result.replacement_pod = await wait_for("a replacement prefill pod to be Ready", replaced, 300, 1.0)
    steps.ok(f"{victim_name} replaced by {result.replacement_pod}")

    await asyncio.sleep(RECOVERY_SETTLE_S)
    t_window = time.time()
    with steps.waiting(f"measuring traffic for {RECOVERY_WINDOW_S:.0f}s after the restart ..."):
        await asyncio.sleep(RECOVERY_WINDOW_S)
    after = log.counts(t_window)
    seen.traffic_phases.append(("after the restart", after["ok"], after["failed"], after["cancelled"]))
    answered = after["ok"] + after["failed"]
    result.recovered = after["ok"] >= 5 and after["ok"] >= 0.9 * answered
    recovery = f"traffic after the restart: {after['ok']} ok, {after['failed']} failed"
    if result.recovered:
        steps.ok(recovery)
    else:
        steps.say(f"[red]✗ {recovery}")
    # Let the collector see the replacement for a few more scrapes.
    await asyncio.sleep(2 * SCRAPE_STEP_S)


def summary_table(result: DemoResult, seen: Observed) -> list[Table]:
    tables = []
    t = Table(title="pdwarden demo: what happened")
    t.add_column("step")
    t.add_column("result")
    injected = f"{result.wedges_injected} ({FAULT} into {result.wedged_pod})" if result.wedged_pod else "no"
    t.add_row("wedge injected", injected)
    det = f"{result.detection_seconds:.1f}s after the fault" if result.detection_seconds is not None else "no"
    t.add_row("wedge detected", det)
    t.add_row("remediations", f"{result.remediations} (replacement: {result.replacement_pod or '-'})")
    for phase, ok, failed, cancelled in seen.traffic_phases:
        t.add_row(f"traffic {phase}", f"{ok} ok, {failed} failed, {cancelled} cancelled by clients")
    t.add_row("traffic recovered", "yes" if result.recovered else "NO")
    t.add_row("alerts fired (promtool)", ", ".join(result.alerts_fired) or "none")
    before = result.alerts_before_fault
    t.add_row("alerts before the fault", "-" if before is None else ", ".join(before) or "none")
    tables.append(t)
    if seen.remediation_entries:
        r = Table(title="status.remediations")
        for col in ("pod", "role", "reason", "action", "time", "outcome"):
            r.add_column(col)
        for entry in seen.remediation_entries:
            r.add_row(
                *(str(entry.get(c, "")) for c in ("pod", "role", "reason", "action", "time", "outcome"))
            )
        tables.append(r)
    if seen.events:
        e = Table(title="Events")
        for col in ("type", "reason", "object", "message"):
            e.add_column(col)
        for ev in seen.events[-15:]:
            inv = ev.get("involvedObject") or {}
            e.add_row(
                ev.get("type", ""),
                ev.get("reason", ""),
                f"{inv.get('kind')}/{inv.get('name')}",
                (ev.get("message") or "")[:120],
            )
        tables.append(e)
    return tables


def cleanup(kube: DemoCluster | None, steps: Steps, model: str) -> None:
    if kube is None:
        return
    steps.say("Cleaning up: model, chart, namespace")
    with contextlib.suppress(Exception):
        kube.delete_model(NAMESPACE, model)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and kube.pods(NAMESPACE, selector({contract.LABEL_MODEL: model})):
            time.sleep(1)
    with contextlib.suppress(Exception):
        kube.helm_uninstall(RELEASE, NAMESPACE)
    with contextlib.suppress(Exception):
        kube.delete_namespace(NAMESPACE)


@click.command()
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON line of results (progress goes to stderr)."
)
@click.option("--keep", is_flag=True, help="Leave the cluster, the chart and the model running afterwards.")
def demo(as_json: bool, keep: bool) -> None:
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

        steps.say("Set-up: pinned kubectl, helm and promtool")
        tools.install(progress=False)
        steps.say("Starting the local Kubernetes cluster (first run builds it: minutes)")
        info = cluster.ensure_up(progress=lambda m: console.log(m))
        started_cluster = info.started
        steps.ok(f"cluster up: Kubernetes {info.kubernetes_version}, kubeconfig {info.kubeconfig}")
        kube = DemoCluster(info.kubeconfig)
        kube.ensure_namespace(NAMESPACE)
        asyncio.run(run_demo(kube, steps, result, seen, example))
    except (DemoError, chart.HelmError, chart.ToolMissing, RuntimeError) as exc:
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
        if kube is not None:
            kube.close()

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

"""`pdwarden bench watchdog`: the operator's real watchdog round over a fleet of simulated pods.

The local cluster holds N runtime pods (M models of N/M pods, half prefill, half decode)
on the test kit's simulated node: real Deployments, ReplicaSets, scheduling and pod objects,
each pod answering /metrics as a runtime of its role does, only without its process. One real
operator process watches them: its pod watch, one scrape per pod per interval, the wedge rule,
blame and the ladder, status writes. The bench measures that process over a window of steady
rounds (CPU, RSS, round durations and late rounds from its own metrics), then wedges one pod
and times the operator's remediation of it. Prints progress on stderr and one JSON line last.

The steady part is several back-to-back windows, each giving its own CPU figure: on a small
machine the operator shares its cores with the simulator and the control plane, and a window's
CPU moves with them, so the verdict is the median window with the spread beside it.

`--idle-models N` makes the last N models' runtime pods idle ones (no request ever; a body
that reads the same every scrape), as much of a real fleet is at quiet hours; the goal is
judged on a serving fleet only (`goal_met` is null otherwise).

The same code costs more CPU on a slower machine, so the line also carries yardsticks of the
machine, measured in the bench's process on one fleet pod's body: `prometheus_parse_cpu_us`,
the CPU time of prometheus_client's parse of the body (a yardstick outside our code), and
`reference_parse_cpu_us`, the operator's parser before its one-pass rewrite (kept in the test kit).
`cpu_over_prometheus_parse` is the operator's whole CPU per scrape (fetch, parse, judge,
bookkeeping) as a multiple of the first; `scrape_over_reference_parse` (also
`cpu_over_reference_parse`) of the second; `parse_cpu_us` is the operator's own parser on the
same body. `goal_met` is judged on the first ratio (within `GOAL_CPU_OVER_PROMETHEUS_PARSE`),
the RSS, no late round, no scrape error, every pod observed and the wedge remediated;
`cores_goal_met` on the cores as before (`GOAL_CORES`, which moves with the machine).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import click
from prometheus_client.parser import text_string_to_metric_families

import pdwarden_contract as contract
from pdwarden_localcluster.kubeapi import ApiError
from pdwarden_localcluster.waits import wait_for
from pdwarden_operator.watchdog.parse import parse_metrics
from pdwarden_testkit import reference_parse
from pdwarden_testkit.cluster_env import Env, open_env, operator_metric, operator_page, pod_metrics_body
from pdwarden_testkit.fleet.model import fleet_model
from pdwarden_testkit.fleet.process import FleetProcess
from pdwarden_testkit.fleet.runtimes import MODE_ANNOTATION, Mode
from pdwarden_testkit.operator_process import OperatorProcess
from pdwarden_testkit.promtext import metric_sum, samples

MAX_ENDPOINTS: Final = 10000
GOAL_CORES: Final = 0.25
GOAL_RSS_MIB: Final = 300.0
# the operator's whole CPU per scrape (fetch, parse, judge, bookkeeping) over prometheus_client's
# parse of the same body
GOAL_CPU_OVER_PROMETHEUS_PARSE: Final = 2.0
REMEDIATION_COUNTED_S: Final = 30.0
GC_COLLECTIONS: Final = "python_gc_collections_total"  # prometheus_client's, on the operator's page
REFERENCE_PARSES: Final = 2000


def _say(msg: str) -> None:
    print(f"[bench watchdog] {msg}", file=sys.stderr, flush=True)


def _runtime_pods(env: Env, limit: int | None = None) -> list[dict[str, Any]]:
    roles = ",".join(contract.RUNTIME_ROLES)
    selector = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY},{contract.LABEL_ROLE} in ({roles})"
    params: dict[str, Any] = {"labelSelector": selector}
    if limit is not None:
        params["limit"] = limit
    path = f"/api/v1/namespaces/{env.namespace}/pods"
    items: list[dict[str, Any]] = env.api.get(path, params=params)["items"]
    return items


def _running(pods: list[dict[str, Any]]) -> int:
    return sum(
        1
        for p in pods
        if (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    )


@dataclass(frozen=True)
class Reading:
    """The operator's counters from one fetch of its metrics, with its CPU time (and the
    monotonic clock) read just before and just after that fetch: serving the bench's fetch is
    the bench's cost, not the watchdog's, so a window's CPU runs from one fetch's end to the
    next one's start."""

    before_at: float
    cpu_before_s: float
    after_at: float
    cpu_after_s: float
    rounds: float
    round_seconds: float
    rounds_late: float
    scrape_errors: float
    unobserved_pods: float  # a gauge: pods the last rounds could not read
    full_collections: float  # the garbage collector's runs over every generation
    rss_mib: float

    @property
    def counted_at(self) -> float:
        """When the counters were read, as near as the fetch tells."""
        return (self.before_at + self.after_at) / 2


@dataclass(frozen=True)
class Window:
    """What the operator did between two readings: its CPU over `seconds`, its rounds over
    `counted_seconds` (from one fetch to the next)."""

    seconds: float
    cpu_s: float
    counted_seconds: float
    rounds: int
    round_seconds: float
    rounds_late: int
    scrape_errors: int
    full_collections: int
    rss_mib: float  # at its end

    @property
    def cores(self) -> float:
        return self.cpu_s / self.seconds


def _read(op: OperatorProcess) -> Reading:
    before_at, cpu_before = time.monotonic(), op.cpu_seconds()
    text = operator_page(op)
    cpu_after, after_at = op.cpu_seconds(), time.monotonic()
    found = samples(text)
    return Reading(
        before_at=before_at,
        cpu_before_s=cpu_before,
        after_at=after_at,
        cpu_after_s=cpu_after,
        rounds=metric_sum(found, f"{contract.METRIC_OPERATOR_ROUND_SECONDS}_count"),
        round_seconds=metric_sum(found, f"{contract.METRIC_OPERATOR_ROUND_SECONDS}_sum"),
        rounds_late=metric_sum(found, contract.METRIC_OPERATOR_ROUNDS_LATE_TOTAL),
        scrape_errors=metric_sum(found, contract.METRIC_OPERATOR_SCRAPE_ERRORS_TOTAL),
        unobserved_pods=metric_sum(found, contract.METRIC_OPERATOR_UNOBSERVED_PODS),
        full_collections=metric_sum(found, GC_COLLECTIONS, generation="2"),
        rss_mib=op.rss_mib()[0],
    )


def window(before: Reading, after: Reading) -> Window:
    return Window(
        seconds=after.before_at - before.after_at,
        cpu_s=after.cpu_before_s - before.cpu_after_s,
        counted_seconds=after.counted_at - before.counted_at,
        rounds=int(after.rounds - before.rounds),
        round_seconds=after.round_seconds - before.round_seconds,
        rounds_late=int(after.rounds_late - before.rounds_late),
        scrape_errors=int(after.scrape_errors - before.scrape_errors),
        full_collections=int(after.full_collections - before.full_collections),
        rss_mib=after.rss_mib,
    )


def steady_figures(windows: Sequence[Window], models: int, interval: int) -> dict[str, Any]:
    """The steady windows' figures: `cores` is the median window's (the verdict), with every
    window's beside it; counts are over all windows."""
    if not windows:
        raise ValueError("no steady window was measured")
    cores = [w.cores for w in windows]
    rounds = sum(w.rounds for w in windows)
    return {
        "windows": len(windows),
        "rounds": rounds,
        "expected_rounds": round(models * sum(w.counted_seconds for w in windows) / interval),
        "round_mean_s": round(sum(w.round_seconds for w in windows) / rounds, 4) if rounds else None,
        "rounds_late": sum(w.rounds_late for w in windows),
        "scrape_errors": sum(w.scrape_errors for w in windows),
        "operator_cpu_s": round(sum(w.cpu_s for w in windows), 2),
        "cores": round(statistics.median(cores), 4),
        "cores_min": round(min(cores), 4),
        "cores_max": round(max(cores), 4),
        "cores_windows": [round(c, 4) for c in cores],
        "full_collections_windows": [w.full_collections for w in windows],
        "rss_windows_mib": [round(w.rss_mib, 1) for w in windows],
    }


def reference_parse_cpu_us(body: bytes, parses: int = REFERENCE_PARSES, parse: Any = None) -> float:
    """A yardstick of the machine: CPU microseconds of one parse of `body` by the reference parser
    (`parse`: another), in this process's thread (its CPU time, not the clock's, so the load on
    the other cores counts less). Raises the parser's error for a body it refuses."""
    parse = reference_parse.parse_metrics if parse is None else parse
    parse(body)  # a refused body fails here, not as a figure
    started = time.thread_time()
    for _ in range(parses):
        parse(body)
    return (time.thread_time() - started) / parses * 1e6


def prometheus_parse(body: bytes) -> list[Any]:
    """prometheus_client's parse of a whole exposition body: every family, every sample."""
    return list(text_string_to_metric_families(body.decode("utf-8")))


def scrape_cost(
    figures: dict[str, Any], endpoints: int, models: int, reference_us: float, prometheus_us: float
) -> dict[str, Any]:
    """The operator's CPU per scrape over the steady windows (each round scrapes its model's
    pods), in microseconds and as multiples of the yardsticks."""
    cost: dict[str, Any] = {
        "reference_parse_cpu_us": round(reference_us, 1),
        "prometheus_parse_cpu_us": round(prometheus_us, 1),
    }
    scrapes = figures["rounds"] * endpoints / models
    if scrapes:
        per_scrape_us = figures["operator_cpu_s"] / scrapes * 1e6
        cost["cpu_us_per_scrape"] = round(per_scrape_us, 1)
        cost["scrape_over_reference_parse"] = cost["cpu_over_reference_parse"] = round(
            per_scrape_us / reference_us, 2
        )
        cost["cpu_over_prometheus_parse"] = round(per_scrape_us / prometheus_us, 2)
    return cost


def _pod_body(env: Env) -> bytes:
    """One pod's /metrics body, before any is wedged (every pod is serving): one pod listed,
    not the fleet."""
    pods = _runtime_pods(env, limit=1)
    if not pods:
        raise RuntimeError("no runtime pod to read a reference body from")
    return pod_metrics_body(pods[0], timeout=10)


def goal_met(figures: dict[str, Any]) -> bool:
    """The goal: the operator's CPU per scrape within GOAL_CPU_OVER_PROMETHEUS_PARSE
    parses of the same body by prometheus_client, its RSS within the goal's, no late round, no
    scrape error, every pod observed, the wedge remediated."""
    ratio = figures.get("cpu_over_prometheus_parse")
    return bool(
        ratio is not None
        and ratio <= GOAL_CPU_OVER_PROMETHEUS_PARSE
        and figures["operator_peak_rss_mib"] <= GOAL_RSS_MIB
        and figures["rounds_late"] == 0
        and figures["scrape_errors"] == 0
        and figures["unobserved_pods"] == 0
        and figures["wedge_remediated_s"] is not None
    )


def cores_goal_met(figures: dict[str, Any]) -> bool:
    """The earlier goal, judged on the median window's cores (which move with the machine)."""
    return bool(
        figures["cores"] <= GOAL_CORES
        and figures["operator_peak_rss_mib"] <= GOAL_RSS_MIB
        and figures["rounds_late"] == 0
        and figures["scrape_errors"] == 0
        and figures["unobserved_pods"] == 0
        and figures["wedge_remediated_s"] is not None
    )


def _models_rounding(op: OperatorProcess, models: int) -> bool:
    """Every model's watchdog has run a round that saw its pods (its per-role gauges exist)."""
    seen = {
        s.labels.get("model")
        for s in samples(operator_page(op), {contract.METRIC_OPERATOR_WEDGED_PODS})
        if s.labels.get("role") == contract.ROLE_PREFILL
    }
    return len(seen) >= models


def _wedge_one(env: Env, op: OperatorProcess, timeout: float) -> dict[str, Any]:
    """Wedge one prefill pod (the fleet exports a stuck room for it) and time the operator's
    restart of it: the pod deleted, by the operator, as the one remediation."""
    victim = sorted(
        (p for p in _runtime_pods(env) if p["metadata"]["labels"].get(contract.LABEL_ROLE) == "prefill"),
        key=lambda p: p["metadata"]["name"],
    )[0]
    name, uid = victim["metadata"]["name"], victim["metadata"]["uid"]
    before = operator_metric(op, contract.METRIC_OPERATOR_REMEDIATIONS_TOTAL)
    env.call(
        "PATCH",
        f"/api/v1/namespaces/{env.namespace}/pods/{name}",
        {"metadata": {"annotations": {MODE_ANNOTATION: "wedged"}}},
        content_type="application/merge-patch+json",
    )
    wedged_at = time.monotonic()

    def gone() -> bool:
        try:
            pod = env.call("GET", f"/api/v1/namespaces/{env.namespace}/pods/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return True
            raise
        return pod["metadata"]["uid"] != uid or bool(pod["metadata"].get("deletionTimestamp"))

    try:
        wait_for(gone, timeout, f"the operator to restart wedged pod {name}", 0.5)
    except TimeoutError:
        return {
            "wedge_remediated_s": None,
            "remediations": operator_metric(op, contract.METRIC_OPERATOR_REMEDIATIONS_TOTAL) - before,
        }
    remediated = time.monotonic() - wedged_at

    def counted() -> float:
        return operator_metric(op, contract.METRIC_OPERATOR_REMEDIATIONS_TOTAL) - before

    # the operator counts a remediation once its outcome is recorded, a moment after the
    # delete this saw: a busy operator's count lags it
    with contextlib.suppress(TimeoutError):
        wait_for(counted, REMEDIATION_COUNTED_S, "the remediation counted", 0.5)
    return {"wedge_remediated_s": round(remediated, 1), "remediations": counted()}


@contextlib.contextmanager
def _fleet_env(kubeconfig: Path, tmp: Path) -> Iterator[Env]:
    namespace = f"pdw-bench-watchdog-{uuid.uuid4().hex[:6]}"
    with (
        FleetProcess(kubeconfig, log_path=tmp / "fleet.log"),
        contextlib.contextmanager(open_env)(kubeconfig, namespace, tmp, create_namespace=True) as env,
    ):
        yield env


def model_count(endpoints: int, pods_per_model: int, idle_models: int = 0) -> int:
    """The fleet's models; a UsageError when `idle_models` leaves none serving (the first model
    serves: its body is the reference parse's, its pod the one wedged)."""
    models = math.ceil(endpoints / pods_per_model)
    if idle_models >= models:
        raise click.UsageError(f"--idle-models must be fewer than the {models} models (one serves at least)")
    return models


def run(
    endpoints: int,
    pods_per_model: int,
    interval: int,
    measure_s: float,
    windows: int,
    timeout: float,
    kubeconfig: Path,
    idle_models: int = 0,
) -> dict[str, Any]:
    models = model_count(endpoints, pods_per_model, idle_models)
    tmp = Path(tempfile.mkdtemp(prefix="pdw-bench-watchdog-"))
    _say(
        f"{endpoints} pods as {models} models of up to {pods_per_model} ({idle_models} of them idle); "
        f"logs in {tmp}"
    )
    with _fleet_env(kubeconfig, tmp) as env:
        op = env.start_operator()
        started = time.monotonic()
        left = endpoints
        for i in range(models):
            pods = min(pods_per_model, left)
            left -= pods
            mode: Mode = "idle" if i >= models - idle_models else "serving"
            env.create_model(
                fleet_model(env.namespace, f"fleet-{i:04d}", (pods + 1) // 2, pods // 2, interval, mode)
            )
        _say(f"applied {models} models; waiting for {endpoints} pods to run")
        wait_for(
            lambda: _running(_runtime_pods(env)) >= endpoints,
            timeout,
            f"{endpoints} runtime pods Running",
            5.0,
        )
        pods_running_s = time.monotonic() - started
        _say(f"{endpoints} pods running after {pods_running_s:.0f}s; waiting for every model's rounds")
        wait_for(
            lambda: _models_rounding(op, models), timeout, f"watchdog rounds over all {models} models", 2.0
        )
        # two more intervals: every pod has been seen Ready and scraped, the first scrapes'
        # connections are open
        time.sleep(2 * interval)
        setup_s = time.monotonic() - started
        body = _pod_body(env)
        reference_us = reference_parse_cpu_us(body)
        prometheus_us = reference_parse_cpu_us(body, REFERENCE_PARSES // 4, prometheus_parse)
        parse_us = reference_parse_cpu_us(body, parse=parse_metrics)
        _say(
            f"prometheus_client's parse: {prometheus_us:.1f} CPU-us; the reference parse: "
            f"{reference_us:.1f}; the operator's parse: {parse_us:.1f}"
        )
        measured: list[Window] = []
        reading = _read(op)
        for i in range(windows):
            _say(f"measuring window {i + 1} of {windows}: {measure_s:.0f}s of steady rounds")
            time.sleep(measure_s)
            after = _read(op)
            measured.append(window(reading, after))
            _say(f"window {i + 1}: {measured[-1].cores:.4f} core")
            reading = after
        rss, peak = op.rss_mib()
        _say("wedging one pod")
        wedge = _wedge_one(env, op, timeout=10 * interval + 60)
        # the JSON line comes after this: thousands of pods take minutes to go
        _say(f"cleaning up: deleting {env.namespace} and waiting for its {endpoints} pods to go")
    steady = steady_figures(measured, models, interval)
    result: dict[str, Any] = {
        "benchmark": "watchdog",
        "endpoints": endpoints,
        "models": models,
        "idle_models": idle_models,
        "interval_s": interval,
        "measure_seconds": measure_s,
        "pods_running_s": round(pods_running_s, 1),
        "setup_seconds": round(setup_s, 1),
        **steady,
        **scrape_cost(steady, endpoints, models, reference_us, prometheus_us),
        "parse_cpu_us": round(parse_us, 1),
        "unobserved_pods": int(reading.unobserved_pods),
        "operator_rss_mib": round(rss, 1),
        "operator_peak_rss_mib": round(peak, 1),
        **wedge,
        "cpus": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "goal": f"{endpoints} serving pods every {interval}s at most {GOAL_CPU_OVER_PROMETHEUS_PARSE:g}x "
        f"prometheus_client's parse per scrape and {GOAL_RSS_MIB:g} MiB, no late round",
    }
    result["goal_met"] = goal_met(result) if idle_models == 0 else None
    result["cores_goal_met"] = cores_goal_met(result) if idle_models == 0 else None
    return result


def _kubeconfig(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    from pdwarden_localcluster.cluster import ensure_up

    return Path(ensure_up().kubeconfig)


@click.command()
@click.option(
    "--endpoints",
    type=click.IntRange(2, MAX_ENDPOINTS),
    default=1000,
    show_default=True,
    help="Simulated runtime pods (prefill and decode) across all models.",
)
@click.option("--pods-per-model", type=click.IntRange(2, 1000), default=100, show_default=True)
@click.option(
    "--interval", type=click.IntRange(1, 60), default=10, show_default=True, help="scrapeIntervalSeconds"
)
@click.option(
    "--measure-seconds",
    type=click.FloatRange(10, 3600),
    default=60.0,
    show_default=True,
    help="Seconds of each steady window.",
)
@click.option(
    "--windows",
    type=click.IntRange(1, 20),
    default=3,
    show_default=True,
    help="Steady windows, one after another; `cores` is the median window's.",
)
@click.option(
    "--timeout", type=float, default=1200.0, show_default=True, help="Seconds to wait for the fleet to run."
)
@click.option(
    "--kubeconfig", default=None, help="An admin kubeconfig of the local cluster (default: started if down)."
)
@click.option(
    "--idle-models",
    type=click.IntRange(0, None),
    default=0,
    show_default=True,
    help="Models whose runtime pods are idle (no request ever), the last ones; the rest serve.",
)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line on stdout.")
def watchdog(
    endpoints: int,
    pods_per_model: int,
    interval: int,
    measure_seconds: float,
    windows: int,
    timeout: float,
    kubeconfig: str | None,
    idle_models: int,
    as_json: bool,
) -> None:
    """The operator's real watchdog round over N simulated runtime pods (goal: its CPU per scrape
    at most 2x prometheus_client's parse of the same body, 300 MiB, no round later than its
    interval, no scrape error)."""
    model_count(endpoints, pods_per_model, idle_models)  # refused before a cluster starts
    result = run(
        endpoints,
        pods_per_model,
        interval,
        measure_seconds,
        windows,
        timeout,
        _kubeconfig(kubeconfig),
        idle_models,
    )
    if not as_json:
        for key, value in result.items():
            _say(f"{key}: {value}")
    print(json.dumps(result), flush=True)

"""`pdwarden bench autoscale`: a seeded load ramp through the model's router, and how the
operator's autoscaler follows it.

One synthetic model on the local cluster, both roles autoscaled (1 to ``--max-replicas`` pods,
a target of ``TARGET_INFLIGHT`` requests in flight per pod, a prefill:decode band of 0.5 to 2),
an operator process on this machine. The load: ``LOW_CLIENTS`` clients for ``LOW_S`` seconds
(below the target: nothing may scale), then ``--clients`` until both roles have their new
capacity Ready and ``PLATEAU_S`` more, then none until both roles are back at one pod. Every
client sends the same multi-chunk prompt through the router's Service, one request after
another, each request's outcome recorded.

One JSON line: ``scale_out_seconds`` (the load step to the new capacity Ready),
``scale_in_seconds`` (the load's end to both roles at their minimum, the removed pods gone),
``requests_ok``, ``requests_failed``, ``requests_failed_during_scale_in``,
``ratio_out_of_band_seconds`` (the Deployments' prefill:decode outside the band),
``replica_seconds_over_needed`` (ready pods above what the clients need, summed over roles and
time), ``plateau_replicas``, ``seconds``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import click

import pdwarden_contract as contract
from pdwarden_bench.polling import Poller
from pdwarden_localcluster.waits import WaitTimeout, serving, wait_for
from pdwarden_operator.render.meta import child_name
from pdwarden_testkit.cluster_env import API_TRANSIENT, Env, http_json, open_env, synthetic_body

TARGET_INFLIGHT: Final = 3
RATIO: Final = {"min": 0.5, "max": 2.0}
LOW_CLIENTS: Final = 1
LOW_S: Final = 20.0
PLATEAU_S: Final = 20.0
SCRAPE_INTERVAL_S: Final = 2
# Several KV chunks with simulated compute between them: about a second per request, so the
# clients' requests are in flight long enough to be seen by a scrape.
PROMPT: Final = "pdwarden autoscale, a prompt of several chunks. " * 9
COMPUTE_MS: Final = 300
CLIENT_TIMEOUT_S: Final = 60.0
PHASE_TIMEOUT_S: Final = 300.0


def autoscaled_model(namespace: str, name: str, max_replicas: int) -> dict[str, Any]:
    """Both roles autoscaled from one pod, quick windows so a bench takes minutes, not hours."""
    scaling = {
        "minReplicas": 1,
        "maxReplicas": max_replicas,
        "target": {"inflightPerPod": TARGET_INFLIGHT},
        "scaleUp": {"stabilizationSeconds": 0, "maxStep": max_replicas, "periodSeconds": 10},
        "scaleDown": {"stabilizationSeconds": 15, "maxStep": 1, "periodSeconds": 5},
    }
    return synthetic_body(
        namespace,
        name,
        {
            "prefill": {"replicas": 1, "autoscaling": scaling, "args": ["--compute-ms", str(COMPUTE_MS)]},
            "decode": {"replicas": 1, "autoscaling": scaling},
            "prefillDecodeRatio": RATIO,
            "router": {"replicas": 1, "policy": "round_robin"},
            "watchdog": {"scrapeIntervalSeconds": SCRAPE_INTERVAL_S},
            # the operator runs on this machine and scrapes the pods from here
            "networkPolicy": {"enabled": False},
        },
    )


def send_one(url: str, model: str) -> str | None:
    """One request of the ramp's prompt to `url`; None when answered 200, else what went wrong."""
    body = {"model": model, "text": PROMPT, "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}}
    try:
        status, answer = http_json(url, body, timeout=CLIENT_TIMEOUT_S)
    except (OSError, ValueError) as exc:  # no answer, or one that is not the JSON it claims
        return repr(exc)
    return None if status == 200 else f"HTTP {status}: {str(answer)[:120]}"


@dataclass
class RouterClients:
    """Clients of the router's Service, one request after another each; `active` of them send."""

    url: str
    model: str
    clients: int
    active: int = 0
    results: list[tuple[float, float, bool]] = field(default_factory=list)  # (start, end, ok)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _client(self, i: int) -> None:
        while not self._stop.is_set():
            if i >= self.active:
                self._stop.wait(0.2)
                continue
            start = time.monotonic()
            ok = send_one(self.url, self.model) is None
            self.results.append((start, time.monotonic(), ok))
            if not ok:
                self._stop.wait(0.2)

    def __enter__(self) -> RouterClients:
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(self.clients)
        ]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(CLIENT_TIMEOUT_S + 5)

    def failed_between(self, since: float, until: float = math.inf) -> int:
        return sum(1 for _, end, ok in list(self.results) if not ok and since <= end < until)


@dataclass
class Sample:
    at: float
    deployed: dict[str, int]
    ready: dict[str, int]
    pods: dict[str, int]  # listed, terminating ones included
    clients: int


@dataclass
class Watch(Poller):
    """The roles' Deployments and pods, once a second."""

    env: Env
    name: str
    clients: RouterClients
    samples: list[Sample] = field(default_factory=list)

    def poll(self) -> None:
        # both counts from one listing: one resourceVersion, never one role's count from before
        # a write and the other's from after the next
        selector = f"{contract.LABEL_MODEL}={self.name}"
        listing = self.env.call(
            "GET", f"/apis/apps/v1/namespaces/{self.env.namespace}/deployments?labelSelector={selector}"
        )
        counts = {d["metadata"]["name"]: int(d["spec"]["replicas"]) for d in listing["items"]}
        deployed, ready, listed = {}, {}, {}
        for role in contract.RUNTIME_ROLES:
            deployed[role] = counts[child_name(self.name, role)]
            pods = self.env.pods(self.name, role)
            listed[role] = len(pods)
            ready[role] = sum(1 for p in pods if serving(p))
        self.samples.append(Sample(time.monotonic(), deployed, ready, listed, self.clients.active))

    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None


def needed(clients: int, max_replicas: int) -> int:
    """Pods a role needs for `clients` at the target (each client keeps one request in flight)."""
    return max(1, min(max_replicas, math.ceil(clients / TARGET_INFLIGHT)))


def _band_seconds(samples: list[Sample]) -> float:
    out = 0.0
    for before, after in itertools.pairwise(samples):
        p, d = before.deployed["prefill"], before.deployed["decode"]
        if d and not RATIO["min"] - 1e-9 <= p / d <= RATIO["max"] + 1e-9:
            out += after.at - before.at
    return out


def _over_needed(samples: list[Sample], max_replicas: int) -> float:
    out = 0.0
    for before, after in itertools.pairwise(samples):
        want = needed(before.clients, max_replicas)
        out += sum(max(0, before.ready[r] - want) for r in contract.RUNTIME_ROLES) * (after.at - before.at)
    return out


def _until(watch: Watch, test: Any, what: str) -> float:
    """Wait until `test(sample)` holds for the latest sample; returns that sample's time."""
    found: list[float] = []

    def check() -> bool:
        s = watch.latest()
        if s is not None and test(s):
            found.append(s.at)
            return True
        return False

    wait_for(check, PHASE_TIMEOUT_S, what, 0.5)
    return found[0]


def router_url(env: Env, name: str) -> str:
    path = f"/api/v1/namespaces/{env.namespace}/services/{child_name(name, contract.ROLE_ROUTER)}"
    ip = env.call("GET", path)["spec"]["clusterIP"]
    return f"http://{ip}:{contract.ROUTER_HTTP_PORT}{contract.GENERATE_PATH}"


def bring_up(env: Env, name: str, max_replicas: int, body: dict[str, Any] | None = None) -> str:
    """The model (`body`, else autoscaled_model) at one pod per role, its router answering;
    returns the router's URL."""
    env.create_model(body if body is not None else autoscaled_model(env.namespace, name, max_replicas))
    wait_for(
        lambda: all(
            len(env.live_ready_pods(name, r)) == 1 for r in (*contract.RUNTIME_ROLES, contract.ROLE_ROUTER)
        ),
        240,
        "one ready prefill, decode and router pod",
        1.0,
        API_TRANSIENT,
    )
    url = router_url(env, name)
    failures: list[str] = []

    def answered() -> bool:
        # a fresh request each try: the Service's rules and the router's workers may lag the
        # pods' readiness by a few seconds
        error = send_one(url, name)
        if error is not None:
            failures.append(error)
        return error is None

    try:
        wait_for(answered, 120, "a request answered through the router", 1.0)
    except WaitTimeout as exc:
        raise WaitTimeout(f"{exc}; the last failures: {failures[-3:]}") from exc
    return url


def scenario(env: Env, clients: int, max_replicas: int) -> dict[str, Any]:
    """The ramp (low, up, plateau, down) on a model of its own; its figures."""
    started = time.monotonic()
    name = f"autoscale-{uuid.uuid4().hex[:5]}"
    env.start_operator()
    url = bring_up(env, name, max_replicas)
    plateau = needed(clients, max_replicas)
    with RouterClients(url, name, clients) as load, Watch(env, name, load) as watch:
        load.active = LOW_CLIENTS
        low_start = time.monotonic()
        time.sleep(LOW_S)
        low_moves = [s for s in watch.samples if s.at >= low_start and max(s.deployed.values()) > 1]
        step = time.monotonic()
        load.active = clients
        ready_at = _until(
            watch,
            lambda s: all(s.ready[r] >= plateau for r in contract.RUNTIME_ROLES),
            f"{plateau} ready pods of each role",
        )
        time.sleep(PLATEAU_S)
        at_plateau = watch.latest()
        drop = time.monotonic()
        load.active = 0
        settled_at = _until(
            watch,
            lambda s: all(
                s.deployed[r] == 1 and s.pods[r] == 1 and s.ready[r] == 1 for r in contract.RUNTIME_ROLES
            ),
            "both roles back at one pod, the others gone",
        )
        samples = list(watch.samples)
    ok = sum(1 for *_, good in load.results if good)
    status = env.dm(name).get("status") or {}
    return {
        "benchmark": "autoscale",
        "scale_out_seconds": round(ready_at - step, 1),
        "scale_in_seconds": round(settled_at - drop, 1),
        "requests_ok": ok,
        "requests_failed": load.failed_between(0.0),
        "requests_failed_during_scale_in": load.failed_between(drop),
        "ratio_out_of_band_seconds": round(_band_seconds(samples), 1),
        "replica_seconds_over_needed": round(_over_needed(samples, max_replicas), 1),
        "plateau_replicas": at_plateau.deployed if at_plateau else {},
        "scaled_at_low_load": bool(low_moves),
        "clients": clients,
        "max_replicas": max_replicas,
        "target_inflight_per_pod": TARGET_INFLIGHT,
        "events": sorted(
            {e["reason"] for e in env.events(name) if e["reason"].startswith(("Scaled", "Autoscale"))}
        ),
        "last_status": status.get("autoscaling"),
        "seconds": round(time.monotonic() - started, 1),
    }


@contextlib.contextmanager
def bench_env(kubeconfig: str | None) -> Iterator[Env]:
    """A namespace of its own on the cluster (the local one, started if down), deleted after."""
    from pdwarden_localcluster.cluster import ensure_up

    config = Path(kubeconfig) if kubeconfig else Path(ensure_up().kubeconfig)
    namespace = f"pdw-bench-autoscale-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory() as tmp:
        gen = open_env(config, namespace, Path(tmp), create_namespace=True)
        env = next(gen)
        try:
            yield env
        finally:
            with contextlib.suppress(StopIteration):
                next(gen)


@click.command()
@click.option("--clients", type=click.IntRange(1, 64), default=9, show_default=True)
@click.option("--max-replicas", type=click.IntRange(1, 8), default=3, show_default=True)
@click.option("--kubeconfig", default=None, help="Default: the local cluster (started if down).")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line on stdout.")
def autoscale(clients: int, max_replicas: int, kubeconfig: str | None, as_json: bool) -> None:
    """A load ramp through the router: scale-out and scale-in times, failed requests, P:D band."""
    with bench_env(kubeconfig) as env:
        result = scenario(env, clients, max_replicas)
    if not as_json:
        click.echo(
            f"scale out {result['scale_out_seconds']}s, in {result['scale_in_seconds']}s, "
            f"{result['requests_failed']} requests failed, {result['requests_ok']} ok",
            err=True,
        )
    print(json.dumps(result), flush=True)

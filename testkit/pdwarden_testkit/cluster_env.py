"""The watchdog's cluster harness, shared by the watchdog e2e tests and
`pdwarden bench remediation`: raw API access to one namespace, operator processes, router-like
load, and the race fault that wedges one prefill pod.

Load is sent the way the router (smg) sends it (the same body with bootstrap host/port/room to a
prefill and a decode pod; the router pod itself is not on the path), so the scenarios depend
only on the runtime pods.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import pdwarden_contract as contract
from pdwarden_localcluster.kubeapi import KubeApi
from pdwarden_localcluster.waits import serving, wait_for
from pdwarden_operator.watchdog import outcome
from pdwarden_testkit.operator_process import OperatorExited, OperatorProcess
from pdwarden_testkit.ports import free_port
from pdwarden_testkit.promtext import metric_sum, samples

GROUP, VERSION, PLURAL = contract.API_GROUP, contract.API_VERSION, contract.PLURAL
PDWARDEN = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "pdwarden")
# The watchdog figures of the scenarios (the CRD's spec.watchdog).
STUCK = 20
INTERVAL = 5
SOAK_ROUNDS = int(os.environ.get("PDWARDEN_E2E_SOAK_ROUNDS", "12"))
WATCHDOG = {
    "stuckAfterSeconds": STUCK,
    "scrapeIntervalSeconds": INTERVAL,
    "action": "restart",
    "maxRemediations": 3,
    "budgetWindowSeconds": 600,
    "maxUnavailable": 1,
}
# The earlier ladder steps (terminal-sticky status, no silent skip, deadlines) would catch the
# race inside the pod; the watchdog is the last layer, so these pods run without them.
EMULATED_PORT_PREFILL = ["--hardening", "emulated-port", "--race-window", "5"]
RACE_PROMPT = "w" * 400  # 25 KV pages = 4 chunks: non-last chunks open the race window
# Outcomes that spend the remediation budget.
CHARGED = tuple(o.value for o in outcome.CHARGED)
# Errors of the raw API client while things start or restart (a retry is the answer).
API_TRANSIENT: tuple[type[BaseException], ...] = (Exception,)


def http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 10.0) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url,
        data=data,
        headers={"Content-Type": "application/json"},
        method="POST" if body is not None else "GET",
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


@dataclass
class Answers:
    """What clients through a router saw: answers 200, and every other outcome, timed."""

    ok: int = 0
    failed: list[str] = field(default_factory=list)


@contextlib.contextmanager
def router_clients(url: str, body: dict[str, Any], clients: int = 3) -> Iterator[Answers]:
    """`clients` threads POSTing `body` to `url` (a router's Service), a new connection each
    time, while the block runs; a client that gets no answer is a failure, never retried."""
    answers, stop = Answers(), threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                status, answer = http_json(url, body, timeout=30)
            except OSError as exc:
                status, answer = 0, repr(exc)
            if status == 200:
                answers.ok += 1
            else:
                answers.failed.append(f"{time.strftime('%H:%M:%S')} {status} {str(answer)[:200]}")
            stop.wait(0.05)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    try:
        yield answers
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=40)


def pod_metrics_body(pod: dict[str, Any], timeout: float = 3.0) -> bytes:
    """The pod's /metrics body as the watchdog asks for it (the families it reads)."""
    from pdwarden_operator.watchdog.scrape import READ_QUERY

    with urllib.request.urlopen(f"{metrics_url(pod)}?{READ_QUERY}", timeout=timeout) as resp:
        body: bytes = resp.read()
    return body


def pod_metrics(pod: dict[str, Any]) -> dict[str, float]:
    """The watchdog's three figures from a pod's /metrics, read with the watchdog's own parser."""
    from pdwarden_operator.watchdog.parse import parse_metrics

    sample = parse_metrics(pod_metrics_body(pod))
    return {"inflight": sample.inflight, "age": sample.oldest_age, "transfers": sample.transfers}


def metrics_url(pod: dict[str, Any]) -> str:
    """The pod's /metrics, as the watchdog finds it (its port named metrics)."""
    from pdwarden_operator.watchdog.targets import metrics_url as watchdog_metrics_url

    url = watchdog_metrics_url(pod)
    if url is None:
        raise ValueError(f"{pod['metadata']['name']} is not running: no metrics to read")
    return url


def generate_url(pod: dict[str, Any]) -> str:
    return f"http://{pod['status']['podIP']}:{contract.DEFAULT_HTTP_PORT}{contract.GENERATE_PATH}"


@dataclass
class Env:
    """One test's namespace on the local cluster and the operator processes it started."""

    kubeconfig: Path
    namespace: str
    tmp: Path
    api: KubeApi
    operators: list[OperatorProcess] = field(default_factory=list)

    # --- raw API access (plain dicts) -------------------------------------------------------
    def call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> dict[str, Any]:
        return self.api.request(method, path, body, content_type=content_type, timeout=30)

    def dm(self, name: str) -> dict[str, Any]:
        return self.call("GET", f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}/{name}")

    def pods(self, model: str, role: str) -> list[dict[str, Any]]:
        sel = f"{contract.LABEL_MODEL}={model},{contract.LABEL_ROLE}={role}"
        items = self.call("GET", f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={sel}")["items"]
        return sorted(items, key=lambda p: p["metadata"]["name"])

    def live_ready_pods(self, model: str, role: str) -> list[dict[str, Any]]:
        return [p for p in self.pods(model, role) if serving(p)]

    def pod_log(self, pod: str, tail: int = 40) -> str:
        """The last ``tail`` lines of the pod's log (for a failing test's message)."""
        path = f"/api/v1/namespaces/{self.namespace}/pods/{pod}/log?tailLines={tail}"
        return self.api.text(path)

    def events(self, name: str) -> list[dict[str, Any]]:
        items = self.call("GET", f"/api/v1/namespaces/{self.namespace}/events")["items"]
        return [e for e in items if e["involvedObject"]["name"] == name]

    def create_model(self, body: dict[str, Any]) -> None:
        self.call("POST", f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}", body)

    def create_dm(
        self, name: str, watchdog: dict[str, Any], prefill_args: list[str] | None = None, replicas: int = 2
    ) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": contract.KIND,
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "annotations": {contract.ANNOTATION_ALLOW_FAULT_INJECTION: "true"},
            },
            "spec": {
                "model": {"path": "synthetic/tiny", "servedName": name},
                "engine": "synthetic",
                "prefill": {"replicas": replicas, "args": prefill_args or []},
                "decode": {"replicas": replicas},
                "router": {"replicas": 1, "policy": "round_robin"},
                # the ladder's order: the runtime's deadline (step 1) below stuckAfterSeconds; the
                # race scenarios run the emulated port (no self-heal), so only the operator heals them
                "transfer": {
                    "inflightDeadlineSeconds": watchdog["stuckAfterSeconds"] - 5,
                    "transferDeadlineSeconds": min(10, watchdog["stuckAfterSeconds"] - 5),
                },
                "watchdog": watchdog,
                **HOST_PLAYS_ROUTER,
            },
        }
        self.call("POST", f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}", body)

    # --- the operator -----------------------------------------------------------------------
    def start_operator(self, *extra_args: str) -> OperatorProcess:
        """An operator watching this namespace only, healthy when this returns. Its metrics port
        binds when chosen, but on a shared machine another process may take it first: the
        operator then exits at start, and a fresh port is tried."""
        for attempt in range(3):
            op = OperatorProcess(
                self.kubeconfig,
                namespaces=(self.namespace,),
                metrics_port=free_port(),
                log_path=self.tmp / f"operator-{len(self.operators)}.log",
                extra_args=extra_args,
            )
            self.operators.append(op)
            try:
                return op.start()
            except OperatorExited:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def stop_operators(self) -> None:
        for op in self.operators:
            op.stop()

    def operator_logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-6000:] for p in sorted(self.tmp.glob("operator-*.log"))
        )

    def install_crd(self, crd: dict[str, Any]) -> None:
        name = crd["metadata"]["name"]
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        # server-side apply creates it or brings it up to date, whoever else applies it meanwhile
        self.call(
            "PATCH",
            f"{path}?fieldManager=pdwarden-e2e&force=true",
            crd,
            content_type="application/apply-patch+yaml",
        )
        wait_for(
            lambda: any(
                c["type"] == "Established" and c["status"] == "True"
                for c in self.call("GET", path).get("status", {}).get("conditions", [])
            ),
            60,
            "the CRD to be established",
            1.0,
            API_TRANSIENT,
        )


# The scenarios' clients, fault injector and operator run on the host, outside the cluster, and
# send PD requests as the router would. The models' defaults keep that for the router alone:
# NetworkPolicies (enforced by the local cluster) and the worker key. The scenarios' models go
# without both; tests/e2e/test_tenants.py, the demo and the monitoring e2e run with them.
HOST_PLAYS_ROUTER: dict[str, Any] = {"networkPolicy": {"enabled": False}, "workerKey": {"enabled": False}}


def synthetic_body(namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A DisaggregatedModel of the synthetic engine serving `name`; `spec` holds the rest."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": contract.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"model": {"path": "synthetic/tiny", "servedName": name}, "engine": "synthetic", **spec},
    }


def synthetic_model(
    namespace: str,
    name: str,
    *,
    replicas: int,
    transfer: dict[str, Any],
    watchdog: dict[str, Any],
    decode_args: list[str] | None = None,
) -> dict[str, Any]:
    """A DisaggregatedModel of synthetic pods: `replicas` prefill and decode pods, one router."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": contract.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"path": "synthetic/tiny"},
            "engine": "synthetic",
            "prefill": {"replicas": replicas},
            "decode": {"replicas": replicas, "args": decode_args or []},
            "router": {"replicas": 1},
            "transfer": transfer,
            "watchdog": watchdog,
            **HOST_PLAYS_ROUTER,
        },
    }


class Load:
    """Steady traffic on background threads, sent the way the router sends it: the same body
    (with bootstrap host/port/room) to a prefill and a decode pod at once; success = both 200.
    Pods are re-listed continuously, so a replaced pod is picked up as the router would."""

    def __init__(self, env: Env, model: str, concurrency: int, prompt: str = "pdwarden watchdog e2e") -> None:
        self.env = env
        self.model = model
        self.concurrency = concurrency
        self.prompt = prompt  # short by default: one KV chunk, never parked by the race window
        self.ok: list[float] = []
        self.failed: list[float] = []
        self.pods: dict[str, list[dict[str, Any]]] = {}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._worker, args=(i,), daemon=True) for i in range(concurrency)
        ]
        self._threads.append(threading.Thread(target=self._refresh, daemon=True))

    def _refresh(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self.pods = {r: self.env.live_ready_pods(self.model, r) for r in contract.RUNTIME_ROLES}
            self._stop.wait(2)

    def _worker(self, i: int) -> None:
        n = i
        while not self._stop.is_set():
            prefills, decodes = self.pods.get("prefill") or [], self.pods.get("decode") or []
            if not prefills or not decodes:
                self._stop.wait(0.5)  # the pod list arrives within one refresh
                continue
            n += 1
            p, d = prefills[n % len(prefills)], decodes[(n // len(prefills)) % len(decodes)]
            body = {
                "text": self.prompt,
                "sampling_params": {"max_new_tokens": 4},
                "bootstrap_host": p["status"]["podIP"],
                "bootstrap_port": contract.DEFAULT_BOOTSTRAP_PORT,
                "bootstrap_room": uuid.uuid4().int & ((1 << 62) - 1),
            }
            result: list[int] = []

            def to_prefill(
                pod: dict[str, Any] = p, req: dict[str, Any] = body, out: list[int] = result
            ) -> None:
                with contextlib.suppress(Exception):
                    out.append(http_json(generate_url(pod), req, 30)[0])

            t = threading.Thread(target=to_prefill, daemon=True)
            t.start()
            try:
                status = http_json(generate_url(d), body, 30)[0]
            except Exception:
                status = 0
            t.join(35)
            if status == 200 and result == [200]:
                self.ok.append(time.monotonic())
            else:
                self.failed.append(time.monotonic())
                self._stop.wait(0.2)  # back off from a pod that is going away

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=40)

    def ok_since(self, t: float) -> int:
        return sum(1 for x in list(self.ok) if x >= t)

    def wait_flowing(self, requests: int = 4, timeout: float = 120) -> None:
        """Until `requests` more requests succeeded end to end."""
        since = time.monotonic()
        wait_for(lambda: self.ok_since(since) >= requests, timeout, f"{requests} requests through the pods")


def up(
    env: Env,
    name: str,
    watchdog: dict[str, Any],
    prefill_args: list[str] | None = None,
    operator_args: tuple[str, ...] = (),
) -> OperatorProcess:
    """Operator running, the model's 2+2 runtime pods Ready and scraped once."""
    op = env.start_operator(*operator_args)
    env.create_dm(name, watchdog, prefill_args)
    wait_for(
        lambda: all(len(env.live_ready_pods(name, r)) == 2 for r in contract.RUNTIME_ROLES),
        240,
        "2 ready prefill and 2 ready decode pods",
        1.0,
        API_TRANSIENT,
    )
    wait_for(
        lambda: (env.dm(name).get("status") or {}).get("watchdog", {}).get("lastScrape"),
        60,
        "the watchdog's first scrape",
        1.0,
        API_TRANSIENT,
    )
    return op


def inject(pod: dict[str, Any], fault: str) -> None:
    url = f"http://{pod['status']['podIP']}:{contract.DEFAULT_HTTP_PORT}{contract.FAULT_PATH}"
    status, body = http_json(url, {"fault": fault})
    assert status == 200, f"fault injection refused: {status} {body}"


def race_once(prefill: dict[str, Any], decode: dict[str, Any]) -> None:
    """What the router does for one request, then the client gives up on decode mid-transfer:
    decode's handler is cancelled and sends ABORT to prefill inside the race window."""
    body = {
        "text": RACE_PROMPT,
        "sampling_params": {"max_new_tokens": 4},
        "bootstrap_host": prefill["status"]["podIP"],
        "bootstrap_port": contract.DEFAULT_BOOTSTRAP_PORT,
        "bootstrap_room": uuid.uuid4().int & ((1 << 62) - 1),
    }

    def to_prefill() -> None:  # held open like the router would: the stuck room stays stuck
        with contextlib.suppress(Exception):
            http_json(generate_url(prefill), body, 900)

    threading.Thread(target=to_prefill, daemon=True).start()
    with contextlib.suppress(Exception):
        http_json(generate_url(decode), body, 1.5)


def stuck_since(pod: dict[str, Any]) -> float | None:
    """Wall time the pod's oldest inflight request was born, if one is clearly stuck (> 3 s)."""
    m = pod_metrics(pod)
    return time.time() - m["age"] if m["inflight"] > 0 and m["age"] > 3 else None


def wedge(env: Env, name: str, victim: dict[str, Any]) -> float:
    """Inject the emulated port's race into `victim` and trigger it; returns when its stuck room was born."""
    return wedge_pod(victim, env.live_ready_pods(name, contract.ROLE_DECODE)[0])


def wedge_pod(victim: dict[str, Any], decode: dict[str, Any]) -> float:
    """`wedge` with the decode pod given: the race's requests go to `victim` and `decode`."""
    inject(victim, contract.FAULT_EMULATED_PORT_RACE)
    for _ in range(5):
        race_once(victim, decode)
        with contextlib.suppress(AssertionError):
            return wait_for(
                lambda: stuck_since(victim), 10, f"a stuck room on {victim['metadata']['name']}", 0.5
            )
    raise AssertionError(f"the race never wedged {victim['metadata']['name']}")


def remediations(env: Env, name: str, pod: str | None = None) -> list[dict[str, Any]]:
    rem = (env.dm(name).get("status") or {}).get("remediations") or []
    return [r for r in rem if pod is None or r["pod"] == pod]


def with_outcome(env: Env, name: str, pod: str, outcome: str) -> list[dict[str, Any]]:
    return [r for r in remediations(env, name, pod) if r["outcome"] == outcome]


def assert_each_pod_acted_on_once(env: Env, name: str) -> list[dict[str, Any]]:
    """No pod remediated twice, and the budget charged exactly once per remediation.

    Deleting a wedged prefill pod can leave rooms on decode pods that were receiving from
    it; if the runtime does not fail those before stuckAfterSeconds, the watchdog (rightly,
    by the rule) remediates such a pod too: a cascade, counted here, never a repeat.
    """
    status = env.dm(name)["status"]
    charged = [r for r in status.get("remediations") or [] if r["outcome"] in CHARGED]
    pods = [r["pod"] for r in charged]
    assert len(pods) == len(set(pods)), charged
    assert status["watchdog"]["budget"]["used"] == len(charged), (status["watchdog"], charged)
    return charged


def epoch(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def operator_page(op: OperatorProcess, timeout: float = 10.0) -> str:
    """The operator's /metrics page, as text."""
    _, text = http_json(f"http://127.0.0.1:{op.metrics_port}{contract.METRICS_PATH}", timeout=timeout)
    return str(text)


def operator_metric(op: OperatorProcess, name: str, **labels: str) -> float:
    """The sum of one of the operator's series (all models: the operator watches one namespace)."""
    return metric_sum(samples(operator_page(op)), name, **labels)


def wait_rounds(op: OperatorProcess, model: str, rounds: int, timeout: float = 120) -> None:
    """Until the watchdog has finished `rounds` more rounds over `model` (each round's scrape
    is one observation of the operator's scrape-duration histogram)."""
    count = f"{contract.METRIC_OPERATOR_SCRAPE_DURATION}_count"
    start = operator_metric(op, count, model=model)
    wait_for(
        lambda: operator_metric(op, count, model=model) >= start + rounds,
        timeout,
        f"{rounds} more watchdog rounds over {model}",
        1.0,
    )


def open_env(kubeconfig: Path, namespace: str, tmp: Path, *, create_namespace: bool = False) -> Iterator[Env]:
    """The body of the scenarios' `env` fixture: an Env on `namespace` (created first when
    asked: a benchmark's) with the CRD installed; afterwards its operators stop (their logs go
    to stderr), the namespace is deleted and its pods waited for."""
    e = Env(kubeconfig=kubeconfig, namespace=namespace, tmp=tmp, api=KubeApi.from_kubeconfig(kubeconfig))
    if create_namespace:
        e.call(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        )
    e.install_crd(
        yaml.safe_load(subprocess.run([PDWARDEN, "crd"], check=True, capture_output=True, text=True).stdout)
    )
    try:
        yield e
    finally:
        e.stop_operators()
        print(e.operator_logs(), file=sys.stderr)  # shown by pytest only when the test failed
        with contextlib.suppress(Exception):
            e.call("DELETE", f"/api/v1/namespaces/{namespace}")
        with contextlib.suppress(Exception):
            # the scenario is over: its pods need no grace period (a wedged one would use it all)
            e.call("DELETE", f"/api/v1/namespaces/{namespace}/pods", {"gracePeriodSeconds": 0})
        with contextlib.suppress(Exception):
            wait_for(
                lambda: not e.call("GET", f"/api/v1/namespaces/{namespace}/pods")["items"],
                90,
                "the namespace's pods to stop",
                1.0,
                API_TRANSIENT,
            )

"""The wedge watchdog end to end: local cluster, real operator process, synthetic runtime pods.

Each test runs its own operator process (scoped to the test's namespace) against 2 prefill +
2 decode synthetic pods, drives load at them the way sglang-router does (same body with
bootstrap host/port/room to a prefill and a decode pod; the router pod itself is not on the
path, so these tests depend only on the runtime pods), injects faults into ONE pod and checks
what the watchdog decided (status, Events, metrics, pods).

The healthy soak runs PDWARDEN_E2E_SOAK_SECONDS (default 60; set 300 for the 5-minute soak).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from pdwarden_bench.runtime_procs import free_port
from pdwarden_operator.models import WatchdogSpec
from pdwarden_runtime import contract

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PDWARDEN = str(REPO / ".venv" / "bin" / "pdwarden")
STUCK = 20
INTERVAL = 5
SOAK_SECONDS = int(os.environ.get("PDWARDEN_E2E_SOAK_SECONDS", "60"))
GROUP, VERSION, PLURAL = contract.API_GROUP, contract.API_VERSION, contract.PLURAL
T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, every: float = 1.0) -> T:
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
        except Exception as exc:  # transient API errors while things start
            last_exc, value = exc, None
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last_exc})")


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


def pod_metrics(pod: dict[str, Any]) -> dict[str, float]:
    """The watchdog's three figures from a pod's /metrics, read by the test itself."""
    from pdwarden_operator.watchdog.parse import parse_metrics

    with urllib.request.urlopen(
        f"http://{pod['status']['podIP']}:{contract.DEFAULT_METRICS_PORT}/metrics", timeout=3
    ) as resp:
        sample = parse_metrics(resp.read())
    return {"inflight": sample.inflight, "age": sample.oldest_age, "transfers": sample.transfers}


@dataclass
class Env:
    kubeconfig: Path
    namespace: str
    tmp: Path
    api: Any = None
    operators: list[subprocess.Popen[bytes]] = field(default_factory=list)

    # --- raw API access (plain dicts) -------------------------------------------------------
    def _call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        resp = self.api.call_api(
            path,
            method,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
            _request_timeout=30,
        )
        data = resp.data
        return json.loads(data) if data else {}

    def dm(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}/{name}")

    def pods(self, model: str, role: str) -> list[dict[str, Any]]:
        sel = f"{contract.LABEL_MODEL}={model},{contract.LABEL_ROLE}={role}"
        items = self._call("GET", f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={sel}")["items"]
        return sorted(items, key=lambda p: p["metadata"]["name"])

    def live_ready_pods(self, model: str, role: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods(model, role)
            if not p["metadata"].get("deletionTimestamp")
            and any(
                c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or []
            )
            and p["status"].get("podIP")
        ]

    def events(self, name: str) -> list[dict[str, Any]]:
        items = self._call("GET", f"/api/v1/namespaces/{self.namespace}/events")["items"]
        return [e for e in items if e["involvedObject"]["name"] == name]

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
                # race scenarios run without hardening, so only the operator's step heals them
                "transfer": {
                    "inflightDeadlineSeconds": watchdog["stuckAfterSeconds"] - 5,
                    "transferDeadlineSeconds": min(10, watchdog["stuckAfterSeconds"] - 5),
                },
                "watchdog": watchdog,
            },
        }
        self._call("POST", f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}", body)

    # --- the operator -----------------------------------------------------------------------
    def start_operator(self, *extra_args: str) -> tuple[subprocess.Popen[bytes], int]:
        """An operator process whose metrics endpoint answers. The port binds when chosen, but
        on a shared machine another process may take it before the operator binds it: the
        operator then exits at start, and a fresh port is tried."""
        for _ in range(3):
            proc, port = self._spawn_operator(extra_args)

            def up_or_exited(p: subprocess.Popen[bytes] = proc, n: int = port) -> bool:
                return p.poll() is not None or _metrics_answer(n)

            wait_for("the operator's metrics endpoint (or its exit)", up_or_exited, timeout=60, every=0.2)
            if proc.poll() is None:
                return proc, port
        raise AssertionError(f"the operator did not start:\n{self.operator_logs()}")

    def _spawn_operator(self, extra_args: tuple[str, ...]) -> tuple[subprocess.Popen[bytes], int]:
        # a port that binds now, outside the ephemeral range (a fixed one there may be held by
        # any outgoing connection, and the operator would then exit at start)
        port = free_port()
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        env.pop("POD_IP", None)
        log = open(self.tmp / f"operator-{len(self.operators)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                PDWARDEN,
                "operator",
                "run",
                "--namespace",
                self.namespace,
                "--metrics-port",
                str(port),
                "--health-port",
                "0",
                "--bind-host",
                "127.0.0.1",
                *extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self.operators.append(proc)
        return proc, port

    def stop_operators(self) -> None:
        for proc in self.operators:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()

    def operator_logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-6000:] for p in sorted(self.tmp.glob("operator-*.log"))
        )


class Load:
    """Steady traffic on background threads, sent the way sglang-router sends it: the same body
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
                time.sleep(0.5)
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
                    out.append(http_json(_generate_url(pod), req, 30)[0])

            t = threading.Thread(target=to_prefill, daemon=True)
            t.start()
            try:
                status = http_json(_generate_url(d), body, 30)[0]
            except Exception:
                status = 0
            t.join(35)
            if status == 200 and result == [200]:
                self.ok.append(time.monotonic())
            else:
                self.failed.append(time.monotonic())
                time.sleep(0.2)

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


def _generate_url(pod: dict[str, Any]) -> str:
    return f"http://{pod['status']['podIP']}:{contract.DEFAULT_HTTP_PORT}{contract.GENERATE_PATH}"


def _install_crd(env: Env) -> None:
    crd = yaml.safe_load(subprocess.run([PDWARDEN, "crd"], check=True, capture_output=True, text=True).stdout)
    name = crd["metadata"]["name"]
    try:
        env._call("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        env._call(
            "PATCH",
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}?fieldManager=pdwarden-e2e"
            "&force=true",
            crd,
            content_type="application/apply-patch+yaml",
        )
    except Exception:
        env._call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    wait_for(
        "the CRD to be established",
        lambda: any(
            c["type"] == "Established" and c["status"] == "True"
            for c in env._call("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            .get("status", {})
            .get("conditions", [])
        ),
        timeout=60,
    )


@pytest.fixture
def env(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[Env]:
    import kubernetes

    cfg = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=cfg)
    api = kubernetes.client.ApiClient(cfg)
    ns = namespace
    e = Env(kubeconfig=Path(cluster.kubeconfig), namespace=ns, tmp=tmp_path, api=api)
    _install_crd(e)
    try:
        yield e
    finally:
        e.stop_operators()
        print(e.operator_logs(), file=sys.stderr)  # shown by pytest only when the test failed
        with contextlib.suppress(Exception):
            e._call("DELETE", f"/api/v1/namespaces/{ns}")
        with contextlib.suppress(Exception):
            wait_for(
                "the namespace's pods to stop",
                lambda: not e._call("GET", f"/api/v1/namespaces/{ns}/pods")["items"],
                timeout=90,
            )
        api.close()


def _up(
    env: Env, name: str, watchdog: dict[str, Any], prefill_args: list[str] | None = None, **kw: Any
) -> tuple[subprocess.Popen[bytes], int]:
    """Operator running, the model's 2+2 runtime pods Ready and scraped once."""
    proc, port = env.start_operator(*kw.get("operator_args", ()))
    env.create_dm(name, watchdog, prefill_args)
    wait_for(
        "2 ready prefill and 2 ready decode pods",
        lambda: all(len(env.live_ready_pods(name, r)) == 2 for r in contract.RUNTIME_ROLES),
        timeout=240,
    )
    wait_for(
        "the watchdog's first scrape",
        lambda: (env.dm(name).get("status") or {}).get("watchdog", {}).get("lastScrape"),
        timeout=60,
    )
    return proc, port


# The earlier ladder steps (terminal-sticky status, no silent skip, deadlines) would catch the
# race inside the pod; the watchdog is the last layer, so these pods run without them.
LEGACY_PREFILL = ["--hardening", "off", "--race-window", "5"]
RACE_PROMPT = "w" * 400  # 25 KV pages = 4 chunks: non-last chunks open the race window


def _inject(pod: dict[str, Any], fault: str) -> None:
    url = f"http://{pod['status']['podIP']}:{contract.DEFAULT_HTTP_PORT}{contract.FAULT_PATH}"
    status, body = http_json(url, {"fault": fault})
    assert status == 200, f"fault injection refused: {status} {body}"


def _race_once(prefill: dict[str, Any], decode: dict[str, Any]) -> None:
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
            http_json(f"http://{prefill['status']['podIP']}:{contract.DEFAULT_HTTP_PORT}/generate", body, 900)

    threading.Thread(target=to_prefill, daemon=True).start()
    with contextlib.suppress(Exception):
        http_json(f"http://{decode['status']['podIP']}:{contract.DEFAULT_HTTP_PORT}/generate", body, 1.5)


def _stuck_since(pod: dict[str, Any]) -> float | None:
    """Wall time the pod's oldest inflight request was born, if one is clearly stuck (> 3 s)."""
    m = pod_metrics(pod)
    return time.time() - m["age"] if m["inflight"] > 0 and m["age"] > 3 else None


def _wedge(env: Env, name: str, victim: dict[str, Any]) -> float:
    """Inject the seed's race into `victim` and trigger it; returns when its stuck room was born."""
    _inject(victim, "legacy-status-race")
    decode = env.live_ready_pods(name, contract.ROLE_DECODE)[0]
    for _ in range(5):
        _race_once(victim, decode)
        with contextlib.suppress(AssertionError):
            return wait_for(
                f"a stuck room on {victim['metadata']['name']}", lambda: _stuck_since(victim), 10, 0.5
            )
    raise AssertionError(f"the race never wedged {victim['metadata']['name']}")


def _remediations(env: Env, name: str, pod: str | None = None) -> list[dict[str, Any]]:
    rem = (env.dm(name).get("status") or {}).get("remediations") or []
    return [r for r in rem if pod is None or r["pod"] == pod]


CHARGED = ("pending", "deleted", "evicted", "refused-by-pdb", "error", "failed", "pod-gone")


def _assert_each_pod_acted_on_once(env: Env, name: str) -> list[dict[str, Any]]:
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


def _metrics_answer(port: int) -> bool:
    with contextlib.suppress(Exception):
        return http_json(f"http://127.0.0.1:{port}/metrics", timeout=2)[0] == 200
    return False


def _epoch(stamp: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _operator_metric(port: int, needle: str) -> float:
    _, text = http_json(f"http://127.0.0.1:{port}/metrics")
    total = 0.0
    for line in str(text).splitlines():
        if line.startswith(needle):
            total += float(line.rsplit(" ", 1)[1])
    return total


WATCHDOG = {
    "stuckAfterSeconds": STUCK,
    "scrapeIntervalSeconds": INTERVAL,
    "action": "restart",
    "maxRemediations": 3,
    "budgetWindowSeconds": 600,
    "maxUnavailable": 1,
}


def test_injected_race_is_detected_restarted_replaced_and_traffic_recovers(env: Env) -> None:
    name = "race"
    _, port = _up(env, name, WATCHDOG, LEGACY_PREFILL)
    with Load(env, name, concurrency=4) as load:
        time.sleep(5)
        victim = env.live_ready_pods(name, contract.ROLE_PREFILL)[0]
        victim_name = victim["metadata"]["name"]
        born = _wedge(env, name, victim)
        rem = wait_for(
            "the victim's remediation",
            lambda: [r for r in _remediations(env, name, victim_name) if r["outcome"] == "deleted"],
            timeout=STUCK + 90,
        )[0]
        # detected within stuckAfterSeconds plus two scrape intervals (+2 s: status times are whole seconds)
        assert _epoch(rem["time"]) - born <= STUCK + 2 * INTERVAL + 2, (rem, born)
        assert rem["role"] == "prefill" and rem["action"] == "restart"
        assert "stuckAfterSeconds=20" in rem["reason"]
        wait_for(
            "the victim to be gone",
            lambda: victim_name not in [p["metadata"]["name"] for p in env.pods(name, contract.ROLE_PREFILL)],
            timeout=120,
        )
        wait_for(
            "a replacement prefill pod Ready",
            lambda: len(env.live_ready_pods(name, contract.ROLE_PREFILL)) == 2,
            timeout=240,
        )
        recovered_at = time.monotonic()
        wait_for("traffic to recover", lambda: load.ok_since(recovered_at) >= 20, timeout=120)
    reasons = {e["reason"] for e in env.events(name)}
    assert "WedgedPodRestarted" in reasons
    assert any(e["reason"] == "WedgedPodRestarted" for e in env.events(victim_name))
    assert _operator_metric(port, 'pdwarden_operator_remediations_total{action="restart"') >= 1
    _assert_each_pod_acted_on_once(env, name)


def test_sigstopped_decode_pod_is_found_unobserved_and_not_remediated_on_that_ground(env: Env) -> None:
    name = "stall"
    _, port = _up(env, name, WATCHDOG)
    from pdwarden_localcluster.cluster import layout

    victim = env.live_ready_pods(name, contract.ROLE_DECODE)[0]
    meta = victim["metadata"]
    pod_dir = layout().pods / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
    pid = json.loads(next(pod_dir.glob("*.pid")).read_text())["pid"]
    os.killpg(pid, signal.SIGSTOP)
    try:
        with Load(env, name, concurrency=2):
            wait_for(
                "the stalled decode pod reported unobserved",
                lambda: (
                    meta["name"]
                    in (env.dm(name).get("status") or {}).get("watchdog", {}).get("unobservedPods", [])
                ),
                timeout=4 * INTERVAL + 30,
            )
            assert _operator_metric(port, "pdwarden_operator_unobserved_pods{") >= 1
            assert _operator_metric(port, "pdwarden_operator_scrape_errors_total{") >= 1
            time.sleep(3 * INTERVAL)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGCONT)
    assert _remediations(env, name, meta["name"]) == []  # unobserved is never a ground for action


def test_heavy_healthy_load_with_deep_queues_takes_no_action(env: Env) -> None:
    name = "soak"
    # slow prefill compute between chunks and long prompts: requests pile up in flight. The
    # default stuckAfterSeconds (and the runtime's deadlines below it, hardening on): the
    # configuration a user gets must never act on a deep, moving queue.
    default = WatchdogSpec.model_validate({}).stuck_after_seconds
    _, port = _up(env, name, {**WATCHDOG, "stuckAfterSeconds": default}, ["--compute-ms", "10"])
    deepest = 0.0
    with Load(env, name, concurrency=12, prompt="s" * 600) as load:
        end = time.monotonic() + SOAK_SECONDS
        while time.monotonic() < end:
            for pod in env.live_ready_pods(name, contract.ROLE_PREFILL):
                with contextlib.suppress(Exception):
                    deepest = max(deepest, pod_metrics(pod)["inflight"])
            time.sleep(1)
        completed = len(load.ok)
    status = env.dm(name)["status"]
    assert completed > 0 and deepest >= 2, (completed, deepest)  # the load really queued work
    assert status.get("remediations") in (None, []), status.get("remediations")
    assert status["watchdog"]["wedgedPods"] == []
    assert _operator_metric(port, "pdwarden_operator_remediations_total{") == 0


def test_alert_action_only_reports(env: Env) -> None:
    name = "alert"
    _, port = _up(env, name, {**WATCHDOG, "action": "alert"}, LEGACY_PREFILL)
    with Load(env, name, concurrency=4):
        victim = env.live_ready_pods(name, contract.ROLE_PREFILL)[0]
        victim_name, victim_uid = victim["metadata"]["name"], victim["metadata"]["uid"]
        _wedge(env, name, victim)
        rem = wait_for("an alert", lambda: _remediations(env, name, victim_name), timeout=STUCK + 120)[0]
        assert (rem["action"], rem["outcome"]) == ("alert", "alerted")
        time.sleep(3 * INTERVAL)
    pods = {p["metadata"]["uid"]: p for p in env.pods(name, contract.ROLE_PREFILL)}
    assert victim_uid in pods and not pods[victim_uid]["metadata"].get("deletionTimestamp")
    status = env.dm(name)["status"]
    assert len(_remediations(env, name, victim_name)) == 1  # one alert per episode
    assert victim_name in status["watchdog"]["wedgedPods"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Wedged"]["status"] == "True"
    assert conditions["Degraded"]["status"] == "True" and conditions["Degraded"]["reason"] == "WedgedPods"
    assert any(e["reason"] == "PodWedged" for e in env.events(name))
    assert _operator_metric(port, "pdwarden_operator_wedged_pods{") >= 1
    assert status["watchdog"]["budget"]["used"] == 0


def _two_ready_prefill(env: Env, name: str) -> list[dict[str, Any]]:
    ready = env.live_ready_pods(name, contract.ROLE_PREFILL)
    return ready if len(ready) == 2 else []


def _with_outcome(env: Env, name: str, pod: str, outcome: str) -> list[dict[str, Any]]:
    return [r for r in _remediations(env, name, pod) if r["outcome"] == outcome]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_flapping_fault_exhausts_the_budget_and_stops(env: Env) -> None:
    name = "flap"
    _, port = _up(env, name, {**WATCHDOG, "maxRemediations": 2}, LEGACY_PREFILL)
    acted: list[str] = []
    with Load(env, name, concurrency=4):
        for round_no in range(3):
            ready = wait_for("2 ready prefill pods", lambda: _two_ready_prefill(env, name), timeout=240)
            victim = next(p for p in ready if p["metadata"]["name"] not in acted)
            acted.append(victim["metadata"]["name"])
            _wedge(env, name, victim)
            outcome = "deleted" if round_no < 2 else "skipped-budget"
            want = (acted[-1], outcome)
            wait_for(f"{want}", lambda: _with_outcome(env, name, *want), timeout=STUCK + 150)  # noqa: B023
        time.sleep(3 * INTERVAL)
    status = env.dm(name)["status"]
    last = acted[-1]
    assert last in [p["metadata"]["name"] for p in env.pods(name, "prefill")]  # not touched
    assert status["watchdog"]["budget"]["used"] == 2 and status["watchdog"]["budgetExhausted"] is True
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "RemediationBudgetExhausted")
    assert any(e["reason"] == "RemediationBudgetExhausted" for e in env.events(name))
    assert _operator_metric(port, "pdwarden_operator_remediation_budget_exhausted{") == 1
    deleted = [r for r in _remediations(env, name) if r["outcome"] == "deleted"]
    assert len(deleted) == 2


def test_leader_killed_during_a_remediation_the_standby_finishes_it_once(env: Env) -> None:
    """The leader is killed from outside (SIGKILL) as soon as its intent is persisted, before
    or after it touched the pod: the standby takes the Lease and finishes that remediation
    (resumes a pending one, settles a performed one), never repeats it."""
    name = "crash"
    first, _ = _up(env, name, WATCHDOG, LEGACY_PREFILL)
    env.start_operator()  # the standby: waits for the Lease
    # No background load: until the runtime exports the per-state age, a stuck room among
    # progressing ones is not a wedge (the progress clause alone judges); idle peers make it one.
    before = {p["metadata"]["name"] for p in env.pods(name, "prefill")}
    victim = env.live_ready_pods(name, contract.ROLE_PREFILL)[0]
    victim_name = victim["metadata"]["name"]
    _wedge(env, name, victim)
    wait_for(
        "the remediation's intent",
        lambda: [
            f for f in env.dm(name)["status"]["watchdog"].get("inFlight") or [] if f["pod"] == victim_name
        ],
        timeout=STUCK + 120,
        every=0.2,
    )
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    rem = wait_for(
        "the remediation finished by the standby",
        lambda: [r for r in _remediations(env, name, victim_name) if r["outcome"] in ("deleted", "pod-gone")],
        timeout=120,
    )
    assert len(rem) == 1
    wait_for(
        "a replacement prefill pod Ready and nothing in flight",
        lambda: (
            len(env.live_ready_pods(name, "prefill")) == 2
            and not env.dm(name)["status"]["watchdog"].get("inFlight")
        ),
        timeout=240,
    )
    after = {p["metadata"]["name"] for p in env.pods(name, "prefill")}
    charged = _assert_each_pod_acted_on_once(env, name)
    prefill_acted = [r for r in charged if r["role"] == "prefill"]
    # one replacement per prefill remediation: the deletion happened once, not twice
    assert len(after - before) == len(prefill_acted), (before, after, charged)
    assert len(_remediations(env, name, victim_name)) == 1

"""Start, watch and stop synthetic runtime processes (and SGLang's router, smg) on loopback.

Used by the transfer/abort-storm benchmarks and the integration tests: every process is
a real ``pdwarden runtime serve`` (or ``python -m smg.launch_router``, with the retry and
circuit-breaker settings the operator renders) in its own session, so a test can SIGSTOP
one and stopping kills its whole tree.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pdwarden_contract as contract
from pdwarden_localcluster.waits import wait_for
from pdwarden_operator.render.router import ROUTER_HEALTH_ARGS, ROUTER_MODULE, ROUTER_RESILIENCE_ARGS
from pdwarden_runtime.router_gate import control_plane_key, router_command
from pdwarden_runtime.worker_key import auth_headers, read_key_file
from pdwarden_testkit.ports import free_port

# A small KV geometry for `pdwarden runtime serve`: two layers of 64 KiB pages, 16 tokens a
# page, chunks of two pages; enough pool and aux slots for tens of concurrent rooms.
SMALL_KV: dict[str, object] = {
    "layers": 2,
    "page_bytes": 65536,
    "pool_pages": 256,
    "aux_slots": 256,
    "page_size": 16,
    "chunk_pages": 2,
}


def serve_flags(**options: object) -> list[str]:
    """`pdwarden runtime serve` flags: SMALL_KV with `options` over it (`pool_pages=512` is
    `--pool-pages 512`; True is a bare flag, such as `allow_fault_injection=True`)."""
    flags: list[str] = []
    for name, value in {**SMALL_KV, **options}.items():
        flag = "--" + name.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    return flags


def http_get(url: str, timeout: float = 5.0, headers: dict[str, str] | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers or {}), timeout=timeout
        ) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as err:
        return 0, str(err)


def http_post_json(
    url: str, body: Any, timeout: float = 10.0, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def http_status(
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    data: bytes | None = None,
    timeout: float = 60.0,
) -> int:
    """The status of one request (`body` as JSON, or raw `data`); 0 when nothing answered."""
    payload = data if data is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(
        url, data=payload, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except (urllib.error.URLError, OSError):
        return 0


# smg 1.13.0's control plane and the admin routes it would fan out to the workers, as a client of
# a model's router (with or without a key) tried them: registering a worker of its own choosing,
# listing and removing the model's, reading loads, flushing caches, profiling, SGLang's admin
# routes, and a path spelled to look like a served one.
CONTROL_PLANE_REQUESTS: tuple[tuple[str, str, Any], ...] = (
    ("GET", "/workers", None),
    ("POST", "/workers", {"url": "http://198.18.255.1:8080", "worker_type": "decode"}),
    ("DELETE", "/workers/any", None),
    ("GET", "/get_loads", None),
    ("POST", "/flush_cache", {}),
    ("POST", "/start_profile", {}),
    ("POST", "/stop_profile", {}),
    ("GET", "/get_server_info", None),
    ("POST", "/update_weights_from_disk", {"model_path": "/tmp"}),
    ("POST", "/configure_logging", {"log_requests": True}),
    ("POST", "/abort_request", {"rid": "x"}),
    ("GET", "/generate/../workers", None),
)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def stop(self, grace: float = 5.0) -> None:
        if not self.alive():
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(grace)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait(5)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Runtime:
    role: str
    host: str
    port: int
    bootstrap_port: int
    metrics_port: int
    proc: Proc
    # The model's worker key the runtime requires (None: it takes requests without one).
    worker_key: str | None = None
    # Starts it again on fresh ports, in place (see ``wait_healthy``).
    respawn: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    @property
    def headers(self) -> dict[str, str]:
        """What the model's router sends it: the worker key, when it requires one."""
        return auth_headers(self.worker_key)

    def state(self) -> dict[str, Any]:
        status, text = http_get(f"{self.url}/debug/state", headers=self.headers)
        if status != 200:
            raise RuntimeError(f"{self.role} /debug/state answered {status}: {text[:200]}")
        result: dict[str, Any] = json.loads(text)
        return result

    def metrics(self) -> str:
        status, text = http_get(self.metrics_url)
        if status != 200:
            raise RuntimeError(f"{self.role} metrics answered {status}")
        return text


def _python_bin() -> str:
    return sys.executable


def pdwarden_argv(*args: str) -> list[str]:
    """`pdwarden ARGS` as this checkout's Python runs it."""
    return [_python_bin(), "-c", "from pdwarden_cli.main import main; main()", *args]


def spawn(name: str, argv: Sequence[str], log_dir: Path, env: dict[str, str] | None = None) -> Proc:
    log_path = log_dir / f"{name}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - handed to the child
    popen = subprocess.Popen(
        list(argv),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    log.close()
    return Proc(name, popen, log_path)


def start_runtime(
    role: str,
    log_dir: Path,
    *,
    host: str = "127.0.0.1",
    extra: Sequence[str] = (),
    bootstrap_port: int | None = None,
    env: dict[str, str] | None = None,
    worker_key_file: Path | None = None,
) -> Runtime:
    flag = contract.ServeFlag
    key_flags = [] if worker_key_file is None else [flag.WORKER_KEY_FILE, str(worker_key_file)]

    def launch() -> tuple[int, int, int, Proc]:
        port, metrics_port = free_port(host), free_port(host)
        boot = bootstrap_port or free_port(host)
        argv = [
            *pdwarden_argv(*contract.SERVE_COMMAND[1:]),
            *(flag.ROLE, role, flag.ENGINE, "synthetic", flag.HOST, host, flag.PORT, str(port)),
            *(flag.BOOTSTRAP_PORT, str(boot), flag.METRICS_PORT, str(metrics_port)),
            *key_flags,
            *extra,
        ]
        return port, boot, metrics_port, spawn(f"{role}-{port}", argv, log_dir, env)

    port, boot, metrics_port, proc = launch()
    key = None if worker_key_file is None else read_key_file(worker_key_file)
    rt = Runtime(role, host, port, boot, metrics_port, proc, worker_key=key)

    def respawn() -> None:
        # the same Proc object, so a Fleet that holds it stops the new process
        rt.port, rt.bootstrap_port, rt.metrics_port, fresh = launch()
        rt.proc.name, rt.proc.popen, rt.proc.log_path = fresh.name, fresh.popen, fresh.log_path

    rt.respawn = respawn
    return rt


# A port binds when free_port chooses it, but on a shared machine another process may take it
# before the runtime (seconds of imports later) binds it; the runtime then exits at start.
PORT_TAKEN = "address already in use"
PORT_TAKEN_RETRIES = 3


def wait_healthy(runtimes: Sequence[Runtime], timeout: float = 180.0) -> None:
    """Until every runtime answers /health; a runtime that exits meanwhile fails at once, unless
    one of its ports was taken before it bound it: it then starts again on fresh ports."""
    respawned = [0] * len(runtimes)

    def all_healthy() -> bool:
        for i, rt in enumerate(runtimes):
            if rt.proc.alive():
                continue
            tail = rt.proc.log_tail()
            if PORT_TAKEN in tail and rt.respawn is not None and respawned[i] < PORT_TAKEN_RETRIES:
                respawned[i] += 1
                rt.respawn()
                continue
            raise RuntimeError(f"{rt.role} runtime exited early:\n{tail}")
        return all(http_get(f"{rt.url}/health", timeout=2)[0] == 200 for rt in runtimes)

    wait_for(all_healthy, timeout, f"runtimes {[rt.role for rt in runtimes]} to be healthy", 0.5)


@dataclass
class Router:
    host: str
    port: int
    proc: Proc
    metrics_port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        """smg's own metrics (its --prometheus-port)."""
        return f"http://{self.host}:{self.metrics_port}/metrics"


def start_router(
    prefills: Sequence[Runtime],
    decodes: Sequence[Runtime],
    log_dir: Path,
    host: str = "127.0.0.1",
    python: str | None = None,
    module: str = ROUTER_MODULE,
    worker_key_file: Path | None = None,
    api_key: str | None = None,
    gated: bool | None = None,
    discovery: bool = False,
    served_model_name: str | None = None,
    health_args: Sequence[str] = ROUTER_HEALTH_ARGS,
) -> Router:
    """SGLang's router over static workers, with the operator's retry and breaker settings
    (``python``/``module``: another router installation, to compare one with the project's);
    ``gated`` (the default with ``worker_key_file`` or ``served_model_name``): behind
    ``pdwarden runtime router``'s gate as the operator runs it, presenting ``worker_key_file``'s
    key when given and naming ``served_model_name`` in a native /generate body that names none;
    with ``api_key``, smg's own ``--api-key`` alone (its clients must then present it).
    ``discovery``: the workers come from smg's discovery (its file provider, a manifest naming
    them) with the operator's health settings (``health_args``), as in the cluster: smg switches
    on its multi-model mode (IGW) under any discovery, and routes by model."""
    gated = (worker_key_file is not None or served_model_name is not None) if gated is None else gated
    port = free_port(host)
    metrics_port = free_port(host)
    smg_port = free_port("127.0.0.1") if gated else port
    workers: list[str] = []
    if discovery:
        manifest = log_dir / f"router-{port}-workers.json"
        entries: list[dict[str, Any]] = [
            {"url": p.url, "worker_type": "prefill", "bootstrap_port": p.bootstrap_port} for p in prefills
        ]
        entries += [{"url": d.url, "worker_type": "decode"} for d in decodes]
        manifest.write_text(json.dumps({"version": 1, "workers": entries}))
        workers += ["--discovery-provider", "file", "--discovery-file", str(manifest), *health_args]
    else:
        for prefill in prefills:
            workers += ["--prefill", prefill.url, str(prefill.bootstrap_port)]
        for decode in decodes:
            workers += ["--decode", decode.url]
    argv = [
        python or _python_bin(),
        "-m",
        module,
        "--pd-disaggregation",
        *workers,
        "--host",
        "127.0.0.1" if gated else host,
        "--port",
        str(smg_port),
        "--prometheus-port",
        str(metrics_port),
        "--log-level",
        "warn",
        "--worker-startup-check-interval",
        "1",
        *ROUTER_RESILIENCE_ARGS,
    ]
    if api_key is not None:
        argv = router_command(argv, api_key, control_plane_key())  # the gate's own way of giving smg keys
    if gated:
        gate = pdwarden_argv("runtime", "router", "--host", host, "--port", str(port))
        gate += ["--router-port", str(smg_port)]
        if worker_key_file is not None:
            gate += ["--worker-key-file", str(worker_key_file)]
        if served_model_name is not None:
            gate += ["--served-model-name", served_model_name]
        argv = [*gate, "--", *argv]
    return Router(host, port, spawn(f"router-{port}", argv, log_dir), metrics_port)


def wait_router(router: Router, timeout: float = 180.0, headers: dict[str, str] | None = None) -> None:
    """Until a real PD request through the router succeeds."""
    body = {"text": "router warm-up", "sampling_params": {"max_new_tokens": 1}}

    def routes() -> bool:
        if not router.proc.alive():
            raise RuntimeError(f"router exited early:\n{router.proc.log_tail()}")
        return http_post_json(f"{router.url}/generate", body, timeout=10, headers=headers)[0] == 200

    wait_for(routes, timeout, f"the router at {router.url} to route a request", 1.0)


@dataclass
class Fleet:
    """Processes a test or benchmark started; ``stop()`` (or leaving ``with``) ends them all."""

    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="pdwarden-rt-")))
    procs: list[Proc] = field(default_factory=list)

    def runtime(self, role: str, **kwargs: Any) -> Runtime:
        rt = start_runtime(role, self.log_dir, **kwargs)
        self.procs.append(rt.proc)
        return rt

    def router(
        self,
        prefills: Sequence[Runtime],
        decodes: Sequence[Runtime],
        python: str | None = None,
        module: str = ROUTER_MODULE,
        worker_key_file: Path | None = None,
        api_key: str | None = None,
        gated: bool | None = None,
        discovery: bool = False,
        served_model_name: str | None = None,
        health_args: Sequence[str] = ROUTER_HEALTH_ARGS,
    ) -> Router:
        router = start_router(
            prefills,
            decodes,
            self.log_dir,
            python=python,
            module=module,
            worker_key_file=worker_key_file,
            api_key=api_key,
            gated=gated,
            discovery=discovery,
            served_model_name=served_model_name,
            health_args=health_args,
        )
        self.procs.append(router.proc)
        return router

    def stop(self, grace: float = 5.0) -> None:
        """Every process told to stop at once, then waited for (SIGKILL after `grace`): a
        fleet's stop takes one grace, not one per process."""
        alive = [proc for proc in self.procs if proc.alive()]
        for proc in alive:
            proc.signal(signal.SIGCONT)
            proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in alive:
            proc.stop(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so ``finally: fleet.stop()`` runs (no orphans)."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def new_key_file(directory: Path) -> Path:
    """A fresh worker key in `directory`, as the operator's Secret mounts it (one line, read-only)."""
    path = directory / contract.WORKER_KEY_SECRET_KEY
    path.write_text(secrets.token_urlsafe(32) + "\n")  # a Secret's file may end in a newline
    path.chmod(0o400)
    return path

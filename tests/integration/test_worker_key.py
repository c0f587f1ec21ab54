"""The model's worker key for real: synthetic workers that require it, and SGLang's router (smg)
behind `pdwarden runtime router`'s gate, which presents it for clients that hold none.

What a stranger without the key gets from a worker (401 on every path but /health* and
/metrics), what the router's clients get (answers, with or without an Authorization header of
their own), and that a client that leaves still ends both legs through the gate.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import pdwarden_contract as c
from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.runtime_procs import (
    CONTROL_PLANE_REQUESTS,
    Fleet,
    Router,
    Runtime,
    http_get,
    http_post_json,
    http_status,
    new_key_file,
    pdwarden_argv,
    serve_flags,
    wait_healthy,
    wait_router,
)

pytestmark = pytest.mark.integration

FLAGS = serve_flags(allow_fault_injection=True, inflight_deadline=60)


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return new_key_file(tmp_path_factory.mktemp("worker-key"))


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with Fleet() as f:
        yield f


@pytest.fixture(scope="module")
def workers(fleet: Fleet, key_file: Path) -> tuple[Runtime, Runtime]:
    prefill = fleet.runtime(c.ROLE_PREFILL, extra=FLAGS, worker_key_file=key_file)
    decode = fleet.runtime(c.ROLE_DECODE, extra=FLAGS, worker_key_file=key_file)
    wait_healthy([prefill, decode], timeout=300)
    return prefill, decode


@pytest.fixture(scope="module")
def router(fleet: Fleet, workers: tuple[Runtime, Runtime], key_file: Path) -> Router:
    prefill, decode = workers
    r = fleet.router([prefill], [decode], worker_key_file=key_file)
    wait_router(r, timeout=240)
    return r


def _pd_body(prefill: Runtime) -> dict[str, Any]:
    return {
        "text": "a stranger's request",
        "sampling_params": {"max_new_tokens": 2},
        "bootstrap_host": prefill.host,
        "bootstrap_port": prefill.bootstrap_port,
        "bootstrap_room": random.getrandbits(62),
    }


def test_a_worker_refuses_every_path_but_health_and_metrics_without_the_key(
    workers: tuple[Runtime, Runtime],
) -> None:
    prefill, decode = workers
    wrong = {"Authorization": "Bearer " + "x" * 43}
    for rt in workers:
        for path in ("/debug/state", "/get_server_info", "/get_model_info", "/v1/models"):
            assert http_get(f"{rt.url}{path}")[0] == 401, path
            assert http_get(f"{rt.url}{path}", headers=wrong)[0] == 401, path
            assert http_get(f"{rt.url}{path}", headers=rt.headers)[0] == 200, path
        for path in (c.HEALTH_PATH, c.METRICS_PATH):
            assert http_get(f"{rt.url}{path}")[0] == 200, path
        assert http_get(rt.metrics_url)[0] == 200  # the metrics port: the watchdog's scrape
    # a PD request naming the prefill as its peer, and a fault, without the key: refused
    status, answer = http_post_json(f"{decode.url}{c.GENERATE_PATH}", _pd_body(prefill))
    assert status == 401, answer
    assert "router" in str(answer)
    assert http_post_json(f"{prefill.url}{c.FAULT_PATH}", {"fault": c.FAULT_STALL})[0] == 401
    # nothing reached the engines: no room was opened on either side
    assert decode.state()["rooms"] == {} and prefill.state()["rooms"] == {}
    assert http_post_json(
        f"{prefill.url}{c.FAULT_PATH}", {"fault": c.FAULT_NONE}, headers=prefill.headers
    ) == (
        200,
        {"fault": c.FAULT_NONE},
    )


def test_clients_of_the_router_need_no_key_and_their_own_header_is_replaced(
    router: Router, workers: tuple[Runtime, Runtime]
) -> None:
    _, decode = workers
    before = decode.state()["completed"]
    body = {"text": "through the gate", "sampling_params": {"max_new_tokens": 2}}
    for headers in ({}, {"Authorization": "Bearer a-client-token-of-its-own"}):
        status, answer = http_post_json(f"{router.url}{c.GENERATE_PATH}", body, timeout=30, headers=headers)
        assert status == 200, answer
        assert answer["meta_info"]["kv_verified"] is True
    assert decode.state()["completed"] - before == 2
    assert http_get(f"{router.url}/liveness")[0] == 200


async def _cancel_some(router: Router, n: int, seed: int) -> tuple[int, int]:
    rng = random.Random(seed)
    completed = aborted = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def one() -> None:
            nonlocal completed, aborted
            body = {
                "input_ids": [rng.randrange(32000) for _ in range(rng.randint(40, 160))],
                "sampling_params": {"max_new_tokens": 4},
            }
            task = asyncio.ensure_future(session.post(f"{router.url}{c.GENERATE_PATH}", json=body))
            done, _ = await asyncio.wait([task], timeout=rng.uniform(0.0, 0.1))
            if not done:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                aborted += 1
                return
            async with task.result() as resp:
                assert resp.status == 200, await resp.text()
                completed += 1

        await asyncio.gather(*(one() for _ in range(n)))
    return completed, aborted


def test_a_client_that_leaves_through_the_gate_ends_both_legs(
    router: Router, workers: tuple[Runtime, Runtime]
) -> None:
    completed, aborted = asyncio.run(_cancel_some(router, 40, seed=7))
    assert completed + aborted == 40 and aborted > 0

    def settled() -> bool:
        return all(rt.state()["pending_requests"] == 0 and rt.state()["rooms"] == {} for rt in workers)

    wait_for(settled, 60, "both workers to hold no request and no room", 0.5)
    for rt in workers:
        state = rt.state()
        assert state["free_pages"] == state["total_pages"], state


SERVE = pdwarden_argv("runtime", "serve")


def test_a_worker_will_not_start_on_an_unusable_key_file(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text("tooshort")
    cases = {tmp_path / "missing": "cannot read", short: "at least 16"}
    for path, why in cases.items():
        proc = subprocess.run(
            [*SERVE, "--role", c.ROLE_DECODE, "--host", "127.0.0.1", "--worker-key-file", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2, proc.stderr
        assert "--worker-key-file" in proc.stderr and why in proc.stderr, proc.stderr


def test_the_router_gate_benchmark_answers_every_request_in_both_arms() -> None:
    from pdwarden_bench.gate_cost import run

    result = run(rounds=1, requests=20, concurrency=2, seed=1)
    for arm in ("direct", "gated"):
        assert result[arm]["requests_failed"] == 0, result
        assert (
            result[arm]["requests_per_second"] > 0
            and result[arm]["latency_p99_ms"] >= result[arm]["latency_p50_ms"]
        )
    assert (
        result["gated_over_direct_rps_min"]
        <= result["gated_over_direct_rps"]
        <= result["gated_over_direct_rps_max"]
    )


def test_no_client_reaches_smgs_control_plane_with_or_without_the_key(
    fleet: Fleet, router: Router, workers: tuple[Runtime, Runtime], key_file: Path
) -> None:
    key = key_file.read_text().strip()
    for headers in ({}, {"Authorization": f"Bearer {key}"}):
        for method, path, body in CONTROL_PLANE_REQUESTS:
            assert http_status(method, f"{router.url}{path}", body, headers) == 403, (method, path, headers)
    # the data plane still answers, and smg still has exactly the model's two workers
    body = {"text": "after the attempts", "sampling_params": {"max_new_tokens": 2}}
    assert http_post_json(f"{router.url}{c.GENERATE_PATH}", body, timeout=30)[0] == 200
    assert http_get(f"{router.url}/v1/models")[0] == 200
    # a router of a model without the key is gated the same way
    keyless = fleet.router(list(workers[:1]), list(workers[1:]), gated=True)
    wait_for(lambda: http_get(f"{keyless.url}/liveness")[0] == 200, 120, "the keyless router to start", 1.0)
    for method, path, body in CONTROL_PLANE_REQUESTS:
        assert http_status(method, f"{keyless.url}{path}", body) == 403, (method, path)


def _router_rss_mib(router: Router) -> float:
    """The gate's and smg's resident memory together (smg is the gate's child)."""
    import psutil

    gate = psutil.Process(router.proc.pid)
    return sum(p.memory_info().rss for p in [gate, *gate.children(recursive=True)]) / 2**20


async def _uploads(router: Router, n: int, size: int) -> tuple[dict[int, int], list[int], float]:
    """`n` uploads of `size` bytes at once, and small requests beside them: (each upload's status
    counted, the small requests' statuses, the router's highest RSS seen in MiB)."""
    prompt = b'{"text": "' + b"a" * (size - 64) + b'", "sampling_params": {"max_new_tokens": 1}}'
    small = {"text": "beside the uploads", "sampling_params": {"max_new_tokens": 1}}
    statuses: dict[int, int] = {}
    smalls: list[int] = []
    peak = 0.0
    done = asyncio.Event()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def upload() -> None:
            headers = {"Content-Type": "application/json"}
            async with session.post(f"{router.url}{c.GENERATE_PATH}", data=prompt, headers=headers) as resp:
                await resp.read()
                statuses[resp.status] = statuses.get(resp.status, 0) + 1

        async def watch() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, _router_rss_mib(router))
                async with session.post(f"{router.url}{c.GENERATE_PATH}", json=small) as resp:
                    smalls.append(resp.status)
                await asyncio.sleep(0.2)

        watcher = asyncio.ensure_future(watch())
        await asyncio.gather(*(upload() for _ in range(n)))
        done.set()
        await watcher
    return statuses, smalls, peak


def test_forty_parallel_64_mib_uploads_leave_the_router_serving_within_its_memory(router: Router) -> None:
    from pdwarden_runtime.router_gate import MAX_BODY_BYTES

    statuses, smalls, peak = asyncio.run(_uploads(router, 40, MAX_BODY_BYTES))
    assert sum(statuses.values()) == 40, statuses  # every upload answered: no connection dropped
    # answered (400: a prompt over the model's context), or refused for now (503, Retry-After)
    assert set(statuses) <= {200, 400, 503}, statuses
    assert smalls and all(s == 200 for s in smalls), smalls
    # the router pod's limit is 2 GiB: the gate lets through a bounded share of bodies at once
    assert peak < 1536, f"the router held {peak:.0f} MiB"
    assert router.proc.alive()
    over = b"a" * (MAX_BODY_BYTES + 1)
    assert http_status("POST", f"{router.url}{c.GENERATE_PATH}", data=over) == 413


async def _load_through_a_stop(router: Router, after_stop: float) -> tuple[list[int], list[str], list[int]]:
    """Short requests from 4 clients, and the gate stopped (SIGTERM to its process group, as a
    kubelet stops a container) while they run; the clients go on for `after_stop` seconds (a
    Service's endpoints take a moment to drop a stopping pod), within the gate's drain:
    (statuses, errors, readiness statuses seen while draining)."""
    body = {"text": "through a stop", "sampling_params": {"max_new_tokens": 2}}
    statuses: list[int] = []
    errors: list[str] = []
    readiness: list[int] = []
    sending = True
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def client() -> None:
            while sending:
                try:
                    async with session.post(f"{router.url}{c.GENERATE_PATH}", json=body) as resp:
                        await resp.read()
                        statuses.append(resp.status)
                except aiohttp.ClientError as err:
                    errors.append(repr(err))

        async def stop() -> None:
            nonlocal sending
            await asyncio.sleep(1.0)
            os.killpg(router.proc.pid, signal.SIGTERM)
            await asyncio.sleep(0.3)  # the signal handled
            deadline = asyncio.get_running_loop().time() + after_stop
            while asyncio.get_running_loop().time() < deadline:
                async with session.get(f"{router.url}/readiness") as resp:
                    readiness.append(resp.status)
                await asyncio.sleep(0.5)
            sending = False

        await asyncio.gather(stop(), *(client() for _ in range(4)))
    return statuses, errors, readiness


def test_a_stopping_router_fails_no_request_it_accepted(
    fleet: Fleet, workers: tuple[Runtime, Runtime], key_file: Path
) -> None:
    prefill, decode = workers
    stopping = fleet.router([prefill], [decode], worker_key_file=key_file)
    wait_router(stopping, timeout=240)
    statuses, errors, readiness = asyncio.run(_load_through_a_stop(stopping, c.TERMINATION_DRAIN_S / 2))
    # served on through the drain (smg alive all along: no 502), each connection closed after
    # its answer, readiness 503 from the first moment
    assert statuses and set(statuses) == {200}, statuses
    assert not errors, errors[:5]
    assert readiness and set(readiness) == {503}, readiness
    wait_for(lambda: not stopping.proc.alive(), 40, "the gate to exit", 0.5)
    assert http_get(f"{stopping.url}/liveness")[0] == 0  # nothing listens there any more
    assert stopping.proc.popen.returncode == 0

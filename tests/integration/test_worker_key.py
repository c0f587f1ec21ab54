"""The model's worker key for real: synthetic workers that require it, and SGLang's router (smg)
behind `pdwarden runtime router`'s gate, which presents it for clients that hold none.

What a stranger without the key gets from a worker (401 on every path but /health* and
/metrics), what the router's clients get (answers, with or without an Authorization header of
their own), and that a client that leaves still ends both legs through the gate.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import pdwarden_contract as c
from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.runtime_procs import (
    Fleet,
    Router,
    Runtime,
    http_get,
    http_post_json,
    pdwarden_argv,
    serve_flags,
    wait_healthy,
    wait_router,
)

pytestmark = pytest.mark.integration

FLAGS = serve_flags(allow_fault_injection=True, inflight_deadline=60)


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("worker-key") / c.WORKER_KEY_SECRET_KEY
    path.write_text(secrets.token_urlsafe(32) + "\n")  # a Secret's file may end in a newline
    path.chmod(0o400)
    return path


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

"""SGLang's router (smg) as the cluster runs it: workers from its discovery, behind the gate.

smg switches on its multi-model mode (IGW) whenever it discovers its workers (Kubernetes in the
cluster; here its file provider, the same switch in smg's launcher), and there routes by model:
a native `/generate` that names none is refused (400 `missing_model`) unless the gate names the
model's served name in it, and a model smg does not serve gets OpenAI's 404. And smg, with the
operator's health settings, keeps a worker that stops answering for a while: the pods' readiness
and the watchdog decide, not smg's own checks.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pdwarden_contract as c
from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.runtime_procs import (
    Fleet,
    Router,
    Runtime,
    http_get,
    http_post_json,
    new_key_file,
    serve_flags,
    wait_healthy,
    wait_router,
)

pytestmark = pytest.mark.integration

MODEL = "team/served-name"
FLAGS = serve_flags(model=MODEL)
# smg's health checks as tight as they go, removal on: a control that takes a stopped worker out.
EAGER_HEALTH = (
    "--health-check-interval-secs",
    "1",
    "--health-check-timeout-secs",
    "1",
    "--health-failure-threshold",
    "1",
    "--remove-unhealthy-workers",
)


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
    r = fleet.router([prefill], [decode], worker_key_file=key_file, discovery=True, served_model_name=MODEL)
    wait_router(r, timeout=240)  # its warm-up body names no model
    return r


def _generate(router: Router, **fields: Any) -> tuple[int, Any]:
    body = {"text": "which model?", "sampling_params": {"max_new_tokens": 2}, **fields}
    return http_post_json(f"{router.url}{c.GENERATE_PATH}", body, timeout=30)


def _error_code(answer: Any) -> str:
    return str(json.loads(answer)["error"]["code"])


def test_a_generate_body_without_a_model_reaches_the_model_and_an_unknown_model_gets_404(
    router: Router,
) -> None:
    for fields in ({}, {"model": MODEL}):
        status, answer = _generate(router, **fields)
        assert status == 200, (fields, answer)
        assert answer["meta_info"]["kv_verified"] is True
    status, answer = _generate(router, model="another-model")
    assert status == 404 and _error_code(answer) == "model_not_found", answer
    chat = {"model": "another-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    status, answer = http_post_json(f"{router.url}/v1/chat/completions", chat, timeout=30)
    assert status == 404 and _error_code(answer) == "model_not_found", answer
    assert json.loads(http_get(f"{router.url}/v1/models")[1])["data"][0]["id"] == MODEL


def test_without_the_gates_name_smg_under_discovery_refuses_a_generate_naming_no_model(
    fleet: Fleet, workers: tuple[Runtime, Runtime], key_file: Path
) -> None:
    """The control: this is the mode the cluster's smg runs in, and what the gate's name is for."""
    prefill, decode = workers
    bare = fleet.router([prefill], [decode], worker_key_file=key_file, discovery=True)
    wait_for(lambda: _generate(bare, model=MODEL)[0] == 200, 240, "the control router to route", 1.0)
    status, answer = _generate(bare)
    assert status == 400 and _error_code(answer) == "missing_model", answer
    bare.proc.stop()


def _workers_of(router: Router) -> tuple[int, int]:
    """(healthy, total) workers smg holds, from its readiness answer."""
    status, text = http_get(f"{router.url}/readiness", timeout=5)
    if status not in (200, 503):
        return -1, -1
    answer = json.loads(text)
    return int(answer.get("healthy_workers", 0)), int(answer.get("total_workers", 0))


def test_a_worker_that_stops_answering_for_a_while_stays_in_the_router(
    fleet: Fleet, router: Router, workers: tuple[Runtime, Runtime], key_file: Path
) -> None:
    """A stopped decode (SIGSTOP: alive, answering nothing, as on a starved node) stays healthy
    in the router with the operator's settings and serves at once when it runs again; smg with its
    checks tight and removal on (the control) takes it out meanwhile."""
    prefill, decode = workers
    eager = fleet.router(
        [prefill],
        [decode],
        worker_key_file=key_file,
        discovery=True,
        served_model_name=MODEL,
        health_args=EAGER_HEALTH,
    )
    wait_router(eager, timeout=240)
    assert _workers_of(router) == _workers_of(eager) == (2, 2)
    decode.proc.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: _workers_of(eager)[0] < 2, 30, "the control router to drop the stopped decode", 0.5)
        time.sleep(2)
        assert _workers_of(router) == (2, 2)
    finally:
        decode.proc.signal(signal.SIGCONT)
    status, answer = _generate(router)
    assert status == 200, answer
    eager.proc.stop()

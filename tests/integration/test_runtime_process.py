"""A synthetic runtime process as a node sees it: idle, it leaves the CPU to others; told to stop,
it serves on (unhealthy) for the drain, and with a request wedged it still exits inside a pod's
termination grace period."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import pytest

import pdwarden_contract as c
from pdwarden_localcluster import procs
from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.runtime_procs import Fleet, Runtime, http_get, http_post_json, wait_healthy

pytestmark = pytest.mark.integration

POD_GRACE_S = 30  # the operator's terminationGracePeriodSeconds for runtime pods


@pytest.fixture
def prefill() -> Iterator[Runtime]:
    with Fleet() as fleet:
        rt = fleet.runtime(c.ROLE_PREFILL)
        wait_healthy([rt], timeout=300)
        yield rt


def test_an_idle_runtime_does_not_keep_a_core_busy(prefill: Runtime) -> None:
    # NIXL's progress thread polls with a zero timeout unless told otherwise: a whole core
    before, t0 = procs.cpu_seconds(prefill.proc.pid), time.monotonic()
    time.sleep(5)
    used = (procs.cpu_seconds(prefill.proc.pid) - before) / (time.monotonic() - t0)
    assert used < 0.3, f"an idle runtime used {used:.2f} of a core"


def test_sigterm_with_a_wedged_request_exits_inside_the_grace_period(prefill: Runtime) -> None:
    # a prefill request whose decode never comes waits for it (here: far longer than the grace)
    body = {
        "text": "never answered",
        "sampling_params": {"max_new_tokens": 4},
        "bootstrap_host": prefill.host,
        "bootstrap_port": prefill.bootstrap_port,
        "bootstrap_room": 4_242_424,
    }
    answers: list[object] = []

    def hold() -> None:
        try:
            answers.append(http_post_json(f"{prefill.url}/generate", body, timeout=3 * POD_GRACE_S)[0])
        except OSError as err:  # the process closed the connection as it exited
            answers.append(err)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    wait_for(lambda: prefill.state()["pending_requests"] >= 1, 30, "the request in flight", 0.2)
    t0 = time.monotonic()
    prefill.proc.signal(signal.SIGTERM)
    wait_for(lambda: not prefill.proc.alive(), POD_GRACE_S - 5, "the runtime's exit after SIGTERM", 0.2)
    assert prefill.proc.popen.returncode == 0, prefill.proc.log_tail()
    assert time.monotonic() - t0 < POD_GRACE_S - 5
    holder.join(10)
    # the request was ended (the connection closed, or an error answer), not left hanging
    assert answers, "the wedged request was still open after the process exited"
    assert isinstance(answers[0], OSError) or answers[0] != 200, answers


def test_sigterm_leaves_the_runtime_serving_but_unhealthy_for_the_drain(prefill: Runtime) -> None:
    """The router drops a terminating pod about a second after its deletion: until then the pod
    must still answer, and its /health says it is stopping."""
    prefill.proc.signal(signal.SIGTERM)
    t0 = time.monotonic()
    wait_for(
        lambda: http_get(f"{prefill.url}{c.HEALTH_PATH}", timeout=2) == (503, "stopping"),
        3,
        "/health 503",
        0.1,
    )
    status, _ = http_get(f"{prefill.url}/get_server_info", timeout=2)
    assert status == 200 and prefill.proc.alive()
    assert time.monotonic() - t0 < c.TERMINATION_DRAIN_S
    wait_for(lambda: not prefill.proc.alive(), POD_GRACE_S - 5, "the runtime's exit after the drain", 0.2)
    assert time.monotonic() - t0 >= c.TERMINATION_DRAIN_S
    assert prefill.proc.popen.returncode == 0, prefill.proc.log_tail()

"""Multi-node replicas of the synthetic engine, as real processes over real TCP.

A prefill replica of two ranks: the leader refuses readiness until its worker joined, then
serves the PD path behind the real router (smg); a rank that disappears fails the leader
(as SGLang does when a tensor-parallel peer dies) and a worker fails when its leader goes.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.ports import free_port
from pdwarden_testkit.runtime_procs import Fleet, Runtime, http_get, wait_healthy, wait_router

pytestmark = pytest.mark.integration

ENV = {"UCX_TLS": "tcp,self"}
SMALL = ["--layers", "2", "--page-bytes", "4096", "--pool-pages", "64", "--aux-slots", "32"]


def group_flags(nnodes: int, rank: int, port: int) -> list[str]:
    return ["--nnodes", str(nnodes), "--node-rank", str(rank), "--dist-init-addr", f"127.0.0.1:{port}"]


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with Fleet() as f:
        yield f


def _health(rt: Runtime) -> tuple[int, str]:
    try:
        return http_get(f"{rt.url}/health", timeout=2)
    except OSError as err:
        return 0, str(err)


def _exited(rt: Runtime, timeout: float) -> int:
    wait_for(lambda: not rt.proc.alive(), timeout, f"{rt.proc.name} to exit", 0.5)
    code = rt.proc.popen.returncode
    assert code is not None
    return code


def test_leader_is_ready_only_with_every_rank_and_serves_the_group(fleet: Fleet) -> None:
    port = free_port()
    leader = fleet.runtime("prefill", extra=[*SMALL, *group_flags(2, 0, port)], env=ENV)
    decode = fleet.runtime("decode", extra=SMALL, env=ENV)
    # The leader's HTTP port is up, but it is not ready: its worker has not joined.
    wait_for(
        lambda: _health(leader)[0] == 503 and "1/2 ranks joined" in _health(leader)[1],
        300,
        "the leader to answer that it waits for its ranks",
        0.5,
    )
    worker = fleet.runtime("prefill", extra=group_flags(2, 1, port))
    wait_healthy([leader, worker, decode], timeout=300)
    router = fleet.router([leader], [decode])
    wait_router(router, timeout=240)  # a real PD request: router -> leader -> NIXL -> decode

    worker.proc.signal(signal.SIGKILL)
    assert _exited(leader, 60) != 0
    assert "rank 1 left the group" in leader.proc.log_tail()


def test_a_worker_fails_when_its_leader_goes(fleet: Fleet) -> None:
    port = free_port()
    leader = fleet.runtime("decode", extra=[*SMALL, *group_flags(3, 0, port)], env=ENV)
    workers = [fleet.runtime("decode", extra=group_flags(3, rank, port)) for rank in (1, 2)]
    wait_healthy([leader, *workers], timeout=300)
    leader.proc.signal(signal.SIGKILL)
    for worker in workers:
        assert _exited(worker, 60) == 1
        assert "the leader is gone" in worker.proc.log_tail()


def test_a_rank_the_group_does_not_have_is_refused(fleet: Fleet) -> None:
    port = free_port()
    leader = fleet.runtime("prefill", extra=[*SMALL, *group_flags(2, 0, port)], env=ENV)
    wait_for(lambda: _health(leader)[0] == 503, 300, "the leader's HTTP port", 0.5)
    stranger = fleet.runtime("prefill", extra=group_flags(4, 3, port))
    assert _exited(stranger, 60) == 1
    assert "nnodes 4 differs from the leader's 2" in stranger.proc.log_tail()
    assert leader.proc.alive() and _health(leader)[0] == 503

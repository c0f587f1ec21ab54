"""Contract metrics leave SGLang-like processes through prometheus multiprocess mode.

Real processes (one per TP rank, as SGLang's schedulers), each with PROMETHEUS_MULTIPROC_DIR
set before prometheus_client is imported, exactly as SGLang's children inherit it; the
launcher's collector and SGLang's own /metrics collector (MultiProcessCollector) read the
directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

import pdwarden_contract as c
from pdwarden_runtime.sglang_boot.prom_bridge import contract_registry, serve_contract_metrics
from pdwarden_testkit.promtext import Sample, metric_sum, samples

pytestmark = pytest.mark.integration

RANK = r"""
import sys, threading, time
from pdwarden_runtime.hardening.threads import ThreadWatch
from pdwarden_runtime.inflight import InflightTracker
from pdwarden_runtime.kvpoll import KVPoll
from pdwarden_runtime.metrics import RuntimeMetrics
from pdwarden_runtime.sglang_boot.prom_bridge import bridge, multiprocess_mode_active
from pdwarden_runtime.status import RoomStatusTable

n_open, n_done, n_failed, workers_dead = (int(a) for a in sys.argv[1:5])
assert multiprocess_mode_active()
table = RoomStatusTable(mode="sticky")
tracker = InflightTracker(table)
# two transfer workers per rank; ``workers_dead`` of them have ended
watch = ThreadWatch()
hold = threading.Event()
for i in range(2):
    target = (lambda: None) if i < workers_dead else hold.wait
    worker = threading.Thread(target=target, name=f"Thread-{i} (transfer_worker)", daemon=True)
    worker.start()
    watch.watch(worker)
    if i < workers_dead:
        worker.join()
metrics = RuntimeMetrics("prefill", table, tracker, engine="sglang", transfer_backend="nixl", threads=watch)
b = bridge(metrics.registry)
assert b is not None and bridge(metrics.registry) is b  # once per registry
for room in range(n_open):
    table.open(room, KVPoll.Bootstrapping)
for room in range(n_done):
    table.update(room, KVPoll.Transferring)
    table.update(room, KVPoll.Success)
for room in range(n_done, n_done + n_failed):
    table.update(room, KVPoll.Transferring)
    table.update(room, KVPoll.Failed)
    table.update(room, KVPoll.Transferring)  # the emulated port's race: refused, counted
metrics.add_bytes(1000 * n_done)
b.flush()
# a room that concludes later shows up without another explicit flush (the bridge thread)
table.update(n_open - 1, KVPoll.Transferring)
table.update(n_open - 1, KVPoll.Success)
time.sleep(2.5)
print("ok", flush=True)
"""


def run_rank(prom_dir: str, n_open: int, n_done: int, n_failed: int, workers_dead: int = 0) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": prom_dir}
    done = subprocess.run(
        [sys.executable, "-c", RANK, str(n_open), str(n_done), str(n_failed), str(workers_dead)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def value(found: list[Sample], name: str, **labels: str) -> float:
    return metric_sum(found, name, **{"role": "prefill", **labels})


@pytest.fixture
def two_ranks(tmp_path) -> str:
    prom_dir = str(tmp_path)
    # rank 0: 5 rooms, 2 succeed (+1 later), 1 fails; rank 1: 3 rooms, 1 succeeds (+1 later)
    # and one of its two transfer workers is dead
    run_rank(prom_dir, 5, 2, 1)
    run_rank(prom_dir, 3, 1, 0, workers_dead=1)
    return prom_dir


def test_contract_metrics_merge_over_ranks(two_ranks: str) -> None:
    found = samples(generate_latest(contract_registry(two_ranks)).decode())
    assert found and all(s.name.startswith("pdwarden_") for s in found)
    # gauges: the worst rank (rank 0 still has rooms 3 open... 5 open - 2 done - 1 failed - 1 late)
    assert value(found, c.METRIC_INFLIGHT_REQUESTS) == 1
    # counters: summed over ranks
    assert value(found, c.METRIC_KV_TRANSFERS_TOTAL, outcome="success") == (2 + 1) + (1 + 1)
    assert value(found, c.METRIC_KV_TRANSFERS_TOTAL, outcome="failed") == 1
    assert value(found, c.METRIC_KV_TRANSFER_BYTES_TOTAL) == 3000
    refused = value(found, c.METRIC_STATUS_WRITES_REFUSED_TOTAL, from_state="failed", to_state="transferring")
    assert refused == 1
    # the identity gauge is one series, without multiprocess mode's pid label
    info = [s for s in found if s.name == c.METRIC_RUNTIME_INFO]
    assert len(info) == 1 and "pid" not in info[0].labels
    assert info[0].value == 1


def test_alive_threads_are_the_fewest_on_any_rank(two_ranks: str) -> None:
    found = samples(generate_latest(contract_registry(two_ranks)).decode())
    kind = "nixl_transfer_worker"
    # rank 0 has both workers alive, rank 1 one: the pod has a dead worker
    assert value(found, c.METRIC_RUNTIME_THREADS, thread=kind) == 1
    assert value(found, c.METRIC_RUNTIME_THREADS_EXPECTED, thread=kind) == 2
    alive = [s for s in found if s.name == c.METRIC_RUNTIME_THREADS]
    assert alive and all("pid" not in s.labels for s in alive)


def test_sglang_own_metrics_endpoint_shows_them_too(two_ranks: str) -> None:
    registry = CollectorRegistry()  # what sglang.srt.utils.common.add_prometheus_middleware builds
    MultiProcessCollector(registry, path=two_ranks)
    text = generate_latest(registry).decode()
    assert f"{c.METRIC_KV_TRANSFERS_TOTAL}{{" in text
    assert f"{c.METRIC_INFLIGHT_REQUESTS}{{" in text


def test_metrics_port_serves_them(two_ranks: str) -> None:
    server = serve_contract_metrics(two_ranks, "127.0.0.1", 0)  # the kernel picks a free port
    try:
        with urllib.request.urlopen(server.url, timeout=10) as resp:
            found = samples(resp.read().decode())
    finally:
        server.stop()
    assert value(found, c.METRIC_KV_TRANSFERS_TOTAL, outcome="success") == 5


def test_bridge_is_a_no_op_outside_multiprocess_mode() -> None:
    from pdwarden_runtime.sglang_boot.prom_bridge import bridge, multiprocess_mode_active

    if multiprocess_mode_active():
        pytest.skip("this test process runs prometheus_client in multiprocess mode")
    assert bridge(CollectorRegistry()) is None

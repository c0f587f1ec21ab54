"""bench/gpu_pd_check.py's figures (pure): what the GPU check reports from its raw data."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pdwarden_testkit.promtext import Sample

pytestmark = pytest.mark.unit

HELPER = Path(__file__).resolve().parents[2] / "bench" / "gpu_pd_check.py"


@pytest.fixture(scope="module")
def g() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_pd_check", HELPER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_pd_check"] = module
    spec.loader.exec_module(module)
    return module


def test_percentiles(g: ModuleType) -> None:
    assert g.percentile([], 0.5) is None
    assert g.percentile([3.0], 0.99) == 3.0
    assert g.percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert g.percentile(list(range(101)), 0.99) == pytest.approx(99.0)


def of(series: dict[str, float]) -> list[Sample]:
    """`name{k=v,...}: value` written compactly -> the samples the check's scrape returns."""
    out = []
    for key, value in series.items():
        name, _, rest = key.partition("{")
        labels = dict(kv.split("=", 1) for kv in rest.rstrip("}").split(",") if kv)
        out.append(Sample(name, labels, value))
    return out


REFUSED = "pdwarden_kv_status_writes_refused_total{from_state=failed,role=prefill,to_state=transferring}"


def test_figures_from_results_and_metric_deltas(g: ModuleType) -> None:
    results = [
        *({"outcome": "completed", "latency_s": float(i)} for i in range(1, 11)),
        *({"outcome": "cancelled", "latency_s": 0.1} for _ in range(4)),
        {"outcome": "error", "latency_s": 0.2},
        {"outcome": "timeout", "latency_s": 60.0},
    ]
    before = {
        "prefill": of({"pdwarden_kv_transfer_bytes_total{role=prefill}": 1e9}),
        "prefill_sglang": of(
            {
                "sglang:kv_transfer_speed_gb_s_sum{model=m}": 10.0,
                "sglang:kv_transfer_speed_gb_s_count{model=m}": 1.0,
            }
        ),
    }
    after = {
        "prefill": of(
            {
                "pdwarden_kv_transfer_bytes_total{role=prefill}": 5e9,
                "pdwarden_inflight_requests{role=prefill}": 0.0,
                "pdwarden_kv_transfers_total{outcome=success,role=prefill}": 10.0,
                "pdwarden_kv_transfers_total{outcome=aborted,role=prefill}": 4.0,
                REFUSED: 3.0,
            }
        ),
        "decode": of({"pdwarden_inflight_requests{role=decode}": 1.0}),
        "prefill_sglang": of(
            {
                "sglang:kv_transfer_speed_gb_s_sum{model=m}": 70.0,
                "sglang:kv_transfer_speed_gb_s_count{model=m}": 4.0,
            }
        ),
        "decode_sglang": of({"sglang:num_decode_transfer_queue_reqs{model=m}": 1.0}),
    }
    f = g.figures(results, before, after, load_seconds=2.0)
    assert (f["requests"], f["completed"], f["aborted"], f["errors"], f["timed_out"]) == (16, 10, 4, 1, 1)
    assert f["latency_p50_s"] == 5.5
    assert f["latency_p99_s"] == pytest.approx(9.91)
    assert f["kv_bytes"] == 4_000_000_000
    assert f["kv_transfer_gbps"] == 2.0
    assert f["kv_transfer_gbps_per_transfer_sglang"] == 20.0
    assert f["wedged_rooms"] == 1 and f["wedged_rooms_by_role"] == {"prefill": 0, "decode": 1}
    assert f["transfer_outcomes"]["prefill"]["aborted"] == 4.0
    assert f["status_writes_refused"] == 3
    assert f["sglang_inflight_after_drain"]["decode"] == 1.0


def test_tiny_model_moves_enough_kv_to_measure(g: ModuleType) -> None:
    assert g.kv_bytes_per_token() == 8 * 2 * 8 * 128 * 2
    assert g.MODEL_CONFIG["vocab_size"] == g.VOCAB_WORDS + len(g.SPECIALS)

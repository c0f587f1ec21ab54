"""The one reader of Prometheus text in the benchmarks, tests and demo (pure)."""

from __future__ import annotations

import pytest

from pdwarden_testkit.promtext import metric_sum, samples

pytestmark = pytest.mark.unit

PAGE = """\
# TYPE pdwarden_kv_transfers_total counter
pdwarden_kv_transfers_total{outcome="success",role="prefill"} 5
pdwarden_kv_transfers_total{outcome="failed",role="prefill"} 2
# TYPE pdwarden_kv_transfers_totalx counter
pdwarden_kv_transfers_totalx_total{outcome="success",role="prefill"} 100
# TYPE pdwarden_inflight_requests gauge
pdwarden_inflight_requests{role="prefill"} 3
"""


def test_sums_the_matching_series_only() -> None:
    found = samples(PAGE)
    assert metric_sum(found, "pdwarden_kv_transfers_total") == 7.0
    assert metric_sum(found, "pdwarden_kv_transfers_total", outcome="success") == 5.0
    assert metric_sum(found, "pdwarden_kv_transfers_total", outcome="success", role="decode") == 0.0
    assert metric_sum(found, "missing") == 0.0


def test_names_filter_the_samples() -> None:
    found = samples(PAGE, {"pdwarden_inflight_requests"})
    assert [(s.name, s.labels, s.value) for s in found] == [
        ("pdwarden_inflight_requests", {"role": "prefill"}, 3.0)
    ]


def test_junk_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        samples('pdwarden_inflight_requests{role="prefill" 3\n')

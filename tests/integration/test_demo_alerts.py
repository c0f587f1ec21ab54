"""The demo's alert verdict: promtool (the real one) judges series shaped like the demo's."""

from __future__ import annotations

import pytest

from pdwarden_cli import chart, demo_alerts, demo_scenario
from pdwarden_cli.demo_scrape import SeriesStore
from pdwarden_runtime import contract

pytestmark = pytest.mark.integration


def test_promtool_judges_a_wedge_in_scraped_series() -> None:
    # Series shaped like the demo's: a progressing prefill pod whose queue then stops.
    groups = chart.rule_groups(
        chart.helm_template(release=demo_scenario.RELEASE, set_values=demo_scenario.DEMO_RULE_VALUES)
    )
    store = SeriesStore(start=0.0, step=2.0)
    target = {
        "job": "d/rt",
        "instance": "127.0.1.2:9400",
        "namespace": "d",
        "pod": "m-prefill-a",
        "model": "m",
    }
    for i in range(50):
        at = i * 2.0
        store.add(at, {"__name__": "up", **target}, 1)
        store.add(at, {"__name__": contract.METRIC_INFLIGHT_REQUESTS, **target, "role": "prefill"}, 2)
        done = {
            "__name__": contract.METRIC_KV_TRANSFERS_TOTAL,
            **target,
            "role": "prefill",
            "outcome": "success",
        }
        store.add(at, done, 3 * min(i, 25))  # progress stops at slot 25 (50 s)
        age = {"__name__": contract.METRIC_INFLIGHT_OLDEST_AGE, **target, "role": "prefill"}
        store.add(at, age, 1 if i <= 25 else 2 * (i - 25))
    assert not demo_alerts.was_firing(groups, store, until_slot=24)
    fired = demo_alerts.firing_alerts(groups, store, matchers={"pod": "m-prefill-a"})
    assert fired == ["PdwardenInflightStuck", "PdwardenInflightOldestAgeHigh"]
    assert demo_alerts.firing_alerts(groups, store, matchers={"pod": "another-pod"}) == []

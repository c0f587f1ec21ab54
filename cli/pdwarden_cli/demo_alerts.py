"""Which of the chart's alerts fired, judged by the real promtool over the scraped series.

promtool replays the demo's samples as input series, evaluates the chart's PrometheusRule
on them step by step, and keeps the ALERTS series it produced; a PromQL test over ALERTS
then tells whether an alert was firing at any time in a range.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from pdwarden_cli import chart
from pdwarden_cli.demo_scrape import SeriesStore


def alerts_query(alertname: str | None, matchers: Mapping[str, str]) -> str:
    selectors = ['alertstate="firing"']
    if alertname:
        selectors.insert(0, f'alertname="{alertname}"')
    selectors += [f'{k}="{v}"' for k, v in sorted(matchers.items())]
    return "{" + ", ".join(selectors) + "}"


def fired_test(
    store: SeriesStore,
    *,
    alertname: str | None,
    matchers: Mapping[str, str],
    until_slot: int,
    expect_fired: bool,
) -> dict[str, Any]:
    """A promtool test file: was `alertname` (any alert if None) firing in slots [0, until_slot]?"""
    step = f"{store.step:g}s"
    at = f"{until_slot * store.step:g}s"
    lookback = f"{(until_slot + 1) * store.step:g}s"
    expr = f"max(max_over_time(ALERTS{alerts_query(alertname, matchers)}[{lookback}])) or vector(0)"
    return {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": step,
        "tests": [
            {
                "interval": step,
                "input_series": store.input_series(),
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": at,
                        "exp_samples": [{"labels": "{}", "value": 1 if expect_fired else 0}],
                    }
                ],
            }
        ],
    }


def was_firing(
    groups: Mapping[str, Any],
    store: SeriesStore,
    *,
    alertname: str | None = None,
    matchers: Mapping[str, str] | None = None,
    until_slot: int | None = None,
) -> bool:
    """True if promtool saw the alert firing at some evaluation up to `until_slot`."""
    until = store.last_slot() if until_slot is None else until_slot
    with tempfile.TemporaryDirectory(prefix="pdwarden-demo-promtool-") as tmp:
        d = Path(tmp)
        (d / "rules.yaml").write_text(chart.dump_yaml(chart.without_annotations(groups)))
        test = fired_test(
            store, alertname=alertname, matchers=matchers or {}, until_slot=until, expect_fired=True
        )
        (d / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False, width=1 << 20))
        proc = subprocess.run(
            [chart.find_tool("promtool"), "test", "rules", str(d / "test.yaml")],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    if proc.returncode == 0:
        return True
    if "got: {} 0E+00" in proc.stdout + proc.stderr:
        return False
    raise RuntimeError(
        f"promtool could not evaluate the rules: {(proc.stdout + proc.stderr).strip()[-1500:]}"
    )


def firing_alerts(
    groups: Mapping[str, Any],
    store: SeriesStore,
    *,
    matchers: Mapping[str, str] | None = None,
    until_slot: int | None = None,
    only: Sequence[str] | None = None,
) -> list[str]:
    """Names of the chart's alerts (or of `only` these) that fired for series matching
    `matchers`, in rule order."""
    names = [rule["alert"] for rule in chart.alert_rules(groups) if only is None or rule["alert"] in only]

    def fired(name: str) -> bool:
        return was_firing(groups, store, alertname=name, matchers=matchers, until_slot=until_slot)

    with ThreadPoolExecutor(max_workers=4) as pool:  # one promtool process per alert
        verdicts = list(pool.map(fired, names))
    return [name for name, yes in zip(names, verdicts, strict=True) if yes]

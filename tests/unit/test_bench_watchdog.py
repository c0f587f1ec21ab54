"""bench watchdog's verdict is the median of its steady windows, each window's CPU beside it, and
its counts are over every window; its yardsticks of the machine are prometheus_client's parse
and the reference parse (the operator's parser before its one-pass rewrite) of a fleet pod's body."""

from __future__ import annotations

from typing import Any

import click
import pytest
from click.testing import CliRunner

from pdwarden_bench.watchdog import (
    Reading,
    Window,
    cores_goal_met,
    goal_met,
    model_count,
    prometheus_parse,
    reference_parse_cpu_us,
    scrape_cost,
    steady_figures,
    window,
)
from pdwarden_bench.watchdog import watchdog as bench_watchdog
from pdwarden_operator.watchdog.parse import METRICS_READ, ParseError, parse_metrics
from pdwarden_testkit.fleet.runtimes import FleetRuntimes

pytestmark = pytest.mark.unit


def _window(
    cpu_s: float, rounds: int = 600, late: int = 0, errors: int = 0, counted_s: float = 60.0
) -> Window:
    return Window(
        seconds=60.0,
        cpu_s=cpu_s,
        counted_seconds=counted_s,
        rounds=rounds,
        round_seconds=rounds * 0.25,
        rounds_late=late,
        scrape_errors=errors,
        full_collections=1,
        rss_mib=250.0,
    )


def _reading(at: float, cpu_s: float, rounds: float) -> Reading:
    """A reading whose fetch took 2 s, 0.5 s of it the operator's CPU."""
    return Reading(
        before_at=at,
        cpu_before_s=cpu_s,
        after_at=at + 2.0,
        cpu_after_s=cpu_s + 0.5,
        rounds=rounds,
        round_seconds=rounds / 4,
        rounds_late=1.0,
        scrape_errors=rounds / 100,
        unobserved_pods=0.0,
        full_collections=rounds / 200,
        rss_mib=at,
    )


def test_a_window_leaves_out_the_fetches_that_bound_it() -> None:
    """Serving the bench's fetch of the operator's metrics is counted in neither window it
    bounds; the rounds are counted from one fetch to the next."""
    w = window(_reading(at=100.0, cpu_s=10.0, rounds=100.0), _reading(at=162.0, cpu_s=25.5, rounds=700.0))
    assert (w.seconds, w.cpu_s, w.cores) == (60.0, 15.0, 0.25)
    assert w.counted_seconds == 62.0
    assert (w.rounds, w.round_seconds, w.rounds_late, w.scrape_errors) == (600, 150.0, 0, 6)
    assert (w.full_collections, w.rss_mib) == (3, 162.0)  # the RSS as the window ends


def test_cores_is_the_median_window_and_one_noisy_window_does_not_decide() -> None:
    figures = steady_figures([_window(13.2), _window(19.8), _window(14.4)], models=100, interval=10)
    assert figures["cores"] == 0.24
    assert (figures["cores_min"], figures["cores_max"]) == (0.22, 0.33)
    assert figures["cores_windows"] == [0.22, 0.33, 0.24]
    assert figures["windows"] == 3
    assert figures["full_collections_windows"] == [1, 1, 1]
    assert figures["rss_windows_mib"] == [250.0, 250.0, 250.0]


def test_counts_are_over_every_window() -> None:
    figures = steady_figures(
        [_window(12.0, rounds=590, late=1), _window(12.0, rounds=610, errors=2)], models=100, interval=10
    )
    # the rounds a window expects follow the span its counts cover
    assert figures["rounds"] == 1200
    assert figures["expected_rounds"] == 1200
    assert figures["round_mean_s"] == 0.25
    assert (figures["rounds_late"], figures["scrape_errors"]) == (1, 2)
    assert figures["operator_cpu_s"] == 24.0


def test_no_window_is_an_error_not_a_verdict() -> None:
    with pytest.raises(ValueError, match="no steady window"):
        steady_figures([], models=1, interval=10)


def _run(**overrides: Any) -> dict[str, Any]:
    figures = steady_figures([_window(14.0), _window(16.0), _window(14.5)], models=100, interval=10)
    figures |= {"operator_peak_rss_mib": 280.0, "unobserved_pods": 0, "wedge_remediated_s": 12.0}
    figures |= {"cpu_over_prometheus_parse": 1.5}
    return figures | overrides


@pytest.mark.parametrize(
    ("overrides", "met"),
    [
        ({}, True),
        ({"cpu_over_prometheus_parse": 2.0}, True),
        ({"cpu_over_prometheus_parse": 2.01}, False),
        ({"cpu_over_prometheus_parse": None}, False),  # no scrape measured: no verdict of success
        ({"cores": 0.26}, True),  # the cores move with the machine: not the goal's
        ({"operator_peak_rss_mib": 301.0}, False),
        ({"rounds_late": 1}, False),
        ({"scrape_errors": 1}, False),
        ({"unobserved_pods": 1}, False),
        ({"wedge_remediated_s": None}, False),
    ],
)
def test_the_goal(overrides: dict[str, Any], met: bool) -> None:
    assert goal_met(_run(**overrides)) is met


def test_the_cores_goal_is_still_judged_beside_it() -> None:
    assert cores_goal_met(_run())
    assert not cores_goal_met(_run(cores=0.26))


def test_the_reference_parse_is_the_reference_parsers_of_a_fleet_body_and_refuses_garbage() -> None:
    body, _ = FleetRuntimes().body("prefill", "serving", METRICS_READ)
    assert reference_parse_cpu_us(body, parses=50) > 0
    assert reference_parse_cpu_us(body, parses=50, parse=parse_metrics) > 0  # the operator's, beside it
    assert reference_parse_cpu_us(body, parses=10, parse=prometheus_parse) > 0  # the library's
    with pytest.raises(ParseError):  # a figure from a body the operator refuses would mean nothing
        reference_parse_cpu_us(b"\x00garbage", parses=50)


def test_the_cost_of_a_scrape_is_the_windows_cpu_over_every_models_pods_per_round() -> None:
    figures = steady_figures([_window(24.0, rounds=600), _window(24.0, rounds=600)], models=100, interval=10)
    # 1,200 rounds of 100 pods each (10,000 pods as 100 models): 48 CPU-s over 120,000 scrapes
    assert scrape_cost(figures, endpoints=10000, models=100, reference_us=100.0, prometheus_us=250.0) == {
        "reference_parse_cpu_us": 100.0,
        "prometheus_parse_cpu_us": 250.0,
        "cpu_us_per_scrape": 400.0,
        "scrape_over_reference_parse": 4.0,
        "cpu_over_reference_parse": 4.0,
        "cpu_over_prometheus_parse": 1.6,
    }
    idle = scrape_cost(
        figures | {"rounds": 0}, endpoints=10000, models=100, reference_us=100.0, prometheus_us=1.0
    )
    assert idle == {"reference_parse_cpu_us": 100.0, "prometheus_parse_cpu_us": 1.0}


def test_idle_models_leave_at_least_one_serving_and_are_refused_before_a_cluster_starts() -> None:
    assert model_count(10000, 100) == model_count(10000, 100, 99) == 100
    assert model_count(250, 100, 2) == 3
    with pytest.raises(click.UsageError, match="fewer than the 100 models"):
        model_count(10000, 100, 100)
    # refused as a usage error, before the kubeconfig is read or a cluster started
    result = CliRunner().invoke(
        bench_watchdog, ["--endpoints", "200", "--idle-models", "2", "--kubeconfig", "/nonexistent"]
    )
    assert result.exit_code == 2 and "fewer than the 2 models" in result.output, result.output


def test_the_goal_from_the_windows() -> None:
    """The ratio comes from the windows' CPU over their scrapes and prometheus_client's parse."""
    figures = steady_figures([_window(1.2, rounds=600), _window(1.2, rounds=600)], models=100, interval=10)
    base = {"operator_peak_rss_mib": 200.0, "unobserved_pods": 0, "wedge_remediated_s": 9.0}
    cost = scrape_cost(figures, endpoints=10000, models=100, reference_us=5.0, prometheus_us=10.0)
    assert cost["cpu_over_prometheus_parse"] == 2.0  # 2.4 CPU-s over 120,000 scrapes: 20 us
    assert goal_met(figures | cost | base)
    slower = scrape_cost(figures, endpoints=10000, models=100, reference_us=5.0, prometheus_us=9.0)
    assert not goal_met(figures | slower | base)

"""Hostile /metrics bodies never crash the watchdog and never cause an action (hypothesis)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdwarden_operator.resource.watchdog import WatchdogSpec
from pdwarden_operator.watchdog import ladder
from pdwarden_operator.watchdog.history import PodHistory, PodScrape
from pdwarden_operator.watchdog.parse import ParseError, parse_metrics
from pdwarden_operator.watchdog.rule import judge
from pdwarden_operator.watchdog.state import WatchdogState
from pdwarden_operator.watchdog.verdict import PodView

pytestmark = pytest.mark.unit

MAX_BYTES = 64 * 1024
NAMES = (
    "pdwarden_inflight_requests",
    "pdwarden_inflight_oldest_age_seconds",
    "pdwarden_kv_transfers_total",
    "pdwarden_kv_transfers",
    "pdwarden_kv_transfers_created",
)


def valid(inflight: int, age: float, transfers: int) -> str:
    return (
        "# TYPE pdwarden_inflight_requests gauge\n"
        f'pdwarden_inflight_requests{{role="prefill"}} {inflight}\n'
        "# TYPE pdwarden_inflight_oldest_age_seconds gauge\n"
        f'pdwarden_inflight_oldest_age_seconds{{role="prefill"}} {age}\n'
        "# TYPE pdwarden_kv_transfers_total counter\n"
        f'pdwarden_kv_transfers_total{{outcome="success",role="prefill"}} {transfers}\n'
        'pdwarden_kv_transfers_total{outcome="failed",role="prefill"} 0\n'
    )


BAD_VALUES = st.sampled_from(
    [
        "NaN",
        "+Inf",
        "-Inf",
        "-1",
        "-0.5",
        "1e300",
        "1e999",
        "abc",
        "",
        "0x10",
        "1e",
        "9" * 400,
        "1_000",
        "\uff11\uff12",
        "None",
        "true",
        "3 4 5",
        "\\x00",
    ]
)
TYPES = st.sampled_from(
    ["gauge", "counter", "histogram", "summary", "untyped", "info", "stateset", "bogus", ""]
)


@st.composite
def hostile(draw: st.DrawFn) -> str | bytes:
    base = valid(draw(st.integers(0, 50)), draw(st.floats(0, 30)), draw(st.integers(0, 10_000)))
    lines = base.splitlines()
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.text(max_size=400))
    if kind == 1:
        return draw(st.binary(max_size=400))
    if kind == 2:  # truncated anywhere
        return base[: draw(st.integers(0, len(base) - 1))]
    if kind == 3:  # a value replaced by garbage or a forbidden number
        i = draw(st.sampled_from([i for i, line in enumerate(lines) if not line.startswith("#")]))
        lines[i] = lines[i].rsplit(" ", 1)[0] + " " + draw(BAD_VALUES)
        return "\n".join(lines) + "\n"
    if kind == 4:  # wrong type declared
        i = draw(st.sampled_from([i for i, line in enumerate(lines) if line.startswith("# TYPE")]))
        name = lines[i].split()[2]
        lines[i] = f"# TYPE {name} {draw(TYPES)}"
        return "\n".join(lines) + "\n"
    if kind == 5:  # duplicate series
        i = draw(st.sampled_from([i for i, line in enumerate(lines) if not line.startswith("#")]))
        lines.insert(draw(st.integers(0, len(lines))), lines[i])
        return "\n".join(lines) + "\n"
    if kind == 6:  # huge: beyond the size limit, or many series
        if draw(st.booleans()):
            return base + "#" * (MAX_BYTES + draw(st.integers(1, 1000))) + "\n"
        n = draw(st.integers(100, 3000))
        return base + "".join(f'pdwarden_kv_transfers_total{{outcome="x{i}"}} 1\n' for i in range(n))
    if kind == 7:  # random junk lines spliced in, metric-looking
        junk = draw(
            st.lists(
                st.one_of(
                    st.builds(lambda n, v: f'{n}{{role="prefill"}} {v}', st.sampled_from(NAMES), BAD_VALUES),
                    st.builds(lambda n, lab: f"{n}{{{lab}}} 1", st.sampled_from(NAMES), st.text(max_size=40)),
                    st.text(max_size=80),
                ),
                min_size=1,
                max_size=8,
            )
        )
        for line in junk:
            lines.insert(draw(st.integers(0, len(lines))), line)
        return "\n".join(lines) + "\n"
    if kind == 8:  # a metric missing
        drop = draw(st.sampled_from(NAMES[:3]))
        return "\n".join(line for line in lines if drop not in line) + "\n"
    # a plausible-looking pod lying with extreme values
    return valid(
        draw(st.integers(0, 10**15)),
        draw(st.floats(allow_nan=True, allow_infinity=True)),
        draw(st.integers(-(10**6), 10**20)),
    )


@settings(
    max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(hostile())
def test_parse_never_raises_anything_but_parse_error(body: str | bytes) -> None:
    try:
        sample = parse_metrics(body, max_bytes=MAX_BYTES)
    except ParseError as exc:
        assert str(exc)  # a message naming the problem
        return
    for value in (sample.inflight, sample.oldest_age, sample.transfers):
        assert math.isfinite(value) and value >= 0


WATCHDOG = WatchdogSpec(
    stuck_after_seconds=30,
    scrape_interval_seconds=10,
    action="restart",
    max_remediations=3,
    budget_window_seconds=3600,
    max_unavailable=1,
    drain_seconds=120,
)
POD = PodView("p0", "uid-p0", "prefill", ready=True, terminating=False)
OTHER = PodView("p1", "uid-p1", "prefill", ready=True, terminating=False)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(st.lists(hostile(), min_size=1, max_size=12), st.integers(1, 200))
def test_hostile_bodies_between_healthy_scrapes_cause_no_action(
    bodies: list[str | bytes], queue: int
) -> None:
    """A healthy, progressing pod whose every other scrape is hostile is never wedged nor acted on."""
    history = PodHistory(keep_seconds=60)
    state = WatchdogState()
    transfers = 100
    at = 0.0
    for body in bodies:
        for text in (valid(queue, 2.0, transfers), body):
            at += 10
            try:
                history.add(PodScrape(at, parse_metrics(text, max_bytes=MAX_BYTES)))
            except ParseError as exc:
                history.add(PodScrape(at, None, str(exc)))
            verdict = judge(history.observations(), WATCHDOG.stuck_after_seconds)
            assert verdict.state != "wedged", verdict.reason
            p = ladder.plan(
                verdicts={POD.uid: verdict},
                pods=[POD, OTHER],
                state=state,
                settings=WATCHDOG,
                now=1.8e9 + at,
                desired={"prefill": 2},
            )
            assert p.actions == () and p.notices == ()
            state = p.state
        transfers += 3
    assert state == WatchdogState()

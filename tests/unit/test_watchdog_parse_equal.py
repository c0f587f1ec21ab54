"""The watchdog's parser reads every body as the parser it replaced did (kept as
`pdwarden_testkit.reference_parse`): the same PodSample, or a ParseError where that one raised
one. Over the bodies the runtime's own metrics code writes (a room's whole life, per-peer
series, both roles, every fleet mode, whole or as a scrape names its families) and over
generated ones: lines of the families the watchdog reads and of others that share their
prefixes, every family type, labels from the contract's sets and outside them, escapes,
values that are not numbers, NaN, Inf, negative and implausible ones, timestamps, duplicate
series, blank lines, carriage returns and junk (hypothesis)."""

from __future__ import annotations

import math
from dataclasses import astuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pdwarden_contract as c
from pdwarden_operator.watchdog.parse import METRICS_READ, ParseError, PodSample, parse_metrics
from pdwarden_runtime.kvpoll import KVPoll
from pdwarden_testkit import reference_parse
from pdwarden_testkit.fleet.runtimes import MODES, FleetRuntimes
from tests.support.runtime_metrics import runtime

pytestmark = pytest.mark.unit

PEERS = frozenset({"198.18.0.9", "2001:2::7"})


def _outcome(parse: object, body: bytes | str, peers: frozenset[str] | None) -> object:
    """What a parser makes of `body`: its sample as a comparable tuple (NaN equal to NaN), or
    the fact that it refused it."""
    try:
        sample = parse(body, peers=peers)  # type: ignore[operator]
    except ParseError:
        return "refused"
    assert isinstance(sample, PodSample)
    return _comparable(astuple(sample))


def _comparable(value: object) -> object:
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, (tuple, list)):
        return tuple(_comparable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _comparable(v)) for k, v in value.items()))
    return value


def assert_same(body: bytes | str, peers: frozenset[str] | None = PEERS) -> object:
    ours = _outcome(parse_metrics, body, peers)
    assert ours == _outcome(reference_parse.parse_metrics, body, peers), body
    return ours


def test_the_runtimes_bodies_through_a_rooms_life_read_the_same() -> None:
    for role in c.RUNTIME_ROLES:
        clock, table, _, metrics = runtime(role)
        read = []
        for step in range(6):
            if step == 1:
                table.open(7, KVPoll.Bootstrapping)
                metrics.peers.bind(7, ["198.18.0.9"])
            elif step == 2:
                table.update(7, KVPoll.Transferring)
                clock.now += 3.0
            elif step == 3:
                table.open(8, KVPoll.Bootstrapping)
                metrics.peers.bind(8, ["2001:2::7"])
            elif step == 4:
                table.update(7, KVPoll.Failed, outcome=c.OUTCOME_DEADLINE)
            elif step == 5:
                table.update(8, KVPoll.Success)
            for names in ((), METRICS_READ):
                body = metrics.exposition(names)[0]
                read.append(assert_same(body))
                assert_same(body, peers=None)
                assert_same(body, peers=frozenset())  # a peer of another model: refused by both
        assert "refused" not in read


def test_the_fleets_bodies_read_the_same() -> None:
    fleet = FleetRuntimes()
    for role in c.RUNTIME_ROLES:
        for mode in MODES:
            for names in ((), METRICS_READ):
                body, _ = fleet.body(role, mode, names)
                assert assert_same(body) != "refused"


# Names that the kept-line filter lets through: the families read, and others that start alike.
NAMES = (
    *METRICS_READ,
    c.METRIC_KV_TRANSFERS_BASE,
    c.METRIC_KV_PEER_TRANSFERS_BASE,
    "pdwarden_kv_rooms_total",
    "pdwarden_inflight_requests_bucket",
    "pdwarden_kv_transfers_total_total",
    "pdwarden_runtime_threads_count",
)
TYPES = ("counter", "gauge", "untyped", "summary", "histogram", "info", "stateset", "gauge extra", "bogus")
LABEL_NAMES = (
    c.LABEL_METRIC_STATE,
    c.LABEL_METRIC_OUTCOME,
    c.LABEL_METRIC_PEER,
    c.LABEL_METRIC_THREAD,
    "role",
    "__name__",
    "9bad",
)
LABEL_VALUES = (
    *c.KV_STATES,
    *c.OUTCOMES,
    *c.RUNTIME_THREAD_KINDS,
    *PEERS,
    c.PEER_OTHER,
    "198.18.0.66",
    "prefill",
    "",
    'a "quoted" \\ value\n',
    "x" * 130,
)
VALUES = (
    "0",
    "1",
    "2.5",
    "3e2",
    "-1",
    "NaN",
    "+Inf",
    "-Inf",
    "1e13",
    "1_000",
    "0x10",
    "abc",
    "12",
    "4096.0",
)


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def sample_lines(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(NAMES))
    pairs = draw(st.lists(st.tuples(st.sampled_from(LABEL_NAMES), st.sampled_from(LABEL_VALUES)), max_size=3))
    block = ",".join(f'{k}="{_escaped(v)}"' for k, v in pairs)
    labels = draw(st.sampled_from((f"{{{block}}}", f"{{{block},}}", f"{{ {block} }}", ""))) if pairs else ""
    value = draw(st.sampled_from(VALUES))
    stamp = draw(st.sampled_from(("", " 1700000000000", " -5", " x")))
    return f"{name}{labels} {value}{stamp}"


@st.composite
def comment_lines(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(NAMES))
    keyword = draw(st.sampled_from(("TYPE", "TYPE", "HELP")))
    text = draw(st.sampled_from(TYPES)) if keyword == "TYPE" else "some help \\n text"
    if draw(st.booleans()) and keyword == "TYPE":
        text = ""  # a TYPE line without a type
    return f"# {keyword} {name} {text}".rstrip()


JUNK = st.sampled_from(
    (
        "",
        "   ",
        "# a plain comment",
        "#TYPE pdwarden_kv_rooms gauge",
        "#x TYPE pdwarden_kv_rooms gauge",
        'pdwarden_kv_rooms{state="failed"',
        "pdwarden_kv_rooms{state=failed} 1",
        "pdwarden_inflight_requests",
        "pdwarden_inflight_requests 1 2 3",
        "other_metric 1",
        'pdwarden_kv_pool_pages{role="decode"} 4096.0\r',
        "\tpdwarden_kv_rooms 1",
    )
)
LINES = st.one_of(sample_lines(), comment_lines(), JUNK, st.text(max_size=20))


@st.composite
def bodies(draw: st.DrawFn) -> str:
    """A runtime's body with lines dropped, changed, repeated or added here and there, or
    generated lines alone."""
    fleet = FleetRuntimes()
    role = draw(st.sampled_from(c.RUNTIME_ROLES))
    mode = draw(st.sampled_from(MODES))
    whole = draw(st.integers(0, 3))  # three bodies in four start from a runtime's
    base = fleet.body(role, mode, METRICS_READ)[0].decode().splitlines() if whole else []
    lines = [line for line in base if draw(st.integers(0, 19))]  # about one line in twenty dropped
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(lines)))
        lines.insert(at, draw(LINES))
    duplicate: bool = draw(st.booleans())
    if lines and duplicate:
        lines.append(draw(st.sampled_from(lines)))  # a duplicate
    return "\n".join(lines) + draw(st.sampled_from(("\n", "", "\r\n")))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies(), st.sampled_from((PEERS, None, frozenset())))
def test_generated_bodies_read_the_same(body: str, peers: frozenset[str] | None) -> None:
    assert_same(body, peers)
    assert_same(body.encode(), peers)


@settings(max_examples=200, deadline=None)
@given(st.lists(LINES, max_size=12))
def test_generated_lines_alone_read_the_same(lines: list[str]) -> None:
    assert_same("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x00",
        b"\xff\xfe garbage",
        b"pdwarden_inflight_requests 1\n" * 800,  # more series than allowed
        b'pdwarden_inflight_requests{role="' + b"x" * 600 + b'"} 1\n',  # a huge line
        b"# TYPE pdwarden_inflight_requests counter\npdwarden_inflight_requests 1\n",  # wrong type
        b"pdwarden_inflight_requests NaN\npdwarden_inflight_oldest_age_seconds 1\n"
        b"pdwarden_kv_transfers_total 1\n",
        b"pdwarden_inflight_requests +Inf\npdwarden_inflight_oldest_age_seconds 1\n"
        b"pdwarden_kv_transfers_total 1\n",
        b"pdwarden_inflight_requests 1\npdwarden_inflight_requests 1\n"  # a duplicate series
        b"pdwarden_inflight_oldest_age_seconds 1\npdwarden_kv_transfers_total 1\n",
        b"pdwarden_inflight_requests 1\npdwarden_inflight_oldest_age_seconds 1\n"
        b"pdwarden_kv_transfers_total 1\n",  # the least a body may say: read
        b"# TYPE pdwarden_kv_transfers_total counter\n# TYPE pdwarden_inflight_requests gauge\n"
        b"pdwarden_inflight_requests 2\npdwarden_inflight_oldest_age_seconds 3\n",
    ],
)
def test_edge_cases_read_the_same(body: bytes) -> None:
    assert_same(body)
    assert_same(body, peers=None)

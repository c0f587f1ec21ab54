"""The external metrics API's pure parts: label selectors, the items per role, quantities,
who the caller is, the front proxy's settings, and each role's load as counted."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

import pdwarden_contract as contract
from pdwarden_operator import external_metrics as em
from pdwarden_operator.kube.access import FrontProxy, front_proxy_of
from pdwarden_operator.kube.client import KubeClient
from pdwarden_operator.watchdog.autoscale import PodLoad
from pdwarden_operator.watchdog.role_load import RoleLoad, RoleLoads, summarise
from tests.support.kube_client import unreachable_client

pytestmark = pytest.mark.unit

MODEL, ROLE = contract.LABEL_MODEL, contract.LABEL_ROLE


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("", {MODEL: "a"}, True),
        (f"{MODEL}=a", {MODEL: "a", ROLE: "decode"}, True),
        (f"{MODEL}==a", {MODEL: "a"}, True),
        (f"{MODEL}=a,{ROLE}=prefill", {MODEL: "a", ROLE: "decode"}, False),
        (f"{MODEL}!=a", {MODEL: "b"}, True),
        (f"{MODEL}!=a", {ROLE: "decode"}, True),  # a missing key is "not a"
        (f"{ROLE} in (prefill, decode)", {ROLE: "decode"}, True),
        (f"{ROLE} notin (prefill,decode)", {ROLE: "decode"}, False),
        (f"{ROLE} in (prefill),{MODEL}", {ROLE: "prefill", MODEL: "x"}, True),
        (f"!{MODEL}", {ROLE: "prefill"}, True),
        (f"!{MODEL}", {MODEL: "a"}, False),
        (f" {MODEL} = a , {ROLE} ", {MODEL: "a", ROLE: "decode"}, True),
    ],
)
def test_a_selector_matches_as_the_api_servers(selector: str, labels: dict[str, str], matches: bool) -> None:
    assert all(r.matches(labels) for r in em.parse_selector(selector)) is matches


@pytest.mark.parametrize("bad", ["a in (", "a=b,,c", "=b", "a in (x y)", "a=b c", "a==", "a=(b)", ","])
def test_a_malformed_selector_is_an_error_naming_it(bad: str) -> None:
    if bad == "a==":  # an empty value is a value
        assert em.parse_selector(bad)[0].values == frozenset({""})
        return
    with pytest.raises(em.SelectorError):
        em.parse_selector(bad)


@given(st.text(max_size=40))
def test_no_selector_text_crashes_the_parser(text: str) -> None:
    with contextlib.suppress(em.SelectorError):  # any other exception fails the test
        em.parse_selector(text)


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.0, "0"), (3.0, "3"), (2.5, "2500m"), (0.0004, "0"), (1.2346, "1235m"), (9e6, "9000000")],
)
def test_quantities_are_milli_exact(value: float, text: str) -> None:
    assert em.quantity(value) == text


def _load(
    pods: int = 2, inflight: float = 5.0, pages: float | None = None, age: float | None = 1.5
) -> RoleLoad:
    return RoleLoad(
        pods=pods, inflight=inflight, pages_in_use=pages, queue_age=age, observed_at=1_700_000_000.0
    )


def test_items_are_one_per_selected_role_with_a_signal() -> None:
    loads = {
        ("ns", "a", "prefill"): _load(),
        ("ns", "a", "decode"): _load(inflight=1.0, pages=40.0, age=None),
        ("ns", "b", "prefill"): _load(pods=0),  # nothing counted: no signal
    }
    inflight = em.METRICS["pdwarden_role_inflight_requests"]
    items = em.metric_items(loads, inflight, em.parse_selector(f"{MODEL}=a"))
    assert [(i["metricLabels"][ROLE], i["value"]) for i in items] == [("decode", "1"), ("prefill", "5")]
    assert items[0]["timestamp"] == "2023-11-14T22:13:20Z"
    assert em.metric_items(loads, inflight, em.parse_selector(f"{MODEL}=b")) == []
    pages = em.metric_items(loads, em.METRICS["pdwarden_role_kv_pages_in_use"], [])
    assert [(i["metricLabels"][MODEL], i["metricLabels"][ROLE], i["value"]) for i in pages] == [
        ("a", "decode", "40")
    ]
    ages = em.metric_items(
        loads, em.METRICS["pdwarden_role_queue_age_seconds"], em.parse_selector(f"{ROLE}=prefill")
    )
    assert [i["value"] for i in ages] == ["1500m"]


def test_discovery_lists_every_metric() -> None:
    listed = em.resource_list()
    assert listed["groupVersion"] == "external.metrics.k8s.io/v1beta1"
    assert {r["name"] for r in listed["resources"]} == set(em.METRICS)
    assert em.api_group()["preferredVersion"]["version"] == "v1beta1"


FRONT = FrontProxy(
    client_ca="-----BEGIN CERTIFICATE-----",
    allowed_names=("front-proxy-client",),
    username_headers=("X-Remote-User",),
    group_headers=("X-Remote-Group",),
    extra_headers_prefixes=("X-Remote-Extra-",),
)


def _caller(cn: str | None, headers: list[tuple[str, str]]) -> em.Caller | None:
    h: CIMultiDict[str] = CIMultiDict(headers)
    return em.caller_of(FRONT, cn, h)


def test_the_caller_is_who_the_front_proxy_names() -> None:
    caller = _caller(
        "front-proxy-client",
        [
            ("X-Remote-User", "system:serviceaccount:kube-system:horizontal-pod-autoscaler"),
            ("X-Remote-Group", "system:serviceaccounts"),
            ("X-Remote-Group", "system:authenticated"),
            ("X-Remote-Extra-Authentication.kubernetes.io%2fpod-name", "hpa-1"),
            ("X-Remote-Extra-Scopes", "a"),
            ("x-remote-extra-scopes", "b"),
        ],
    )
    assert caller is not None
    assert caller.user.endswith(":horizontal-pod-autoscaler")
    assert caller.groups == ("system:serviceaccounts", "system:authenticated")
    assert caller.extra == (("authentication.kubernetes.io/pod-name", ("hpa-1",)), ("scopes", ("a", "b")))
    assert _caller("front-proxy-client", []) is None  # the proxy itself (discovery)
    alone = _caller("front-proxy-client", [("X-Remote-User", "u")])  # no group header at all
    assert alone is not None and (alone.groups, alone.extra) == ((), ())


@pytest.mark.parametrize("cn", [None, "pdwarden-admin", ""])
def test_only_the_front_proxy_may_name_a_caller(cn: str | None) -> None:
    with pytest.raises(em.Unauthenticated):
        _caller(cn, [("X-Remote-User", "admin"), ("X-Remote-Group", "system:masters")])


def test_any_name_the_ca_signed_when_the_cluster_allows_any() -> None:
    front = FrontProxy("x", (), ("X-Remote-User",), (), ())
    h: CIMultiDict[str] = CIMultiDict([("X-Remote-User", "u")])
    caller = em.caller_of(front, "whoever", h)
    assert caller is not None and caller.user == "u"


def test_the_front_proxy_settings_come_from_the_clusters_configmap() -> None:
    data = {
        "requestheader-client-ca-file": "-----BEGIN CERTIFICATE-----\n...",
        "requestheader-allowed-names": '["front-proxy-client"]',
        "requestheader-username-headers": '["X-Remote-User"]',
        "requestheader-group-headers": '["X-Remote-Group"]',
        "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
    }
    front = front_proxy_of(data)
    assert front is not None and front.allowed_names == ("front-proxy-client",)
    assert front.extra_headers_prefixes == ("X-Remote-Extra-",)
    assert front_proxy_of({"client-ca-file": "..."}) is None  # no aggregation layer
    broken = front_proxy_of({**data, "requestheader-allowed-names": "not json"})
    assert broken is not None and broken.allowed_names == ()


def _pod(
    name: str, *, ready: bool = True, wedged: bool = False, inflight: float = 2.0, **kw: float | None
) -> PodLoad:
    return PodLoad(
        name=name,
        ready=ready,
        wedged=wedged,
        inflight=inflight,
        queue_age=kw.get("queue_age"),
        pages_in_use=kw.get("pages_in_use"),
    )


def test_a_roles_load_counts_ready_unwedged_pods_only() -> None:
    load = summarise(
        [
            _pod("a", inflight=2.0, queue_age=1.0, pages_in_use=10.0),
            _pod("b", inflight=3.0, queue_age=4.0),
            _pod("wedged", wedged=True, inflight=50.0, queue_age=900.0, pages_in_use=99.0),
            _pod("starting", ready=False, inflight=7.0),
        ],
        observed_at=5.0,
    )
    assert (load.pods, load.inflight, load.pages_in_use, load.queue_age) == (2, 5.0, 10.0, 4.0)
    empty = summarise([_pod("w", wedged=True)], observed_at=5.0)
    assert (empty.pods, empty.inflight, empty.pages_in_use, empty.queue_age) == (0, 0.0, None, None)


def test_loads_go_stale_and_are_forgotten_with_their_model() -> None:
    loads = RoleLoads()
    loads.record("ns", "a", "prefill", _load())
    loads.record("ns", "a", "decode", _load())
    loads.record("other", "a", "prefill", _load())
    assert set(loads.in_namespace("ns", fresh_since=0.0)) == {("ns", "a", "prefill"), ("ns", "a", "decode")}
    assert loads.in_namespace("ns", fresh_since=2_000_000_000.0) == {}
    loads.forget("ns", "a", ["decode"])
    assert set(loads.in_namespace("ns", 0.0)) == {("ns", "a", "prefill")}
    loads.forget("ns", "a")
    assert loads.in_namespace("ns", 0.0) == {}
    assert set(loads.in_namespace("other", 0.0)) == {("other", "a", "prefill")}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--external-metrics-port", "6443"], "needs --external-metrics-tls-dir"),
        (
            ["--external-metrics-port", "6443", "--external-metrics-tls-dir", "{empty}"],
            "has no tls.crt or tls.key",
        ),
        (["--external-metrics-port", "70000"], "70000 is not in the range"),
    ],
)
def test_the_api_needs_its_certificate_before_the_operator_starts(
    flags: list[str], message: str, tmp_path: Path
) -> None:
    from pdwarden_operator.cli import operator

    args = [f.replace("{empty}", str(tmp_path)) for f in flags]
    result = CliRunner().invoke(operator, ["run", "--no-leader-elect", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def _api_counting_reviews(monkeypatch: pytest.MonkeyPatch) -> tuple[em.ExternalMetricsApi, list[str]]:
    """The API with the SubjectAccessReview replaced by a recorder that allows everything (the
    review's own call is the cluster's; what is tested here is when it is made)."""
    asked: list[str] = []

    async def may(
        client: KubeClient, user: str, groups: object, extra: object, attributes: dict[str, str]
    ) -> tuple[bool, str]:
        asked.append(f"{user}/{attributes['namespace']}/{attributes['resource']}")
        return True, ""

    monkeypatch.setattr(em.access, "may", may)
    front = FrontProxy("", (), ("X-Remote-User",), ("X-Remote-Group",), ())
    return em.ExternalMetricsApi(unreachable_client(), front), asked


def test_a_made_up_metric_is_refused_before_any_access_review(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from aiohttp.test_utils import make_mocked_request

    api, asked = _api_counting_reviews(monkeypatch)
    caller = em.Caller("alice", (), ())
    monkeypatch.setattr(api, "_caller", lambda _request: caller)
    request = make_mocked_request(
        "GET", "/apis/x/namespaces/ns/nonsense", match_info={"namespace": "ns", "metric": "nonsense"}
    )
    response = asyncio.run(api._values(request))
    assert response.status == 404 and asked == []


def test_access_reviews_are_remembered_least_recently_used_first(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    api, asked = _api_counting_reviews(monkeypatch)
    metric = next(iter(em.METRICS))

    async def reviews() -> None:
        first = em.Caller("first", (), ())
        await api._review(first, "ns", metric)
        for i in range(em.REVIEW_CACHE_MAX):  # one more caller than the cache holds, in all
            await api._review(first, "ns", metric)  # the first kept in use all along
            await api._review(em.Caller(f"u{i}", (), ()), "ns", metric)

    asyncio.run(reviews())
    assert len(api._reviews) == em.REVIEW_CACHE_MAX  # bounded, never cleared wholesale
    assert asked.count("first/ns/" + metric) == 1  # in use: never evicted, never asked again
    assert len(asked) == em.REVIEW_CACHE_MAX + 1

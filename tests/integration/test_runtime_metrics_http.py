"""The runtime's /metrics served over HTTP: its own server and the aiohttp handler."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

import pdwarden_contract as c
from pdwarden_runtime.metrics import exposition, metrics_handler, serve_metrics
from tests.support.runtime_metrics import CONTRACT_FAMILIES, runtime

pytestmark = pytest.mark.integration


def test_serve_metrics_over_http_and_stop() -> None:
    *_, metrics = runtime()
    server = serve_metrics(metrics.registry, "127.0.0.1", 0)
    try:
        with urllib.request.urlopen(server.url, timeout=10) as response:
            body = response.read().decode()
            assert response.headers["Content-Type"].startswith("text/plain")
        assert {f.name for f in text_string_to_metric_families(body)} >= set(CONTRACT_FAMILIES)
    finally:
        server.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=2)


async def test_aiohttp_handler_serves_the_registry() -> None:
    *_, metrics = runtime(c.ROLE_DECODE)
    app = web.Application()
    app.router.add_get(c.METRICS_PATH, metrics_handler(metrics.registry))
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        response = await client.get(c.METRICS_PATH)
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        body = await response.text()
    families = {f.name: f.type for f in text_string_to_metric_families(body)}
    assert families == {**families, **CONTRACT_FAMILIES}
    assert 'role="decode"' in body
    assert exposition(metrics.registry)[0].decode().count("\n") == body.count("\n")


def _families(body: str) -> dict[str, int]:
    """family -> its samples, each family of the body (one with no sample too)."""
    return {f.name: len(f.samples) for f in text_string_to_metric_families(body)}


NAMED = (c.METRIC_KV_PEER_TRANSFERS_TOTAL, c.METRIC_KV_ROOMS, c.METRIC_INFLIGHT_REQUESTS)


def _named_url(base: str) -> str:
    return f"{base}?{urllib.parse.urlencode([(c.METRICS_NAME_PARAM, n) for n in NAMED])}"


def _only_the_named_families_whole(body: str, full: str) -> None:
    got, everything = _families(body), _families(full)
    # the counter's family is named without `_total`; with no peer yet it has no sample, and
    # its TYPE line is still there (it says the runtime has the metric)
    assert got == {
        c.METRIC_KV_PEER_TRANSFERS_BASE: 0,
        c.METRIC_KV_ROOMS: everything[c.METRIC_KV_ROOMS],
        c.METRIC_INFLIGHT_REQUESTS: 1,
    }, got
    assert everything[c.METRIC_KV_ROOMS] > 1 and len(everything) > len(got)


def test_both_servers_answer_a_scrape_that_names_metrics_with_their_whole_families() -> None:
    *_, metrics = runtime()
    full = exposition(metrics.registry)[0].decode()
    server = serve_metrics(metrics.registry, "127.0.0.1", 0)
    try:
        with urllib.request.urlopen(_named_url(server.url), timeout=10) as response:
            _only_the_named_families_whole(response.read().decode(), full)
    finally:
        server.stop()


async def test_the_aiohttp_handler_answers_a_scrape_that_names_metrics_with_their_whole_families() -> None:
    *_, metrics = runtime()
    full = exposition(metrics.registry)[0].decode()
    app = web.Application()
    app.router.add_get(c.METRICS_PATH, metrics_handler(metrics.registry))
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        response = await client.get(_named_url(c.METRICS_PATH))
        assert response.status == 200
        _only_the_named_families_whole(await response.text(), full)

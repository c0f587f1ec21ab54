"""The scraper over real HTTP: slow, huge, broken and absent endpoints become errors, never exceptions."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings

from pdwarden_operator.watchdog.parse import PodSample
from pdwarden_operator.watchdog.scrape import Scraper, ScrapeTarget
from pdwarden_testkit.ports import free_port
from tests.unit.test_watchdog_fuzz import hostile

pytestmark = pytest.mark.integration

HOST = "127.0.209.1"  # not 127.0.0.1: its ephemeral client ports may sit on ours
GOOD = (
    "# TYPE pdwarden_inflight_requests gauge\npdwarden_inflight_requests 2\n"
    "# TYPE pdwarden_inflight_oldest_age_seconds gauge\npdwarden_inflight_oldest_age_seconds 1.5\n"
    "# TYPE pdwarden_kv_transfers_total counter\n"
    'pdwarden_kv_transfers_total{outcome="success"} 7\npdwarden_kv_transfers_total{outcome="failed"} 1\n'
)


async def good(_: web.Request) -> web.Response:
    return web.Response(text=GOOD)


async def slow(_: web.Request) -> web.Response:
    await asyncio.sleep(2.5)
    return web.Response(text=GOOD)


async def huge_streamed(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()
    await resp.prepare(request)
    for _ in range(200):  # 12.8 MiB without a Content-Length
        await resp.write(b"#" * 65536)
    return resp


async def huge_sized(_: web.Request) -> web.Response:
    return web.Response(body=b"#" * (2 << 20))  # 2 MiB with its Content-Length: refused unread


async def padded(_: web.Request) -> web.Response:
    # a good body past the size read whole, with its Content-Length: read in chunks instead
    return web.Response(text="# padding\n" * 10_000 + GOOD)


async def cut_short(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Length": "4096"})
    await resp.prepare(request)
    await resp.write(GOOD.encode())  # fewer bytes than it said, then the connection closes
    assert request.transport is not None
    request.transport.close()
    return resp


async def binary(_: web.Request) -> web.Response:
    return web.Response(body=bytes(range(256)) * 10)


async def error(_: web.Request) -> web.Response:
    return web.Response(status=503, text="overloaded")


async def redirect(_: web.Request) -> web.Response:
    raise web.HTTPFound("/good")


async def reset(request: web.Request) -> web.Response:
    assert request.transport is not None
    request.transport.close()
    return web.Response(text="")


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = web.Application()
    for path, handler in [
        ("/good", good),
        ("/slow", slow),
        ("/huge", huge_streamed),
        ("/huge-sized", huge_sized),
        ("/padded", padded),
        ("/cut-short", cut_short),
        ("/binary", binary),
        ("/error", error),
        ("/redirect", redirect),
        ("/reset", reset),
    ]:
        app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port(HOST)
    site = web.TCPSite(runner, HOST, port)
    await site.start()
    try:
        yield f"http://{HOST}:{port}"
    finally:
        await runner.cleanup()


async def test_every_failure_is_reported_per_pod_and_the_round_completes(server: str) -> None:
    scraper = Scraper(concurrency=4, timeout_seconds=1.0, max_bytes=1 << 20)
    try:
        names = [
            "good",
            "slow",
            "huge",
            "huge-sized",
            "padded",
            "cut-short",
            "binary",
            "error",
            "redirect",
            "reset",
        ]
        targets = [ScrapeTarget(n, f"{server}/{n}") for n in names]
        targets.append(ScrapeTarget("closed", f"http://{HOST}:{free_port(HOST)}/metrics"))  # nobody listens
        results = await asyncio.wait_for(scraper.scrape(targets), timeout=20)
        by_key = {r.key: r for r in results}
        assert [r.key for r in results] == [*names, "closed"]
        ok = by_key["good"]
        assert ok.error is None and ok.sample is not None
        assert (ok.sample.inflight, ok.sample.oldest_age, ok.sample.transfers) == (2, 1.5, 8)
        assert by_key["slow"].error == "timeout after 1s"
        assert "exceeds the limit" in (by_key["huge"].error or "")
        assert by_key["huge-sized"].error == f"body of {2 << 20} bytes exceeds the limit of {1 << 20}"
        assert by_key["padded"].error is None and by_key["padded"].sample == ok.sample
        assert by_key["cut-short"].sample is None and "ClientPayloadError" in (
            by_key["cut-short"].error or ""
        )
        assert by_key["binary"].error == "body is not UTF-8"
        assert by_key["error"].error == f"HTTP 503 from {server}/error"
        assert "HTTP 302" in (by_key["redirect"].error or "")
        assert by_key["reset"].sample is None and by_key["reset"].error
        assert by_key["closed"].sample is None and "ClientConnectorError" in (by_key["closed"].error or "")
        # the session survives: a second round over the good endpoint reuses it
        again = await scraper.scrape([ScrapeTarget("good", f"{server}/good")])
        assert again[0].sample == ok.sample
    finally:
        await scraper.close()


async def test_operator_metrics_are_served_over_http() -> None:
    import aiohttp

    from pdwarden_operator.metrics import OperatorMetrics, serve

    metrics = OperatorMetrics()
    metrics.remediations.labels("it-ns", "it-model", "restart", "deleted").inc()
    port = free_port(HOST)
    server = serve(metrics, port, HOST)
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://{HOST}:{port}/metrics") as resp:
            text = await resp.text()
        assert resp.status == 200
        assert (
            'pdwarden_operator_remediations_total{action="restart",model="it-model",namespace="it-ns",'
            'outcome="deleted"} 1.0'
        ) in text
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class HostileServer:
    url: str
    body: bytes = b""  # what the endpoint serves next


@pytest.fixture(scope="module")
def hostile_server() -> Iterator[HostileServer]:
    """A real HTTP endpoint on its own thread serving whatever body the test sets."""
    port = free_port(HOST)
    current = HostileServer(url=f"http://{HOST}:{port}/metrics")

    async def serve_current(_: web.Request) -> web.Response:
        return web.Response(body=current.body, content_type="text/plain")

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_get("/metrics", serve_current)
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, HOST, port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield current
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=hostile())
def test_hostile_bodies_over_http_never_escape_the_scraper(
    hostile_server: HostileServer, body: str | bytes
) -> None:
    hostile_server.body = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body

    async def once() -> None:
        scraper = Scraper(concurrency=1, timeout_seconds=5.0, max_bytes=64 * 1024)
        try:
            (result,) = await scraper.scrape([ScrapeTarget("p", hostile_server.url)])
        finally:
            await scraper.close()
        if result.sample is None:
            assert result.error
        else:
            s = result.sample
            assert all(math.isfinite(v) and v >= 0 for v in (s.inflight, s.oldest_age, s.transfers))

    asyncio.run(once())


async def test_a_scrape_asks_the_runtime_for_what_the_watchdog_reads_and_reads_it_whole() -> None:
    """Against a runtime's own handler: the request names METRICS_READ, the answer is a fraction
    of the body and reads as the whole one."""
    from pdwarden_contract import METRICS_NAME_PARAM, METRICS_PATH
    from pdwarden_operator.watchdog.parse import METRICS_READ, parse_metrics
    from pdwarden_runtime.metrics import exposition, metrics_handler
    from tests.support.runtime_metrics import runtime

    *_, metrics = runtime()
    asked: list[list[str]] = []
    sent: list[int] = []
    serve = metrics_handler(metrics.registry)

    async def handler(request: web.Request) -> web.Response:
        asked.append(request.query.getall(METRICS_NAME_PARAM, []))
        response = await serve(request)
        sent.append(len(response.body or b""))  # type: ignore[arg-type]
        return response

    app = web.Application()
    app.router.add_get(METRICS_PATH, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port(HOST)
    await web.TCPSite(runner, HOST, port).start()
    scraper = Scraper(concurrency=1, timeout_seconds=5.0)
    try:
        (result,) = await scraper.scrape([ScrapeTarget("p", f"http://{HOST}:{port}{METRICS_PATH}")])
    finally:
        await scraper.close()
        await runner.cleanup()
    assert asked == [list(METRICS_READ)]
    whole = exposition(metrics.registry)[0]
    assert sent[0] * 2 < len(whole), (sent, len(whole))
    assert result.error is None and result.sample == parse_metrics(whole)


async def test_a_body_that_reads_as_the_pods_last_is_not_parsed_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An idle pod's body is the same scrape after scrape: its last sample stands. A body that
    differs, the same body checked against other peers or sent by another pod, a body that did
    not parse (each time), a pod's body after a round without it, and a body too large to parse
    on the loop are each parsed."""
    from pdwarden_operator.watchdog import scrape as scrape_module
    from pdwarden_operator.watchdog.parse import parse_metrics

    parsed: list[str] = []

    def counting(body: bytes | bytearray, **kwargs: object) -> object:
        parsed.append(bytes(body).decode(errors="replace"))
        return parse_metrics(body, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(scrape_module, "parse_metrics", counting)
    bodies = {"p": GOOD, "q": GOOD}

    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=bodies[request.match_info["pod"]])

    app = web.Application()
    app.router.add_get("/{pod}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port(HOST)
    await web.TCPSite(runner, HOST, port).start()
    scraper = Scraper(concurrency=2, timeout_seconds=5.0)
    peers = frozenset({"198.18.0.7"})

    async def scrape(*keys: str, with_peers: frozenset[str] | None = peers) -> list[PodSample | None]:
        targets = [ScrapeTarget(k, f"http://{HOST}:{port}/{k}", with_peers) for k in keys]
        return [r.sample for r in await scraper.scrape(targets)]

    try:
        (first,) = await scrape("p")
        (again,) = await scrape("p")
        assert first is not None and again is first and len(parsed) == 1
        (same_body_other_pod,) = await scrape("q")  # a pod's own last body only
        assert same_body_other_pod == first and len(parsed) == 2
        (other_peers,) = await scrape("p", with_peers=frozenset({"198.18.0.8"}))
        assert other_peers == first and len(parsed) == 3
        bodies["p"] = GOOD.replace("pdwarden_inflight_requests 2", "pdwarden_inflight_requests 3")
        (moved,) = await scrape("p", with_peers=frozenset({"198.18.0.8"}))
        assert moved is not None and moved.inflight == 3 and len(parsed) == 4
        bodies["p"] = "garbage"
        assert await scrape("p") == [None] and len(parsed) == 5
        assert await scrape("p") == [None] and len(parsed) == 6  # a refusal is not remembered
        bodies["p"] = GOOD
        (back,) = await scrape("p")
        assert back == first and len(parsed) == 7
        await scrape("q")  # p is not a target of this round: what it sent is forgotten
        (after_a_gap,) = await scrape("p")
        assert after_a_gap == first and len(parsed) == 9
        # a body past what is parsed on the loop goes to a parse worker each time, unhashed
        bodies["p"] = "# padding\n" * 10_000 + GOOD
        assert await scrape("p") == await scrape("p") == [first] and len(parsed) == 11
    finally:
        await scraper.close()
        await runner.cleanup()

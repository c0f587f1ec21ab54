"""The operator-wide scrape budget over real HTTP (aiohttp servers on loopback): every model's
Scraper together stays within one slot limit and one byte budget, a busy budget makes a pod
unobserved instead of stalling the round, and bodies are parsed off the event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from pdwarden_operator.watchdog import scrape
from pdwarden_operator.watchdog.budget import ScrapeBudget
from pdwarden_operator.watchdog.scrape import Scraper, ScrapeTarget
from pdwarden_testkit.ports import free_port

pytestmark = pytest.mark.integration

HOST = "127.0.209.2"
GOOD = (
    b"# TYPE pdwarden_inflight_requests gauge\npdwarden_inflight_requests 2\n"
    b"# TYPE pdwarden_inflight_oldest_age_seconds gauge\npdwarden_inflight_oldest_age_seconds 1.5\n"
    b"# TYPE pdwarden_kv_transfers_total counter\n"
    b'pdwarden_kv_transfers_total{outcome="success"} 7\n'
)
# a body that parses, padded with lines the watchdog does not read up to `size` bytes
PAD = b"# " + b"p" * 1021 + b"\n"


def padded(size: int) -> bytes:
    return GOOD + PAD * ((size - len(GOOD)) // len(PAD))


BIG = padded(900 << 10)
LARGE = padded(1 << 20)
MIB = 1 << 20


@dataclass
class Server:
    url: str
    in_flight: int = 0
    max_in_flight: int = 0
    slow_started: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    port = free_port(HOST)
    state = Server(url=f"http://{HOST}:{port}")

    async def hold(_: web.Request) -> web.Response:
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            await asyncio.sleep(0.2)
        finally:
            state.in_flight -= 1
        return web.Response(body=GOOD)

    async def slow(_: web.Request) -> web.Response:
        state.slow_started.set()
        await asyncio.sleep(3)
        return web.Response(body=GOOD)

    async def chunked(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        body = padded(200 << 10)
        for i in range(0, len(body), 16 << 10):
            await resp.write(body[i : i + (16 << 10)])
        return resp

    app = web.Application()
    app.router.add_get("/hold", hold)
    app.router.add_get("/slow", slow)
    app.router.add_get("/chunked", chunked)
    for path, body in (("/good", GOOD), ("/big", BIG), ("/large", LARGE)):
        app.router.add_get(path, _serving(body))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, HOST, port).start()
    try:
        yield state
    finally:
        await runner.cleanup()


def _serving(body: bytes) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(_: web.Request) -> web.Response:
        return web.Response(body=body)

    return handle


async def scrape_models(budget: ScrapeBudget, paths: list[list[str]], server: Server, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    """One Scraper per model, all at once, on the same budget; every model's results."""
    scrapers = [Scraper(concurrency=10, timeout_seconds=timeout, budget=budget) for _ in paths]
    try:
        return await asyncio.gather(
            *(
                s.scrape([ScrapeTarget(f"m{m}-{i}", f"{server.url}/{p}") for i, p in enumerate(model)])
                for m, (s, model) in enumerate(zip(scrapers, paths, strict=True))
            )
        )
    finally:
        for s in scrapers:
            await s.close()


async def test_all_models_together_stay_within_the_operator_wide_slots(server: Server) -> None:
    budget = ScrapeBudget(max_scrapes=3)
    try:
        per_model = await scrape_models(budget, [["hold"] * 6 for _ in range(5)], server)
    finally:
        budget.close()
    results = [r for model in per_model for r in model]
    assert len(results) == 30 and all(r.sample is not None for r in results), results
    assert 1 <= server.max_in_flight <= 3 and budget.slots.peak == 3  # 5 models x 10 each asked
    assert budget.slots.used == 0 and budget.bytes.used == 0


async def test_bodies_held_at_once_stay_within_the_byte_budget(server: Server) -> None:
    budget = ScrapeBudget(max_scrapes=64, max_bytes_in_flight=2 * MIB, max_body=MIB)
    try:
        per_model = await scrape_models(budget, [["big", "big", "good"] for _ in range(8)], server)
    finally:
        budget.close()
    results = [r for model in per_model for r in model]
    assert all(r.sample is not None and r.sample.transfers == 7 for r in results), results
    # 16 bodies of 900 KiB asked for at once; at most two were ever held together
    assert len(BIG) <= budget.bytes.peak <= 2 * MIB
    assert budget.bytes.used == 0 and budget.slots.used == 0


async def test_a_body_reserves_its_length_or_a_first_share_that_grows(server: Server) -> None:
    sized = ScrapeBudget()
    chunked = ScrapeBudget(first_reservation=64 << 10)
    try:
        ((good,),) = await scrape_models(sized, [["good"]], server)
        ((streamed,),) = await scrape_models(chunked, [["chunked"]], server)
    finally:
        sized.close()
        chunked.close()
    assert good.sample is not None and sized.bytes.peak == len(GOOD)  # its Content-Length
    # no Content-Length: 64 KiB first, then up to the scraper's limit once the body is longer
    assert streamed.sample is not None and chunked.bytes.peak == MIB
    assert sized.bytes.used == 0 and chunked.bytes.used == 0


async def test_a_busy_budget_makes_the_pod_unobserved_and_the_round_ends(server: Server) -> None:
    budget = ScrapeBudget(max_scrapes=1)
    slow_model = Scraper(timeout_seconds=10.0, budget=budget)
    other_model = Scraper(timeout_seconds=0.5, budget=budget)
    try:
        holding = asyncio.create_task(slow_model.scrape([ScrapeTarget("slow", f"{server.url}/slow")]))
        await asyncio.wait_for(server.slow_started.wait(), 10)
        (waited,) = await other_model.scrape([ScrapeTarget("good", f"{server.url}/good")])
        (held,) = await holding
    finally:
        await slow_model.close()
        await other_model.close()
        budget.close()
    assert waited.sample is None and waited.error == "no scrape slot within 0.5s (operator-wide limit 1)"
    assert held.sample is not None and held.error is None
    assert budget.slots.used == 0


async def test_a_large_body_is_parsed_off_the_event_loop(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parse of a 1 MiB body can only finish if the event loop keeps running meanwhile:
    a task on the loop lets it go on. Parsed on the loop, it would wait for itself."""
    parsing = threading.Event()
    loop_ran = threading.Event()
    threads: list[str] = []
    real_parse = scrape.parse_metrics

    def parse_needing_the_loop(body: bytes, **kwargs):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread().name)
        parsing.set()
        assert loop_ran.wait(timeout=30), "the event loop did not run while the body was parsed"
        return real_parse(body, **kwargs)

    async def tick() -> int:
        ticks = 0
        while not loop_ran.is_set():
            await asyncio.sleep(0.01)
            ticks += 1
            if parsing.is_set():
                loop_ran.set()
        return ticks

    monkeypatch.setattr(scrape, "parse_metrics", parse_needing_the_loop)
    budget = ScrapeBudget()
    try:
        ticker = asyncio.create_task(tick())
        ((result,),) = await scrape_models(budget, [["large"]], server, timeout=30.0)
        ticks = await asyncio.wait_for(ticker, 5)
    finally:
        budget.close()
    assert result.error is None and result.sample is not None and result.sample.inflight == 2
    assert len(LARGE) > MIB - len(PAD) and ticks >= 1
    assert threads and threads[0].startswith("pdwarden-parse")

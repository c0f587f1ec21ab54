"""The operator's API client under a burst larger than its connection pool, against a real HTTP
server on loopback: a request's timeout counts from when it has a connection, so requests
queued behind the pool wait their turn instead of failing against a server that answers every
one in time; a request the server holds longer than the timeout still fails, as no response."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import certifi
import pytest
from aiohttp import web

from pdwarden_operator.kube.client import KubeApiError, KubeClient
from pdwarden_operator.kube.credentials import Credentials

pytestmark = pytest.mark.integration

ANSWER_S = 0.2  # the server's time per request
POOL = 2
BURST = 20  # ten rounds of the pool: two seconds in all, well past the timeout
TIMEOUT_S = 1.0


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[int]]]:
    """An API server stand-in: answers each request after ANSWER_S (or `?hold=S` seconds);
    records how many requests it held at once."""
    inflight = [0, 0]  # now, most

    async def answer(request: web.Request) -> web.Response:
        inflight[0] += 1
        inflight[1] = max(inflight)
        try:
            await asyncio.sleep(float(request.query.get("hold", ANSWER_S)))
        finally:
            inflight[0] -= 1
        return web.json_response({"kind": "Status", "path": request.path})

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", inflight
    await runner.cleanup()


@pytest.fixture
async def client(server: tuple[str, list[int]]) -> AsyncIterator[KubeClient]:
    kube = KubeClient(Credentials(server=server[0], ca_file=Path(certifi.where())), POOL, TIMEOUT_S)
    yield kube
    await kube.aclose()


async def test_a_burst_past_the_pool_waits_its_turn_and_every_request_is_answered(
    server: tuple[str, list[int]], client: KubeClient
) -> None:
    answers = await asyncio.gather(*(client.request("GET", f"/api/v1/n{i}") for i in range(BURST)))
    assert [a["path"] for a in answers] == [f"/api/v1/n{i}" for i in range(BURST)]
    assert server[1][1] == POOL  # the pool bounded what the server held at once


async def test_a_request_the_server_holds_past_the_timeout_fails_as_no_response(client: KubeClient) -> None:
    with pytest.raises(KubeApiError) as raised:
        await client.request("GET", "/api/v1/slow", query=[("hold", str(TIMEOUT_S * 3))])
    assert raised.value.status == 0 and raised.value.retriable
    assert "TimeoutError" in str(raised.value)

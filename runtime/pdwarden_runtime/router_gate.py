"""`pdwarden runtime router`: SGLang's router (smg) behind the model's worker key.

smg sends its workers the key of its own ``--api-key`` on health checks and metadata reads,
but on the prefill and decode legs of a PD request it forwards only the client's
``Authorization`` header, and it requires that same key from its clients. So the router pod
runs smg on loopback with ``--api-key <worker key>`` and this gate on the pod's address: every
client request is passed to smg with ``Authorization: Bearer <worker key>`` in place of the
client's own, and the answer (streamed or not) is passed back unchanged. Clients of the model
need no key; the workers take PD requests only from the router.

A client that disconnects ends its upstream request at once (the handler is cancelled and the
upstream connection closed), so a cancellation still reaches smg and both legs. smg is this
process's child: the gate exits with it, and a stop (SIGTERM) reaches it after the contract's
TERMINATION_DRAIN_S of serving on, while the pod leaves its Service's endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Mapping, Sequence
from typing import Final

import aiohttp
from aiohttp import web

import pdwarden_contract as c
from pdwarden_runtime.worker_key import bearer

log = logging.getLogger(__name__)

# Hop-by-hop headers (RFC 9110 7.6.1) are the gate's own to set; Host and Authorization are
# replaced; Content-Length follows the body as read.
_REQUEST_DROP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "authorization",
        "content-length",
    }
)
_RESPONSE_DROP: Final = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "te", "trailer", "transfer-encoding", "upgrade"}
)
# Requests are prompts: the runtime's own HTTP port takes the same size.
MAX_BODY_BYTES: Final = 64 * 1024 * 1024
# After a stop the gate serves on for contract.TERMINATION_DRAIN_S before it stops smg; then
# smg has this long to finish before it is killed (both inside a pod's 30 s grace).
STOP_GRACE_S: Final = 20.0


def upstream_headers(headers: Mapping[str, str], key: str) -> dict[str, str]:
    """The client's headers as smg gets them: hop-by-hop ones dropped, the key presented."""
    out = {k: v for k, v in headers.items() if k.lower() not in _REQUEST_DROP}
    out["Authorization"] = bearer(key)
    return out


def downstream_headers(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """smg's answer headers as the client gets them (every Set-Cookie kept)."""
    return [(k, v) for k, v in headers.items() if k.lower() not in _RESPONSE_DROP]


class Gate:
    """An aiohttp app that passes every request to smg at `upstream` with the key."""

    def __init__(self, upstream: str, key: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.key = key
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        # No pool limit (smg bounds its own concurrency); bytes pass through undecoded.
        connector = aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None, "Gate.start() first"
        body = await request.read()
        url = f"{self.upstream}{request.rel_url}"
        headers = upstream_headers(request.headers, self.key)
        try:
            upstream = await self._session.request(
                request.method, url, headers=headers, data=body or None, allow_redirects=False
            )
        except aiohttp.ClientError as err:
            return web.json_response(
                {"error": {"message": f"the router is not answering yet: {err}"}}, status=502
            )
        try:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            response.headers.extend(downstream_headers(upstream.headers))
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
        except BaseException:
            upstream.close()  # a cancelled or failed pass-through ends smg's request too
            raise
        finally:
            upstream.release()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(lambda _app: self.start())
        app.on_cleanup.append(lambda _app: self.close())
        return app


def router_command(router_args: Sequence[str], key: str) -> list[str]:
    """smg's command with the key as its --api-key (only this process ever shows it). One
    token, `--api-key=KEY`: a key that starts with "-" (a urlsafe key does, one time in 64)
    would otherwise be read as an option and smg would refuse to start."""
    return [*router_args, f"--api-key={key}"]


async def run(host: str, port: int, router_port: int, key: str, router_args: Sequence[str]) -> int:
    """Serve the gate and run smg until smg exits or a stop arrives; smg's exit status."""
    # In the gate's process group: whatever stops the group (a kubelet, a test) stops smg too.
    proc = await asyncio.create_subprocess_exec(*router_command(router_args, key))
    gate = Gate(f"http://127.0.0.1:{router_port}", key)
    runner = web.AppRunner(gate.app(), handler_cancellation=True, access_log=None, shutdown_timeout=5)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await web.TCPSite(runner, host=host, port=port, reuse_address=True).start()
        log.warning("router gate on %s:%s, smg on 127.0.0.1:%s", host, port, router_port)
        exited = asyncio.ensure_future(proc.wait())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not stop.is_set():
            code = exited.result()
            log.error("smg exited with status %s", code)
            return code if code >= 0 else 128 - code
        if not exited.done():
            log.warning("stopping: serving %.0f s more, then stopping smg", c.TERMINATION_DRAIN_S)
            await asyncio.wait({exited}, timeout=c.TERMINATION_DRAIN_S)
        if not exited.done():
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(exited), STOP_GRACE_S)
            except TimeoutError:
                proc.kill()
        return 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            if proc.returncode is None:
                proc.kill()
        await runner.cleanup()

"""`pdwarden runtime router`: the model's front door, a gate in front of SGLang's router (smg).

The router pod runs smg on loopback and this gate on the pod's address. The gate is what
clients reach, and it passes on only the serving routes (`SERVING_ROUTES`: generate,
completions, chat, embeddings, models, health and readiness); every other path, smg's control
plane among them (workers, loads, cache flushes, profiles), answers 403 without reaching smg.
smg gets a control-plane key of its own (`--control-plane-api-keys`) that the gate makes at
start and never presents, so no one, the gate included, can call that control plane: workers
come only from smg's discovery.

With the model's worker key, smg runs with it as its ``--api-key``: smg sends it to its workers
on health checks and metadata reads, but on the prefill and decode legs of a PD request it
forwards only the client's ``Authorization`` header, and it requires that same key from its
clients. So the gate presents ``Authorization: Bearer <worker key>`` in place of the client's
own header (without the key, it drops the client's header). Clients of the model need no key.

The gate streams bodies both ways and bounds what it holds: a body over `MAX_BODY_BYTES`, a body
that stalls for `BODY_IDLE_S`, requests over `MAX_IN_FLIGHT`, and bodies over
`MAX_BODY_BYTES_IN_FLIGHT` in all (smg buffers each request whole) are refused rather than let
a few dozen large uploads exhaust the pod's memory.

smg switches on its multi-model mode under discovery and there refuses a native `/generate` that
names no model; with the model's served name (`--served-model-name`) the gate adds `"model"` to
such a JSON body as it streams through (`gate_model`). A model smg does not serve is smg's 404.

smg answers 503 `no_available_workers` without retrying while its circuit breakers hold every
worker of a role out (a burst of failures through one wedged pod can open them all for a
second); no worker saw such a request, so the gate sends it again once a breaker lets one
through (`gate_replay`), when its body was small enough to keep.

A client that disconnects ends its upstream request at once (the handler is cancelled and the
upstream connection closed), so a cancellation still reaches smg and both legs. A stop (SIGTERM)
drains: the gate answers its readiness 503 and closes each connection after its answer, serves
on for the contract's TERMINATION_DRAIN_S while the pod leaves its Service's endpoints, stops
listening, lets the requests in flight finish, and only then stops smg. smg runs in a session
of its own (a signal to the gate's process group does not stop it first) and dies with the gate.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import secrets
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Final

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler
from yarl import URL

import pdwarden_contract as c
from pdwarden_runtime.gate_model import ModelFill, wants_model
from pdwarden_runtime.gate_replay import (
    NO_WORKERS_RETRY_DELAYS_S,
    REPLAYABLE_BODY_BYTES,
    Replay,
    is_no_workers_answer,
    may_be_no_workers_answer,
)
from pdwarden_runtime.worker_key import bearer

log = logging.getLogger(__name__)

_GET: Final = frozenset({"GET", "HEAD"})
_POST: Final = frozenset({"POST"})
# What a client of the model may call, by exact path: SGLang's native API and OpenAI's, and the
# probes. Not here, so refused: smg's control plane (/workers, /get_loads, /flush_cache,
# /start_profile, /stop_profile, /heap_profile, /wasm, /parse/*, /v1/tokenizers, ...), the
# workers' admin routes smg would fan out, /get_server_info (the workers' server arguments),
# and stored responses and conversations (/v1/responses, /v1/conversations: every client of
# the gate is one tenant to smg, so one client could read another's).
SERVING_ROUTES: Final[Mapping[str, frozenset[str]]] = {
    c.GENERATE_PATH: _POST,
    "/v1/completions": _POST,
    "/v1/chat/completions": _POST,
    "/v1/embeddings": _POST,
    "/v1/rerank": _POST,
    "/rerank": _POST,
    "/v1/models": _GET,
    "/get_model_info": _GET,
    c.HEALTH_PATH: _GET,
    c.HEALTH_GENERATE_PATH: _GET,
    "/liveness": _GET,
    "/readiness": _GET,
}
# OpenAI's "retrieve a model": /v1/models/<one segment>.
_MODEL_PREFIX: Final = "/v1/models/"
READINESS_PATH: Final = "/readiness"

# Hop-by-hop headers (RFC 9110 7.6.1) are the gate's own to set; Host and Authorization are
# replaced; the body is streamed, so its framing is the gate's own too.
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
# What a worker takes, less room for what smg adds to a body it passes on (the bootstrap
# fields): a body the gate lets through is one the workers take.
MAX_BODY_BYTES: Final = c.MAX_REQUEST_BODY_BYTES - 1024 * 1024
# smg holds each request's body whole (and more while it parses it), and the gate keeps a copy
# of a small one to send again: the bodies the gate lets through at once stay within a fraction
# of the router's memory limit (contract's 2 GiB).
MAX_BODY_BYTES_IN_FLIGHT: Final = 160 * 1024 * 1024
# A body waits this long for room under that bound before it is refused (503, Retry-After).
BODY_BUDGET_WAIT_S: Final = 10.0
# A body is reserved in steps of this much while it streams in without a Content-Length.
_CHUNKED_STEP: Final = 1024 * 1024
# Requests in flight through the gate; past it, 503 at once (smg's own queue is behind it).
MAX_IN_FLIGHT: Final = 1024
# A body that sends nothing for this long is abandoned (the client is gone or stalling).
BODY_IDLE_S: Final = 30.0
# An idle keep-alive connection is closed after this long.
KEEPALIVE_S: Final = 30.0
# After the drain, requests in flight get this long to finish before smg is stopped; then smg
# has STOP_GRACE_S (all inside a pod's 30 s grace: 5 + 20 + 3).
IN_FLIGHT_GRACE_S: Final = 20.0
STOP_GRACE_S: Final = 3.0
# smg's control-plane key names: "id:name:role:key" (smg's --control-plane-api-keys).
CONTROL_PLANE_KEY_ID: Final = "pdwarden-gate"


class Verdict(Enum):
    SERVE = 200
    FORBIDDEN = 403
    METHOD_NOT_ALLOWED = 405


def route_verdict(method: str, raw_path: str) -> Verdict:
    """Whether a client may call `method` on `raw_path` (the request target as sent, query
    included). The path must be one of SERVING_ROUTES exactly as written: no percent-encoding,
    dot segment, doubled or trailing slash, or absolute form can reach anything else."""
    path = raw_path.partition("?")[0]
    allowed = SERVING_ROUTES.get(path)
    if allowed is None and path.startswith(_MODEL_PREFIX):
        segment = path[len(_MODEL_PREFIX) :]
        if segment and "/" not in segment and "%" not in segment and segment not in (".", ".."):
            allowed = _GET
    if allowed is None:
        return Verdict.FORBIDDEN
    return Verdict.SERVE if method.upper() in allowed else Verdict.METHOD_NOT_ALLOWED


def upstream_headers(headers: Mapping[str, str], key: str | None) -> dict[str, str]:
    """The client's headers as smg gets them: hop-by-hop ones and the client's Authorization
    dropped, the worker key presented (when the model has one)."""
    out = {k: v for k, v in headers.items() if k.lower() not in _REQUEST_DROP}
    if key is not None:
        out["Authorization"] = bearer(key)
    return out


def downstream_headers(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """smg's answer headers as the client gets them (every Set-Cookie kept)."""
    return [(k, v) for k, v in headers.items() if k.lower() not in _RESPONSE_DROP]


def error_response(
    status: int, message: str, code: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    """An answer of the gate's own, in OpenAI's error shape (what smg answers too)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(body, status=status, headers=headers)


class BodyTooLarge(Exception):
    pass


class BodyStalled(Exception):
    pass


class NoRoom(Exception):
    """The gate holds as many bodies as it may; the client should retry shortly."""


class ByteBudget:
    """Bytes of request bodies the gate lets through at once, shared by every request."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._freed = asyncio.Condition()

    async def acquire(self, n: int, wait: float) -> None:
        """Reserve `n` bytes, waiting up to `wait` s for room; NoRoom when there is none."""
        if n > self.limit:
            raise BodyTooLarge
        async with self._freed:
            try:
                await asyncio.wait_for(self._freed.wait_for(lambda: self.used + n <= self.limit), wait)
            except TimeoutError:
                raise NoRoom from None
            self.used += n

    async def release(self, n: int) -> None:
        if n <= 0:
            return
        async with self._freed:
            self.used -= n
            self._freed.notify_all()


def held_for(size: int) -> int:
    """Bytes a body of `size` holds while it passes: smg's copy, and the gate's of a small one
    (only a body up to REPLAYABLE_BODY_BYTES is kept; a larger one holds that much at most)."""
    return size + min(size, REPLAYABLE_BODY_BYTES)


@dataclass
class _Reservation:
    budget: ByteBudget
    held: int = 0

    async def grow_to(self, n: int, step: int = 0) -> None:
        """Hold at least `n` bytes, reserving at least `step` more at a time."""
        if n > self.held:
            more = max(n - self.held, step)
            await self.budget.acquire(more, BODY_BUDGET_WAIT_S)
            self.held += more

    async def release(self) -> None:
        await self.budget.release(self.held)
        self.held = 0


class Gate:
    """An aiohttp app that passes the serving routes to smg at `upstream`."""

    def __init__(
        self,
        upstream: str,
        key: str | None,
        max_in_flight: int = MAX_IN_FLIGHT,
        max_body_bytes_in_flight: int = MAX_BODY_BYTES_IN_FLIGHT,
        model: str | None = None,
    ) -> None:
        self.upstream = URL(upstream.rstrip("/"))
        self.key = key
        self.model = model  # the served name a native /generate body gets when it names none
        self.draining = False
        self.in_flight = 0
        self.max_in_flight = max_in_flight
        self.body_budget = ByteBudget(max_body_bytes_in_flight)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        # No pool limit (MAX_IN_FLIGHT bounds it); bytes pass through undecoded.
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
        verdict = route_verdict(request.method, request.raw_path)
        if verdict is Verdict.FORBIDDEN:
            return error_response(403, f"{request.path} is not served to clients of this model", "forbidden")
        if verdict is Verdict.METHOD_NOT_ALLOWED:
            return error_response(
                405, f"{request.method} is not allowed on {request.path}", "method_not_allowed"
            )
        if self.draining and request.path == READINESS_PATH:
            return error_response(503, "the router is stopping", "stopping")
        if self.in_flight >= self.max_in_flight:
            return error_response(
                503, "the router is at its limit of requests", "overloaded", {"Retry-After": "1"}
            )
        self.in_flight += 1
        try:
            response = await self._pass(request)
        finally:
            self.in_flight -= 1
        return response

    async def _pass(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None, "Gate.start() first"
        reservation = _Reservation(self.body_budget)
        try:
            body: AsyncIterator[bytes] | None = None
            replay = Replay.empty()
            if request.body_exists:
                body = await self._body(request, reservation)
                encoding = request.headers.get("Content-Encoding")
                if self.model is not None and wants_model(
                    request.method, request.path, request.content_type, encoding
                ):
                    body = _named(body, ModelFill(self.model))
                replay = Replay()
                body = replay.tee(body)
            return await self._forward(request, body, replay)
        except BodyTooLarge:
            return error_response(413, f"the request body is over {MAX_BODY_BYTES} bytes", "body_too_large")
        except NoRoom:
            return error_response(
                503, "the router holds as many request bodies as it may", "overloaded", {"Retry-After": "1"}
            )
        except BodyStalled:
            return error_response(408, f"the request body stalled for {BODY_IDLE_S:.0f} s", "body_timeout")
        finally:
            await reservation.release()

    async def _body(self, request: web.Request, reservation: _Reservation) -> AsyncIterator[bytes]:
        """The request's body as it arrives, reserved against the gate's byte budget first (its
        Content-Length) or as it grows (chunked)."""
        declared = request.content_length
        if declared is not None:
            if declared > MAX_BODY_BYTES:
                raise BodyTooLarge
            await reservation.grow_to(held_for(declared))
        return self._stream(request, reservation)

    async def _stream(self, request: web.Request, reservation: _Reservation) -> AsyncIterator[bytes]:
        seen = 0
        while True:
            try:
                chunk = await asyncio.wait_for(request.content.readany(), BODY_IDLE_S)
            except TimeoutError:
                raise BodyStalled from None
            if not chunk:
                return
            seen += len(chunk)
            if seen > MAX_BODY_BYTES:
                raise BodyTooLarge
            await reservation.grow_to(held_for(seen), _CHUNKED_STEP)
            yield chunk

    async def _forward(
        self, request: web.Request, body: AsyncIterator[bytes] | None, replay: Replay
    ) -> web.StreamResponse:
        """smg's answer to the request, sent again (from `replay`) while smg answers that no
        worker is available, at most once per NO_WORKERS_RETRY_DELAYS_S."""
        assert self._session is not None
        url = self.upstream.join(URL(request.raw_path, encoded=True))
        headers = upstream_headers(request.headers, self.key)
        waits = iter(NO_WORKERS_RETRY_DELAYS_S)
        data: AsyncIterator[bytes] | bytes | None = body
        while True:
            try:
                upstream = await self._session.request(
                    request.method, url, headers=headers, data=data, allow_redirects=False
                )
            except aiohttp.ClientError as err:
                cause = err.__cause__ or err.__context__
                if isinstance(cause, BodyTooLarge | BodyStalled | NoRoom):
                    raise cause from None
                return error_response(502, f"the router is not answering yet: {err}", "router_unavailable")
            try:
                head = b""
                if may_be_no_workers_answer(upstream.status, upstream.headers):
                    head = await upstream.read()
                    again = replay.body()
                    wait = next(waits, None) if again is not None and is_no_workers_answer(head) else None
                    if wait is not None:
                        log.info("smg has no worker for %s; sending it again in %.2f s", request.path, wait)
                        await asyncio.sleep(wait)
                        data = again
                        continue
                return await self._relay(request, upstream, head)
            except BaseException:
                upstream.close()  # a cancelled or failed pass-through ends smg's request too
                raise
            finally:
                upstream.release()

    async def _relay(
        self, request: web.Request, upstream: aiohttp.ClientResponse, head: bytes
    ) -> web.StreamResponse:
        """smg's answer to the client as it comes: `head` (what was read of it already), then
        the rest."""
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        response.headers.extend(downstream_headers(upstream.headers))
        if self.draining:
            response.force_close()  # the client's next request opens a connection elsewhere
        await response.prepare(request)
        if head:
            await response.write(head)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response

    @web.middleware
    async def _close_while_draining(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        if self.draining and not response.prepared:
            response.force_close()
        return response

    def app(self) -> web.Application:
        # No client_max_size: bodies are streamed, and bounded in _stream.
        app = web.Application(middlewares=[self._close_while_draining])
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(lambda _app: self.start())
        app.on_cleanup.append(lambda _app: self.close())
        return app


async def _named(body: AsyncIterator[bytes], fill: ModelFill) -> AsyncIterator[bytes]:
    """`body` with the model named (ModelFill), chunk by chunk as it arrives."""
    async for chunk in body:
        yield fill.feed(chunk)


def control_plane_key() -> str:
    """A fresh key for smg's control plane, made for one run and presented by no one."""
    return secrets.token_urlsafe(32)


def router_command(router_args: Sequence[str], key: str | None, control_key: str) -> list[str]:
    """smg's command with its keys (only this process ever shows them): the worker key as its
    --api-key, when the model has one, and `control_key` as the one control-plane key. One
    token per option (`--api-key=KEY`): a key that starts with "-" (a urlsafe key does, one
    time in 64) would otherwise be read as an option and smg would refuse to start."""
    control = f"--control-plane-api-keys={CONTROL_PLANE_KEY_ID}:gate:admin:{control_key}"
    keyed = [f"--api-key={key}"] if key is not None else []
    return [*router_args, *keyed, control]


def _die_with_parent() -> None:
    """In smg's child before exec: a new session (a signal to the gate's group is the gate's to
    pass on, after its drain), and SIGKILL when the gate dies, however it dies."""
    import os

    os.setsid()
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


async def run(
    host: str,
    port: int,
    router_port: int,
    key: str | None,
    router_args: Sequence[str],
    model: str | None = None,
) -> int:
    """Serve the gate and run smg until smg exits or a stop arrives; smg's exit status."""
    proc = await asyncio.create_subprocess_exec(
        *router_command(router_args, key, control_plane_key()), preexec_fn=_die_with_parent
    )
    gate = Gate(f"http://127.0.0.1:{router_port}", key, model=model)
    runner = web.AppRunner(
        gate.app(),
        handler_cancellation=True,
        access_log=None,
        keepalive_timeout=KEEPALIVE_S,
        shutdown_timeout=IN_FLIGHT_GRACE_S,
    )
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
        # Every answer from now on closes its connection (the client's next request opens one
        # elsewhere); an idle connection is not closed under a client that may be sending on it.
        gate.draining = True
        log.warning(
            "stopping: serving %.0f s more, then the requests in flight, then smg", c.TERMINATION_DRAIN_S
        )
        await asyncio.wait({exited}, timeout=c.TERMINATION_DRAIN_S)
        # Stops listening, closes idle connections and waits for the requests in flight.
        await runner.cleanup()
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
        if runner.server is not None:
            await runner.cleanup()

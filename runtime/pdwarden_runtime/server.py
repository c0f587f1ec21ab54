"""The HTTP surface of a runtime pod (SGLang-compatible subset) over an engine.

Routes: ``POST /generate``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (each
streamed or not, in SGLang 0.5.23's shapes: ``engines.synthetic_api`` reads them,
``engines.synthetic_shapes`` answers them, ``sse_answer`` streams them), ``GET /health``,
``GET /health_generate``, ``GET /get_server_info`` and ``/server_info``, ``GET /get_model_info`` and
``/model_info``, ``GET /v1/models``, ``GET /metrics``; ``GET /debug/state`` (read-only
room/pool counters for tests and operators), ``GET /debug/room/{room}`` (one room's
status, so a benchmark client can act on a room's phase); ``POST /debug/fault`` only with
``--allow-fault-injection``. The metrics port serves ``/metrics`` alone. With the model's worker
key (``--worker-key-file``) the HTTP port answers 401 without it, except ``/health*`` and
``/metrics`` (``pdwarden_runtime.worker_key``).

Handlers are cancelled when the client disconnects (``handler_cancellation``), which is
how a disconnect aborts the request in the engine, as in SGLang.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar

from aiohttp import web

import pdwarden_contract as c
from pdwarden_runtime.engines import synthetic_api, synthetic_shapes
from pdwarden_runtime.engines.synthetic import ClientGone, RequestFailed, SyntheticEngine
from pdwarden_runtime.engines.synthetic_api import ApiRequest, Route
from pdwarden_runtime.engines.synthetic_pattern import BadRequest
from pdwarden_runtime.group import GroupError, GroupOptions, Leader
from pdwarden_runtime.hardening import installed_versions
from pdwarden_runtime.hardening.config import ConfigError
from pdwarden_runtime.kvpoll import KVPoll
from pdwarden_runtime.metrics import requested_names
from pdwarden_runtime.sse_answer import SseAnswer, Watch
from pdwarden_runtime.transfer.kvpool import PagesExhausted
from pdwarden_runtime.worker_key import require_key

log = logging.getLogger(__name__)

# After SIGTERM the pod serves on for contract.TERMINATION_DRAIN_S (its /health answers 503
# meanwhile), then stops listening; requests in flight get this long to finish before they are
# cancelled (aiohttp then waits as long again for the cancelled handlers) and the process
# exits: well inside a pod's termination grace period (30 s), so that a request wedged on a
# stalled peer does not hold the pod until the kubelet's SIGKILL.
SHUTDOWN_GRACE_S: Final = 5.0
# A request still running this long into that grace is answered 503 (the runtime is stopping;
# smg retries it on another pair) and its room aborted, rather than cut off by aiohttp's
# cancellation with no answer at all: a client behind smg then gets a retried answer, not a
# connection error.
STOPPING_ANSWER_AFTER_S: Final = SHUTDOWN_GRACE_S - 1.0
STOPPING_REASON: Final = "runtime stopping: the request was not finished in its grace"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")


def _error(status: int, message: str, route: Route = Route.GENERATE) -> web.Response:
    return web.json_response(synthetic_shapes.error_body(route, status, message), status=status)


# What an engine raises for one request (the request's answer, never the server's failure).
ENGINE_ERRORS: Final = (BadRequest, PagesExhausted, RequestFailed)


def _failure(err: BadRequest | PagesExhausted | RequestFailed) -> tuple[int, str]:
    """The status and message of an engine error."""
    if isinstance(err, BadRequest):
        return 400, str(err)
    if isinstance(err, PagesExhausted):
        return 503, f"KV pool exhausted: {err}"
    return err.status, str(err)


class RuntimeServer:
    """The aiohttp apps (HTTP port and metrics port) of one synthetic runtime."""

    def __init__(
        self,
        engine: SyntheticEngine,
        *,
        allow_fault_injection: bool = False,
        group: Leader | None = None,
        worker_keys: Sequence[str] = (),
    ) -> None:
        self.engine = engine
        # Empty: the HTTP port takes requests without a key; two while the key rotates.
        self.worker_keys = tuple(worker_keys)
        self.draining = False  # stopping: serving on, but no longer healthy
        self.allow_fault_injection = allow_fault_injection
        self.group = group  # a multi-node replica's leader: ready only once every rank joined
        self._runners: list[web.AppRunner] = []
        self._closing = asyncio.Event()  # set at the end of the stop's grace: answer 503 now
        self._sglang_version = installed_versions().get("sglang")  # package metadata: read once

    # --- handlers ------------------------------------------------------------------------
    def _group_missing(self) -> str | None:
        if self.group is None or self.group.complete:
            return None
        return f"waiting for the group's ranks: {self.group.describe()}"

    async def generate(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, Route.GENERATE)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, Route.COMPLETIONS)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, Route.CHAT)

    async def _serve(self, request: web.Request, route: Route) -> web.StreamResponse:
        """One serving route: its body read into a native request for the engine (one PD path
        whatever the route), the engine's outputs shaped back into the route's answer."""
        if not self.engine.ready:
            return _error(503, "engine is starting", route)
        if (missing := self._group_missing()) is not None:
            return _error(503, missing, route)
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "request body is not valid JSON", route)
        try:
            api = synthetic_api.parse(route, body)
        except BadRequest as err:
            return _error(400, str(err), route)
        if api.stream:
            return await self._stream(request, api)
        try:
            out = await self._unless_closing(self.engine.generate(api.native, Watch(request)))
        except ENGINE_ERRORS as err:
            return _error(*_failure(err), route)
        except ClientGone:  # nobody to answer
            return web.Response(status=499)
        return web.json_response(synthetic_shapes.Shaper(api).response(out))

    async def _stream(self, request: web.Request, api: ApiRequest) -> web.StreamResponse:
        answer = SseAnswer(request, synthetic_shapes.Shaper(api))
        try:
            if not api.route.openai:  # SGLang's native stream opens at once; OpenAI's with its first chunk
                await answer.open()
            try:
                out = await self._unless_closing(self.engine.generate(api.native, answer))
            except ENGINE_ERRORS as err:
                status, message = _failure(err)
                if not answer.opened:
                    return _error(status, message, api.route)
                await answer.fail(status, message)
                return answer.response
            await answer.finish(out)
        except ClientGone:
            pass  # the engine ended the request; nobody is left to answer
        return answer.response

    async def _unless_closing(self, work: Awaitable[T]) -> T:
        """``work``'s result; once the stop's grace is nearly over, its room aborted and
        RequestFailed (503, retryable) instead. A handler cancelled meanwhile (its client
        left) cancels ``work`` and waits for its clean-up, as when it awaited ``work`` itself."""
        task = asyncio.ensure_future(work)
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait({task, closing}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            await asyncio.wait({task})
            raise
        finally:
            closing.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise RequestFailed(STOPPING_REASON, status=503)

    async def health(self, request: web.Request) -> web.Response:
        if self.draining:
            return web.Response(text="stopping", status=503)
        if (missing := self._group_missing()) is not None:
            return web.Response(text=missing, status=503)
        ok, why = self.engine.healthy()
        return web.Response(text=why, status=200 if ok else 503)

    async def health_generate(self, request: web.Request) -> web.Response:
        ok, why = await self.engine.health_generate()
        return web.Response(text=why, status=200 if ok else 503)

    def _server_info(self) -> dict[str, Any]:
        o = self.engine.options
        return {
            "model_path": o.model,
            "served_model_name": o.model,
            "tokenizer_path": o.model,
            "host": o.host,
            "port": o.port,
            "disaggregation_mode": o.role,
            "disaggregation_bootstrap_port": o.bootstrap_port,
            "disaggregation_transfer_backend": "nixl",
            "page_size": o.page_size,
            "tp_size": 1,
            "dp_size": 1,
            "pp_size": 1,
            "version": self._sglang_version,
            "engine": "synthetic",
            "pdwarden": {"fixes": self.engine.hardening.active_fixes(), "fault": self.engine.fault.active},
        }

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response(self._server_info())

    async def model_info(self, request: web.Request) -> web.Response:
        o = self.engine.options
        return web.json_response(
            {
                "model_path": o.model,
                "tokenizer_path": o.model,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "synthetic",
                "architectures": ["SyntheticForCausalLM"],
            }
        )

    async def models(self, request: web.Request) -> web.Response:
        o = self.engine.options
        return web.json_response(synthetic_shapes.model_list(o.model, o.pool_pages * o.page_size))

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        rt = self.engine.rt
        if rt is None:
            return _error(503, "engine is starting")
        body, content_type = rt.metrics.exposition(requested_names(request))
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def debug_state(self, request: web.Request) -> web.Response:
        return web.json_response(self.engine.debug_state())

    async def debug_room(self, request: web.Request) -> web.Response:
        mgr = self.engine.mgr
        if mgr is None:
            return _error(503, "engine is starting")
        text = request.match_info["room"]
        try:
            room = int(text)
        except ValueError:
            return _error(400, f"room must be an integer bootstrap_room, got {text!r}")
        status = mgr.request_status.get(room)  # SGLang's own view (stock or hardened)
        label = None if status is None else KVPoll(status).label
        return web.json_response({"room": room, "status": label})

    async def debug_fault(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "request body is not valid JSON")
        fault = body.get("fault") if isinstance(body, dict) else None
        if not isinstance(fault, str):
            return _error(400, f'body must be {{"fault": one of {list(c.FAULTS)}}}')
        try:
            active = self.engine.fault.set(fault)
        except ConfigError as err:
            return _error(400, str(err))
        log.warning("fault injection: %s is now active", active)
        return web.json_response({"fault": active})

    # --- apps ----------------------------------------------------------------------------
    def http_app(self) -> web.Application:
        middlewares = [require_key(self.worker_keys)] if self.worker_keys else []
        app = web.Application(client_max_size=c.MAX_REQUEST_BODY_BYTES, middlewares=middlewares)
        add = app.router.add_route
        add("POST", c.GENERATE_PATH, self.generate)
        add("POST", Route.COMPLETIONS.value, self.completions)
        add("POST", Route.CHAT.value, self.chat_completions)
        add("GET", c.HEALTH_PATH, self.health)
        add("GET", c.HEALTH_GENERATE_PATH, self.health_generate)
        for path in ("/get_server_info", "/server_info"):
            add("GET", path, self.server_info)
        for path in ("/get_model_info", "/model_info"):
            add("GET", path, self.model_info)
        add("GET", "/v1/models", self.models)
        add("GET", c.METRICS_PATH, self.metrics)
        add("GET", "/debug/state", self.debug_state)
        add("GET", "/debug/room/{room}", self.debug_room)
        if self.allow_fault_injection:
            add("POST", c.FAULT_PATH, self.debug_fault)
        return app

    def metrics_app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("GET", c.METRICS_PATH, self.metrics)
        return app

    async def start(self, host: str, port: int, metrics_port: int) -> None:
        for app, bind in ((self.http_app(), port), (self.metrics_app(), metrics_port)):
            runner = web.AppRunner(
                app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S
            )
            await runner.setup()
            await web.TCPSite(runner, host=host, port=bind, reuse_address=True).start()
            self._runners.append(runner)

    async def stop(self) -> None:
        # aiohttp stops listening, waits SHUTDOWN_GRACE_S for the requests in flight, then
        # cancels them; a second before that, they are answered 503 instead.
        answer = asyncio.get_running_loop().call_later(STOPPING_ANSWER_AFTER_S, self._closing.set)
        try:
            for runner in self._runners:
                await runner.cleanup()
        finally:
            answer.cancel()


async def run_synthetic(
    engine: SyntheticEngine,
    *,
    allow_fault_injection: bool,
    group: GroupOptions | None = None,
    worker_keys: Sequence[str] = (),
) -> None:
    """Serve until SIGTERM/SIGINT. The HTTP port answers /health 503 until the engine is up
    (and, for a group's leader, until every rank has joined). A group's leader raises
    GroupError when a rank leaves: the group cannot go on without it."""
    o = engine.options
    leader = Leader(group, o.host) if group is not None else None
    if leader is not None:
        await leader.start()
    server = RuntimeServer(
        engine, allow_fault_injection=allow_fault_injection, group=leader, worker_keys=worker_keys
    )
    await server.start(o.host, o.port, o.metrics_port)
    log.info(
        "%s synthetic runtime: http %s:%s metrics :%s bootstrap :%s",
        o.role,
        o.host,
        o.port,
        o.metrics_port,
        o.bootstrap_port,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await engine.start()
    log.info("%s synthetic runtime ready", o.role)
    waits: set[asyncio.Future[Any]] = {asyncio.ensure_future(stop.wait())}
    if leader is not None:
        waits.add(leader.lost)
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    # A group's leader stops at once: its group stops with it, and a rank of the next incarnation
    # must never join a leader that is on its way out.
    if stop.is_set() and leader is None:
        server.draining = True
        log.warning("%s: stopping; serving %.0f s more", o.role, c.TERMINATION_DRAIN_S)
        await asyncio.sleep(c.TERMINATION_DRAIN_S)
    try:
        if leader is not None and leader.lost.done() and not stop.is_set():
            raise GroupError(leader.lost.result())
    finally:
        if leader is not None:
            await leader.close()
        await server.stop()
        await engine.close()

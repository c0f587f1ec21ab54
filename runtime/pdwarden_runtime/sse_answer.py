"""The HTTP answer of one request while decode produces its tokens (the engine's TokenSink).

``SseAnswer`` streams a request's outputs as server-sent events in its route's shape: the
native stream starts at once (SGLang's /generate sends its headers before any output), an OpenAI
stream with its first chunk (SGLang's serving layer waits for it, so an error before any token
is still an HTTP error). ``Watch`` is the sink of a non-streamed request: it only tells the
engine whether the client is still there.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from pdwarden_runtime.engines.synthetic import ClientGone
from pdwarden_runtime.engines.synthetic_shapes import SSE_DONE, Shaper, sse, stream_error


def client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


class Watch:
    """A non-streamed request's sink: nothing to send before the end."""

    streaming = False

    def __init__(self, request: web.Request) -> None:
        self._request = request

    def gone(self) -> bool:
        return client_gone(self._request)

    async def emit(self, out: dict[str, Any]) -> None:  # never called: not streaming
        return None


class SseAnswer:
    """A streamed request's answer: its events, written as they come."""

    streaming = True

    def __init__(self, request: web.Request, shaper: Shaper) -> None:
        self._request = request
        self.shaper = shaper
        self.response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )

    @property
    def opened(self) -> bool:
        return self.response.prepared

    def gone(self) -> bool:
        return client_gone(self._request)

    async def open(self) -> None:
        if not self.response.prepared:
            await self.response.prepare(self._request)

    async def emit(self, out: dict[str, Any]) -> None:
        await self._write(self.shaper.chunks(out))

    async def finish(self, out: dict[str, Any]) -> None:
        """The final output, the usage chunk when asked, and [DONE]."""
        await self._write(self.shaper.chunks(out) + self.shaper.tail(out), done=True)

    async def fail(self, status: int, message: str) -> None:
        """An error after the stream began: one error event, then [DONE] (as SGLang ends it)."""
        await self._write([stream_error(self.shaper.request.route, status, message)], done=True)

    async def _write(self, events: list[dict[str, Any]], done: bool = False) -> None:
        data = b"".join(sse(event) for event in events) + (SSE_DONE if done else b"")
        try:
            await self.open()
            await self.response.write(data)
            if done:
                await self.response.write_eof()
        except ConnectionError as err:  # aiohttp's ClientConnectionResetError: a closing transport
            raise ClientGone(str(err)) from err

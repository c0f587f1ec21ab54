"""KV admission: requests wait, first come first served, for their pages and an aux slot.

SGLang never refuses a request for lack of KV memory: decode holds it in its prealloc queue,
prefill in its waiting queue, until memory is freed. The synthetic engine does the same, so a
burst larger than the pool queues instead of failing (a decode that answered 503 before
sending its metadata left the prefill's room waiting for metadata that never came). The wait
is bounded: past ``timeout`` the request fails with ``PagesExhausted``.

Strict FIFO: a request that needs many pages is not overtaken by smaller ones, so it cannot
starve. Pages come back from any thread (a drain completes in SGLang's threads); ``give``
hands the wake-up to the event loop.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from dataclasses import dataclass, field

import numpy as np

from pdwarden_runtime.transfer.kvpool import KVPool, PagesExhausted


@dataclass(eq=False)
class _Waiter:
    pages: int
    future: asyncio.Future[tuple[np.ndarray, int]] = field(repr=False)


class KVAdmission:
    """FIFO admission to one KVPool (pages and one aux slot per request)."""

    def __init__(self, pool: KVPool, loop: asyncio.AbstractEventLoop) -> None:
        self._pool = pool
        self._loop = loop
        self._queue: collections.deque[_Waiter] = collections.deque()
        self._lock = threading.Lock()  # the pool's free lists and the queue move together

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def take(self, pages: int, timeout: float | None) -> tuple[np.ndarray, int]:
        """Pages and an aux slot for one request; waits behind earlier requests. Raises
        PagesExhausted after ``timeout`` seconds (None: no bound) or for a request that
        could never fit."""
        shape = self._pool.shape
        if pages > shape.pages:
            raise PagesExhausted(f"need {pages} KV pages, the pool has {shape.pages}")
        with self._lock:
            if not self._queue and self._fits(pages):
                return self._grab(pages)
            waiter = _Waiter(pages, self._loop.create_future())
            self._queue.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                return await waiter.future
        except TimeoutError:
            self._leave(waiter)
            raise PagesExhausted(
                f"waited {timeout:g}s for {pages} KV pages ({self._pool.free_pages} of "
                f"{shape.pages} free, {self.waiting} requests queued)"
            ) from None
        except BaseException:
            self._leave(waiter)
            raise

    def try_take(self, pages: int) -> tuple[np.ndarray, int] | None:
        """Pages and an aux slot now, or None when queued requests or too few free pages
        are in the way (any thread; the engine's health check)."""
        with self._lock:
            if self._queue or not self._fits(pages):
                return None
            return self._grab(pages)

    def give(self, pages: np.ndarray | None, aux: int | None) -> None:
        """Return a request's pages and aux slot (any thread); wakes the queue's head."""
        with self._lock:
            if pages is not None:
                self._pool.give_pages(pages)
            if aux is not None:
                self._pool.give_aux(aux)
        if self._queue:
            self._loop.call_soon_threadsafe(self._admit)

    # --- internals (under self._lock unless said otherwise) --------------------------------
    def _fits(self, pages: int) -> bool:
        return self._pool.free_pages >= pages and self._pool.free_aux >= 1

    def _grab(self, pages: int) -> tuple[np.ndarray, int]:
        return self._pool.take_pages(pages), self._pool.take_aux()

    def _admit(self) -> None:  # on the event loop
        with self._lock:
            while self._queue:
                head = self._queue[0]
                if head.future.done():  # timed out or cancelled; _leave removes it
                    self._queue.popleft()
                    continue
                if not self._fits(head.pages):
                    return
                self._queue.popleft()
                head.future.set_result(self._grab(head.pages))

    def _leave(self, waiter: _Waiter) -> None:
        """A waiter that stopped waiting (timeout, cancellation): out of the queue, and what
        it was granted meanwhile (a grant that raced the timeout) goes back."""
        granted: tuple[np.ndarray, int] | None = None
        with self._lock:
            if waiter in self._queue:
                self._queue.remove(waiter)
            if waiter.future.done() and not waiter.future.cancelled():
                granted = waiter.future.result()
            else:
                waiter.future.cancel()
        if granted is not None:
            self.give(*granted)
        elif self._queue:
            self._loop.call_soon(self._admit)  # it may have been the head that blocked the rest

"""The operator-wide scrape budget: one for the whole process, shared by every model's Scraper.

Each model's watchdog scrapes its own pods, but what a scrape costs is the operator's: sockets,
bodies in memory, parsing CPU. So every scrape of every model draws from one budget:

- **slots**: at most `max_scrapes` requests in flight at once, whatever the number of models
  (1,000 models of 100 pods open 128 connections at a time, not 100,000);
- **bytes**: at most `max_bytes_in_flight` of bodies held at once, from the first byte read
  until the body is parsed. A scrape reserves its Content-Length (or `first_reservation`
  when the body is chunked, growing to its limit only if the body does), so a healthy pod's
  few KiB never wait behind a hostile pod's MiB: a request that fits is granted before a
  bigger one that waits (a body that cannot be granted in time times out: unobserved);
- **parsing** of a large body on worker threads, never on the event loop that also serves
  kopf and the metrics, so it never stalls a round or a watch. A body of a real runtime's
  size (about 11 KiB, a tenth of a millisecond to parse) is parsed on the loop: handing it
  to a worker and back cost more than the parse.

Per-model timeouts stay the Scraper's own. The limiter is thread-safe and usable from any
event loop (tests run one loop each; the parse workers release bytes from their threads).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeVar

from pdwarden_operator.watchdog.parse import DEFAULT_MAX_BYTES

T = TypeVar("T")

DEFAULT_MAX_SCRAPES: Final = 128
# 16 bodies at the 1 MiB limit, or well over a thousand real (few KiB) ones
DEFAULT_MAX_BYTES_IN_FLIGHT: Final = 16 << 20
DEFAULT_FIRST_RESERVATION: Final = 64 << 10
# Parsing is pure Python (the GIL): more workers than cores only adds contention.
DEFAULT_PARSE_WORKERS: Final = 2
# Bodies up to this size are parsed on the event loop (at most about a millisecond).
DEFAULT_INLINE_PARSE_BYTES: Final = 64 << 10


class BudgetBusy(Exception):
    """No share of the operator-wide budget within the wait allowed."""


@dataclass
class _Waiter:
    amount: int
    future: asyncio.Future[None]
    granted: bool = False


class Limiter:
    """A pool of `capacity` units taken and given back in amounts, thread-safe, from any event
    loop. A request is granted as soon as it fits, in arrival order among those that fit:
    small requests pass a big one that waits for room (for slots, all of amount 1: FIFO)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._free = capacity
        self._lock = threading.Lock()
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self.peak = 0  # the most units ever taken at once

    @property
    def used(self) -> int:
        with self._lock:
            return self.capacity - self._free

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._waiters)

    async def acquire(self, amount: int, wait_seconds: float | None = None) -> None:
        """Take `amount`, waiting for room when there is too little; a TimeoutError when none
        was granted within `wait_seconds` (None: no bound)."""
        if not 0 <= amount <= self.capacity:
            raise ValueError(f"cannot take {amount} of a capacity of {self.capacity}")
        with self._lock:
            if self._free >= amount:
                self._take(amount)
                return
            # the loop only for a wait: each lookup of it costs a system call (its process id)
            loop = asyncio.get_running_loop()
            waiter = _Waiter(amount, loop.create_future())
            self._waiters.append(waiter)
        # one timer that fails the wait, not an asyncio.timeout (a timer too, and three more
        # lookups of the loop): a busy round has many waits
        timer = loop.call_later(wait_seconds, _expire, waiter.future) if wait_seconds is not None else None
        try:
            await waiter.future
        except BaseException:
            # timed out or cancelled: give back what was granted meanwhile, or stop waiting
            with self._lock:
                if waiter.granted:
                    self._free += amount
                else:
                    self._waiters.remove(waiter)
                woken = self._grant()
            _wake(woken)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def release(self, amount: int) -> None:
        with self._lock:
            self._free += amount
            if self._free > self.capacity:
                raise RuntimeError("released more than was taken")
            woken = self._grant()
        _wake(woken)

    def _take(self, amount: int) -> None:
        self._free -= amount
        self.peak = max(self.peak, self.capacity - self._free)

    def _grant(self) -> list[_Waiter]:
        """Under the lock: the waiters that fit now, taken in arrival order."""
        woken = []
        while self._waiters and self._free >= self._waiters[0].amount:
            woken.append(self._granted(self._waiters.popleft()))
        if self._waiters and self._free > 0:  # smaller requests behind a bigger one that waits
            for waiter in [w for w in self._waiters if w.amount <= self._free]:
                if self._free >= waiter.amount:
                    self._waiters.remove(waiter)
                    woken.append(self._granted(waiter))
        return woken

    def _granted(self, waiter: _Waiter) -> _Waiter:
        waiter.granted = True
        self._take(waiter.amount)
        return waiter


def _wake(waiters: list[_Waiter]) -> None:
    for waiter in waiters:
        try:
            waiter.future.get_loop().call_soon_threadsafe(_resolve, waiter.future)
        except RuntimeError:  # its loop is closed: nobody waits any more; the grant is void
            waiter.future.cancel()


def _expire(future: asyncio.Future[None]) -> None:
    if not future.done():  # a grant on its way is given back by the waiter (acquire)
        future.set_exception(TimeoutError())


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Reservation:
    """The bytes one scrape holds: grown while its body arrives, released (once) after parsing."""

    def __init__(self, limiter: Limiter) -> None:
        self._limiter = limiter
        self._lock = threading.Lock()
        self.held = 0
        self._released = False

    async def grow_to(self, amount: int, wait_seconds: float | None = None) -> None:
        """Hold `amount` bytes; a wait for them, when the budget has too few free, ends in a
        TimeoutError after `wait_seconds` (None: unbounded). No timer when none is needed."""
        amount = min(amount, self._limiter.capacity)
        if amount > self.held:
            more = amount - self.held
            await self._limiter.acquire(more, wait_seconds)
            with self._lock:
                if self._released:  # released while waiting (never in practice): give it back
                    self._limiter.release(more)
                    return
                self.held = amount

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
            held, self.held = self.held, 0
        if held:
            self._limiter.release(held)


class Slot:
    """`ScrapeBudget.slot`, entered once per scrape: a free slot is taken without arming a
    timer, and a class costs less to enter than a generator's context manager."""

    __slots__ = ("_limiter", "_wait_seconds")

    def __init__(self, limiter: Limiter, wait_seconds: float) -> None:
        self._limiter = limiter
        self._wait_seconds = wait_seconds

    async def __aenter__(self) -> None:
        try:
            await self._limiter.acquire(1, self._wait_seconds)
        except TimeoutError:
            raise BudgetBusy(
                f"no scrape slot within {self._wait_seconds:g}s "
                f"(operator-wide limit {self._limiter.capacity})"
            ) from None

    async def __aexit__(self, *_exc: object) -> None:
        self._limiter.release(1)


class ScrapeBudget:
    def __init__(
        self,
        *,
        max_scrapes: int = DEFAULT_MAX_SCRAPES,
        max_bytes_in_flight: int = DEFAULT_MAX_BYTES_IN_FLIGHT,
        first_reservation: int = DEFAULT_FIRST_RESERVATION,
        parse_workers: int = DEFAULT_PARSE_WORKERS,
        max_body: int = DEFAULT_MAX_BYTES,
        inline_parse_bytes: int = DEFAULT_INLINE_PARSE_BYTES,
    ) -> None:
        if max_bytes_in_flight < max_body:
            raise ValueError(
                f"max_bytes_in_flight ({max_bytes_in_flight}) must hold one body of the limit ({max_body})"
            )
        if parse_workers < 1:
            raise ValueError(f"parse_workers must be >= 1, got {parse_workers}")
        self.slots = Limiter(max_scrapes)
        self.bytes = Limiter(max_bytes_in_flight)
        self.first_reservation = min(first_reservation, max_body)
        self.max_body = max_body
        self._parse_workers = parse_workers
        self.inline_parse_bytes = inline_parse_bytes
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def slot(self, wait_seconds: float) -> Slot:
        """One request in flight; BudgetBusy when none frees up within `wait_seconds`."""
        return Slot(self.slots, wait_seconds)

    def reservation(self) -> Reservation:
        return Reservation(self.bytes)

    def parses_inline(self, size: int) -> bool:
        """Whether a body of `size` bytes is parsed on the loop (a runtime's few KiB), not on a
        parse worker."""
        return size <= self.inline_parse_bytes

    async def parse(self, reservation: Reservation, fn: Callable[[], T], size: int) -> T:
        """`fn` parsing a body of `size` bytes: on the loop when `parses_inline`, else on a
        parse worker; `reservation` is released when it ends (also if the caller is cancelled
        meanwhile: the body stays in memory until the worker is done with it)."""
        if self.parses_inline(size):
            try:
                return fn()
            finally:
                reservation.release()
        future = self._executor().submit(fn)
        future.add_done_callback(lambda _: reservation.release())
        return await asyncio.wrap_future(future)

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self._parse_workers, thread_name_prefix="pdwarden-parse"
                )
            return self._pool

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

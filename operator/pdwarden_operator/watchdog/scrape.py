"""Scrape many runtime pods' /metrics concurrently: bounded concurrency, per-request timeout,
bounded body size. Every failure becomes a `ScrapeResult` with an error; nothing raises.

Each model's Scraper keeps its own connections (keep-alive per pod) and timeout, but draws
slots, body bytes and parse workers from the operator-wide budget (`budget.py`), so the
number of models does not multiply what scraping may cost, and a large body is never parsed
on the event loop.

A body that reads exactly as the pod's last one (an idle pod's: nothing in flight, no counter
moving) is not parsed again: its digest matches and the last sample stands. Only bodies of a
runtime's size, which are parsed on the loop, are remembered.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlencode

import aiohttp
from yarl import URL

import pdwarden_contract as contract
from pdwarden_operator.watchdog.budget import BudgetBusy, Reservation, ScrapeBudget
from pdwarden_operator.watchdog.parse import (
    DEFAULT_MAX_BYTES,
    METRICS_READ,
    ParseError,
    PodSample,
    parse_metrics,
)

# Asks a runtime for the families the watchdog reads, about a quarter of its body (one that
# ignores the question sends them all; the parser keeps the same lines either way).
READ_QUERY: Final = urlencode([(contract.METRICS_NAME_PARAM, name) for name in METRICS_READ])


@dataclass(frozen=True)
class ScrapeTarget:
    key: str  # the pod's UID
    url: str  # http://<pod ip>:<metrics port>/metrics
    # The addresses its `peer` labels may name (the model's pods); None: unchecked.
    peers: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class _Parsed:
    """A pod's last parsed body, by its digest, and the peers it was checked against."""

    digest: bytes
    peers: frozenset[str] | None
    sample: PodSample


def _digest(body: bytes | bytearray) -> bytes:
    return hashlib.blake2b(body, digest_size=16).digest()


@dataclass(frozen=True)
class ScrapeResult:
    key: str
    sample: PodSample | None
    error: str | None
    seconds: float


class Scraper:
    """One per watchdog; reuses keep-alive connections across rounds (cheap at 1,000 pods)."""

    def __init__(
        self,
        *,
        concurrency: int = 100,
        timeout_seconds: float = 5.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
        keepalive_seconds: float = 60.0,
        budget: ScrapeBudget | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.concurrency = concurrency  # this model's share; the budget bounds all models together
        self.timeout_seconds = timeout_seconds
        # Each request bounded by aiohttp's own timer, from its start to its body's last byte:
        # an asyncio.timeout around it cost twice as much CPU (its own timer, and three looks
        # at the running loop, each a system call). Exact, not rounded up to a whole second.
        self._request_timeout = aiohttp.ClientTimeout(total=timeout_seconds, ceil_threshold=math.inf)
        self.max_bytes = max_bytes
        self.keepalive_seconds = keepalive_seconds
        # the operator's shared budget (WatchdogContext.budget); a scraper given none bounds
        # itself with one of its own
        self._budget = budget
        self._own_budget: ScrapeBudget | None = None
        self._session: aiohttp.ClientSession | None = None
        # target URL -> the request's (built by targets.metrics_url from the pod's address and
        # port: already encoded)
        self._urls: dict[str, URL] = {}
        # target key -> its last body that parsed (kept for this round's targets only)
        self._parsed: dict[str, _Parsed] = {}

    @property
    def budget(self) -> ScrapeBudget:
        if self._budget is not None:
            return self._budget
        if self._own_budget is None:
            self._own_budget = ScrapeBudget()
        return self._own_budget

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=0,  # the budget bounds requests in flight; the pool may keep one idle socket per pod
                keepalive_timeout=self.keepalive_seconds,
                use_dns_cache=False,  # pod IPs, no names
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                headers={"Accept": "text/plain"},
                # a pod's cookies never reach another pod, and no jar is kept per response
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(),  # each scrape is bounded by its own timeout
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._own_budget is not None:
            self._own_budget.close()
            self._own_budget = None

    async def scrape(self, targets: Sequence[ScrapeTarget]) -> list[ScrapeResult]:
        """Scrape all targets; results in the targets' order."""
        session = self._ensure_session()
        budget = self.budget
        if self.max_bytes > budget.max_body:
            raise ValueError(f"max_bytes {self.max_bytes} exceeds the budget's body limit {budget.max_body}")
        own = asyncio.Semaphore(self.concurrency)
        # the request URLs, built once per pod rather than once per scrape (kept for this
        # round's targets only)
        known = self._urls
        urls = {t.url: known.get(t.url) or URL(f"{t.url}?{READ_QUERY}", encoded=True) for t in targets}
        self._urls = urls
        results = await asyncio.gather(*(self._one(session, budget, own, t, urls[t.url]) for t in targets))
        keys = {t.key for t in targets}
        self._parsed = {key: parsed for key, parsed in self._parsed.items() if key in keys}
        return list(results)

    async def _one(
        self,
        session: aiohttp.ClientSession,
        budget: ScrapeBudget,
        own: asyncio.Semaphore,
        target: ScrapeTarget,
        url: URL,
    ) -> ScrapeResult:
        async with own:
            started = time.perf_counter()
            reservation = budget.reservation()
            try:
                # waiting for a slot has its own bound: a busy operator reports the pod
                # unobserved rather than letting the round run on
                async with budget.slot(self.timeout_seconds):
                    body = await self._fetch(session, url, budget, reservation)
                size = len(body)
                # only a body parsed on the loop is remembered: a larger one is not hashed there
                digest = _digest(body) if budget.parses_inline(size) else None
                sample = self._unchanged(target, digest)
                if sample is None:
                    peers = target.peers
                    parse = functools.partial(parse_metrics, body, max_bytes=self.max_bytes, peers=peers)
                    del body  # the parse holds the only reference: freed when it is done
                    sample = await budget.parse(reservation, parse, size)
                    if digest is not None:
                        self._parsed[target.key] = _Parsed(digest, peers, sample)
                error = None
            except TimeoutError:
                sample, error = None, f"timeout after {self.timeout_seconds:g}s"
            except (ParseError, BudgetBusy) as exc:
                sample, error = None, str(exc)
            except aiohttp.ClientError as exc:
                sample, error = None, f"{type(exc).__name__}: {str(exc)[:160]}"
            except Exception as exc:  # never let one pod's oddity end the round
                sample, error = None, f"unexpected {type(exc).__name__}: {str(exc)[:160]}"
            finally:
                reservation.release()  # a no-op once the parse worker released it
            return ScrapeResult(target.key, sample, error, time.perf_counter() - started)

    def _unchanged(self, target: ScrapeTarget, digest: bytes | None) -> PodSample | None:
        """The pod's last sample if this body reads as the last one that parsed, checked
        against the same peers (None: parse it)."""
        last = self._parsed.get(target.key)
        if last is not None and digest is not None and last.digest == digest and last.peers == target.peers:
            return last.sample
        return None

    async def _fetch(
        self, session: aiohttp.ClientSession, url: URL, budget: ScrapeBudget, reservation: Reservation
    ) -> bytes | bytearray:
        # what is left of the scrape's time bounds a wait for the body's bytes, which the
        # request's timer does not see (it watches only aiohttp's own awaits)
        deadline = time.monotonic() + self.timeout_seconds
        async with session.get(url, allow_redirects=False, timeout=self._request_timeout) as resp:
            if resp.status != 200:
                raise ParseError(f"HTTP {resp.status} from {url.with_query(None)}")
            length = resp.content_length
            if length is not None and length > self.max_bytes:
                raise ParseError(f"body of {length} bytes exceeds the limit of {self.max_bytes}")
            # what the body will hold, before reading it: its length, else a first share
            await reservation.grow_to(
                length if length is not None else min(budget.first_reservation, self.max_bytes),
                deadline - time.monotonic(),
            )
            if length is not None and budget.parses_inline(length):
                # a runtime's few KiB (prometheus_client sends the length): read whole, as the
                # HTTP parser reads no byte past the length it was given
                return await resp.read()
            body = bytearray()  # one buffer, not chunks and then their join
            async for chunk in resp.content.iter_any():
                if len(body) + len(chunk) > self.max_bytes:
                    raise ParseError(f"body exceeds the limit of {self.max_bytes} bytes")
                if len(body) + len(chunk) > reservation.held:  # a chunked body beyond its first share
                    await reservation.grow_to(self.max_bytes, deadline - time.monotonic())
                body += chunk
            return body

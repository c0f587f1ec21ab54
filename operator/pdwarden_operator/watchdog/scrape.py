"""Scrape many runtime pods' /metrics concurrently: bounded concurrency, per-request timeout,
bounded body size. Every failure becomes a `ScrapeResult` with an error; nothing raises.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from pdwarden_operator.watchdog.parse import DEFAULT_MAX_BYTES, ParseError, PodSample, parse_metrics


@dataclass(frozen=True)
class Target:
    key: str  # the pod's UID
    url: str  # http://<pod ip>:<metrics port>/metrics


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
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.concurrency = concurrency
        self.timeout_seconds = timeout_seconds
        self.max_bytes = max_bytes
        self.keepalive_seconds = keepalive_seconds
        self._session: aiohttp.ClientSession | None = None
        self._semaphore: asyncio.Semaphore | None = None

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=0,  # the semaphore bounds concurrency; the pool may keep one idle socket per pod
                keepalive_timeout=self.keepalive_seconds,
                use_dns_cache=False,  # pod IPs, no names
            )
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, headers={"Accept": "text/plain"}
            )
            self._semaphore = asyncio.Semaphore(self.concurrency)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def scrape(self, targets: Sequence[Target]) -> list[ScrapeResult]:
        """Scrape all targets; results in the targets' order."""
        session = self._ensure_session()
        return list(await asyncio.gather(*(self._one(session, t) for t in targets)))

    async def _one(self, session: aiohttp.ClientSession, target: Target) -> ScrapeResult:
        assert self._semaphore is not None
        async with self._semaphore:
            started = time.perf_counter()
            try:
                body = await asyncio.wait_for(self._fetch(session, target.url), self.timeout_seconds)
                sample: PodSample | None = parse_metrics(body, max_bytes=self.max_bytes)
                error = None
            except TimeoutError:
                sample, error = None, f"timeout after {self.timeout_seconds:g}s"
            except ParseError as exc:
                sample, error = None, str(exc)
            except aiohttp.ClientError as exc:
                sample, error = None, f"{type(exc).__name__}: {str(exc)[:160]}"
            except Exception as exc:  # never let one pod's oddity end the round
                sample, error = None, f"unexpected {type(exc).__name__}: {str(exc)[:160]}"
            return ScrapeResult(target.key, sample, error, time.perf_counter() - started)

    async def _fetch(self, session: aiohttp.ClientSession, url: str) -> bytes:
        async with session.get(url, allow_redirects=False) as resp:
            if resp.status != 200:
                raise ParseError(f"HTTP {resp.status} from {url}")
            if resp.content_length is not None and resp.content_length > self.max_bytes:
                raise ParseError(f"body of {resp.content_length} bytes exceeds the limit of {self.max_bytes}")
            chunks: list[bytes] = []
            size = 0
            async for chunk in resp.content.iter_any():
                size += len(chunk)
                if size > self.max_bytes:
                    raise ParseError(f"body exceeds the limit of {self.max_bytes} bytes")
                chunks.append(chunk)
            return b"".join(chunks)

"""A model's body as its watch last brought it, and a wait for the next one.

A watchdog with nothing to look at (its model has no Ready runtime pod, or its spec does not
validate) decides so from the body alone, so it waits for the body to change instead of
waking every scrape interval: a thousand parked models then cost nothing between watch events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any


class LatestBody:
    """The newest body of one model (None once it is gone) and its version, which each new
    body (and the end) raises by one."""

    def __init__(self, body: Mapping[str, Any]) -> None:
        self._body: Mapping[str, Any] | None = body
        self._version = 0
        self._next = asyncio.Event()  # set (then replaced) when the version moves on

    @property
    def version(self) -> int:
        return self._version

    def get(self) -> Mapping[str, Any] | None:
        return self._body

    def set(self, body: Mapping[str, Any]) -> None:
        self._advance(body)

    def end(self) -> None:
        """The model is gone: `get` returns None, and a waiter wakes to see it."""
        self._advance(None)

    async def changed_since(self, version: int) -> None:
        """Returns once the body is newer than `version` (at once when it already is)."""
        while self._version == version:
            await self._next.wait()

    def _advance(self, body: Mapping[str, Any] | None) -> None:
        self._body = body
        self._version += 1
        waiters, self._next = self._next, asyncio.Event()
        waiters.set()

"""KV admission: requests wait first come first served for pages, bounded, never lose a page."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from pdwarden_runtime.engines.kv_admission import KVAdmission
from pdwarden_runtime.transfer.kvpool import KVPool, PagesExhausted, PoolShape

pytestmark = pytest.mark.unit


def _pool(pages: int = 8, aux: int = 4) -> KVPool:
    return KVPool(PoolShape(layers=1, pages=pages, page_bytes=8, aux_slots=aux))


async def test_a_request_that_fits_is_admitted_at_once_and_its_pages_come_back() -> None:
    pool = _pool()
    admission = KVAdmission(pool, asyncio.get_running_loop())
    pages, aux = await admission.take(5, timeout=1)
    assert len(pages) == 5 and pool.free_pages == 3 and pool.free_aux == 3
    admission.give(pages, aux)
    assert pool.free_pages == 8 and pool.free_aux == 4


async def test_requests_wait_in_arrival_order_and_a_big_one_is_not_overtaken() -> None:
    pool = _pool(pages=8)
    admission = KVAdmission(pool, asyncio.get_running_loop())
    first = await admission.take(6, timeout=1)
    order: list[str] = []

    async def want(name: str, n: int) -> tuple[Any, int]:
        got = await admission.take(n, timeout=5)
        order.append(name)
        return got

    big = asyncio.ensure_future(want("big", 8))
    await asyncio.sleep(0.01)
    small = asyncio.ensure_future(want("small", 1))  # 2 pages are free, but it is behind `big`
    await asyncio.sleep(0.05)
    assert order == [] and admission.waiting == 2
    admission.give(*first)
    big_pages, big_aux = await big
    assert order == ["big"] and not small.done()
    admission.give(big_pages, big_aux)
    await small
    assert order == ["big", "small"]


async def test_a_wait_past_its_bound_fails_with_the_figures_and_leaves_the_queue() -> None:
    pool = _pool(pages=4)
    admission = KVAdmission(pool, asyncio.get_running_loop())
    held = await admission.take(4, timeout=1)
    with pytest.raises(PagesExhausted, match=r"waited 0.05s for 2 KV pages \(0 of 4 free"):
        await admission.take(2, timeout=0.05)
    assert admission.waiting == 0
    admission.give(*held)
    assert pool.free_pages == 4


async def test_a_request_larger_than_the_pool_is_refused_at_once() -> None:
    admission = KVAdmission(_pool(pages=4), asyncio.get_running_loop())
    with pytest.raises(PagesExhausted, match="the pool has 4"):
        await admission.take(5, timeout=10)


async def test_a_cancelled_waiter_lets_the_next_one_in_and_loses_no_page() -> None:
    pool = _pool(pages=4)
    admission = KVAdmission(pool, asyncio.get_running_loop())
    held = await admission.take(3, timeout=1)
    blocked = asyncio.ensure_future(admission.take(4, timeout=5))  # the head: needs everything
    await asyncio.sleep(0.01)
    behind = asyncio.ensure_future(admission.take(1, timeout=5))
    await asyncio.sleep(0.01)
    assert not behind.done()
    blocked.cancel()  # the client left
    pages, aux = await asyncio.wait_for(behind, 1)
    admission.give(pages, aux)
    admission.give(*held)
    assert pool.free_pages == 4 and pool.free_aux == 4 and admission.waiting == 0


async def test_pages_given_back_from_another_thread_wake_the_queue() -> None:
    pool = _pool(pages=2)
    admission = KVAdmission(pool, asyncio.get_running_loop())
    held = await admission.take(2, timeout=1)
    waiting = asyncio.ensure_future(admission.take(2, timeout=5))
    await asyncio.sleep(0.01)
    threading.Thread(target=admission.give, args=held).start()  # a drain ends in SGLang's threads
    pages, _aux = await asyncio.wait_for(waiting, 2)
    assert len(pages) == 2


async def test_try_take_never_jumps_the_queue() -> None:
    pool = _pool(pages=4)
    admission = KVAdmission(pool, asyncio.get_running_loop())
    held = await admission.take(3, timeout=1)
    waiting = asyncio.ensure_future(admission.take(2, timeout=5))
    await asyncio.sleep(0.01)
    assert admission.try_take(1) is None  # a page is free, but a request waits for it
    admission.give(*held)
    admission.give(*(await waiting))
    got = admission.try_take(1)
    assert got is not None and len(got[0]) == 1

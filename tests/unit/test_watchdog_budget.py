"""The operator-wide scrape budget's limiter (watchdog/budget.py), as pure logic: amounts taken
never exceed the capacity, waiters are granted when room frees up (small ones first), a
cancelled waiter gives back what it was granted, and parse workers release from their threads."""

from __future__ import annotations

import asyncio
import threading

import pytest

from pdwarden_operator.watchdog import budget as scrape_budget
from pdwarden_operator.watchdog.budget import BudgetBusy, Limiter, Reservation, ScrapeBudget

pytestmark = pytest.mark.unit


async def settle() -> None:
    """Let every ready callback run (grants are delivered through the loop)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_waiters_are_granted_in_order_as_room_frees_up() -> None:
    limiter = Limiter(3)
    await limiter.acquire(3)
    order: list[int] = []

    async def take(i: int) -> None:
        await limiter.acquire(1)
        order.append(i)

    tasks = [asyncio.create_task(take(i)) for i in range(4)]
    await settle()
    assert order == [] and limiter.waiting == 4 and limiter.used == 3
    limiter.release(2)
    await settle()
    assert order == [0, 1] and limiter.used == 3
    limiter.release(3)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3] and limiter.used == 2 and limiter.peak == 3


async def test_a_small_request_passes_a_big_one_that_waits() -> None:
    limiter = Limiter(10)
    await limiter.acquire(6)
    big = asyncio.create_task(limiter.acquire(8))
    await settle()
    small = asyncio.create_task(limiter.acquire(3))
    await settle()
    assert small.done() and not big.done()
    limiter.release(6)
    limiter.release(3)
    await asyncio.wait_for(big, 5)
    assert limiter.used == 8


async def test_a_cancelled_waiter_gives_back_what_it_was_granted() -> None:
    limiter = Limiter(2)
    await limiter.acquire(2)
    waiter = asyncio.create_task(limiter.acquire(2))
    await settle()
    limiter.release(2)  # granted, but the grant reaches it through the loop...
    waiter.cancel()  # ...after it was cancelled
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert limiter.used == 0 and limiter.waiting == 0
    other = asyncio.create_task(limiter.acquire(1))
    waiting = asyncio.create_task(limiter.acquire(2))
    await settle()
    waiting.cancel()  # cancelled while still waiting: leaves the queue
    await asyncio.gather(waiting, return_exceptions=True)
    await other
    assert limiter.used == 1 and limiter.waiting == 0


async def test_a_release_from_another_thread_wakes_the_waiting_loop() -> None:
    limiter = Limiter(1)
    await limiter.acquire(1)
    waiter = asyncio.create_task(limiter.acquire(1))
    await settle()
    threading.Thread(target=limiter.release, args=(1,)).start()
    await asyncio.wait_for(waiter, 10)
    assert limiter.used == 1


async def test_more_than_the_capacity_is_refused_and_over_release_is_a_bug() -> None:
    limiter = Limiter(4)
    with pytest.raises(ValueError):
        await limiter.acquire(5)
    with pytest.raises(RuntimeError):
        limiter.release(1)


async def test_a_wait_that_runs_out_leaves_the_queue_and_a_late_grant_is_given_back() -> None:
    limiter = Limiter(2)
    await limiter.acquire(2)
    with pytest.raises(TimeoutError):
        await limiter.acquire(1, 0.02)
    assert limiter.waiting == 0 and limiter.used == 2
    # granted, and its time runs out before the grant's wake-up lands: the grant comes back
    waiting = asyncio.create_task(limiter.acquire(1, 10.0))
    await settle()
    (waiter,) = limiter._waiters
    limiter.release(1)
    assert waiter.granted and limiter.used == 2
    scrape_budget._expire(waiter.future)
    with pytest.raises(TimeoutError):
        await waiting
    await settle()
    assert limiter.used == 1 and limiter.waiting == 0
    limiter.release(1)
    await limiter.acquire(2, 0.01)  # all free again: taken at once


async def test_a_reservation_grows_and_is_released_once() -> None:
    limiter = Limiter(100)
    reservation = Reservation(limiter)
    await reservation.grow_to(30)
    await reservation.grow_to(20)  # never shrinks
    await reservation.grow_to(500)  # capped at the whole budget
    assert reservation.held == 100 and limiter.used == 100
    reservation.release()
    reservation.release()
    assert limiter.used == 0


async def test_a_reservation_that_cannot_grow_in_time_times_out_holding_what_it_held() -> None:
    limiter = Limiter(100)
    other, reservation = Reservation(limiter), Reservation(limiter)
    await other.grow_to(80)
    await reservation.grow_to(20, 0.05)  # fits: taken at once
    with pytest.raises(TimeoutError):
        await reservation.grow_to(60, 0.05)  # 40 more of none free
    assert reservation.held == 20 and limiter.used == 100 and limiter.waiting == 0
    other.release()
    await reservation.grow_to(60, 0.05)
    assert reservation.held == 60 and limiter.used == 60
    reservation.release()
    assert limiter.used == 0


async def test_no_slot_in_time_is_budget_busy_and_leaks_nothing() -> None:
    budget = ScrapeBudget(max_scrapes=1)
    async with budget.slot(1.0):
        with pytest.raises(BudgetBusy, match="operator-wide limit 1"):
            async with budget.slot(0.05):
                pass
    assert budget.slots.used == 0 and budget.slots.waiting == 0


async def test_a_large_body_is_parsed_on_a_worker_and_its_bytes_released_when_done() -> None:
    budget = ScrapeBudget(parse_workers=1, inline_parse_bytes=999)
    reservation = budget.reservation()
    await reservation.grow_to(1000)
    loop_thread = threading.current_thread()
    try:
        worker = await budget.parse(reservation, threading.current_thread, 1000)
    finally:
        budget.close()
    assert worker is not loop_thread and worker.name.startswith("pdwarden-parse")
    assert budget.bytes.used == 0


async def test_a_small_body_is_parsed_on_the_loop_and_its_bytes_released_even_on_error() -> None:
    budget = ScrapeBudget(parse_workers=1, inline_parse_bytes=1000)
    loop_thread = threading.current_thread()
    first, second = budget.reservation(), budget.reservation()
    await first.grow_to(1000)
    await second.grow_to(1000)

    def refuse() -> None:
        raise ValueError("garbage")

    try:
        parser = await budget.parse(first, threading.current_thread, 1000)
        assert budget.bytes.used == 1000
        with pytest.raises(ValueError, match="garbage"):
            await budget.parse(second, refuse, 1000)
    finally:
        budget.close()
    assert parser is loop_thread
    assert budget.bytes.used == 0


def test_a_budget_must_hold_one_body_of_the_limit() -> None:
    with pytest.raises(ValueError, match="must hold one body"):
        ScrapeBudget(max_bytes_in_flight=1000, max_body=2000)

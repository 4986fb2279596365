"""Request deadlines without a timer per request: a request past its bound ends with TimeoutError within a
tick of it; requests that end in time leave nothing behind; a cancellation from elsewhere stays one."""

from __future__ import annotations

import asyncio

import pytest

from webhook.deadline import Deadlines


async def test_a_request_past_its_bound_ends_with_timeout_error_within_a_tick() -> None:
    deadlines = Deadlines(tick=0.02)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError), deadlines.bound(0.05):
        await asyncio.sleep(30)
    # the bound plus a tick, with room for a loaded machine; never the 30 s of the sleep
    assert 0.05 <= loop.time() - started < 5
    assert len(deadlines) == 0


async def test_requests_in_time_are_untouched_and_leave_nothing_behind() -> None:
    deadlines = Deadlines(tick=0.01)

    async def request(delay: float) -> str:
        with deadlines.bound(5):
            await asyncio.sleep(delay)
        return "answered"

    assert await asyncio.gather(*[request(0.001 * n) for n in range(50)]) == ["answered"] * 50
    assert len(deadlines) == 0
    for _ in range(100):  # polled: the sweeping timer stops once nothing is in flight
        if deadlines._timer is None:
            break
        await asyncio.sleep(0.01)
    assert deadlines._timer is None


async def test_only_the_requests_past_due_are_cancelled() -> None:
    deadlines = Deadlines(tick=0.01)

    async def request(bound: float, delay: float) -> str:
        try:
            with deadlines.bound(bound):
                await asyncio.sleep(delay)
        except TimeoutError:
            return "timed out"
        return "answered"

    results = await asyncio.gather(request(0.05, 10), request(10, 0.2), request(0.05, 10), request(10, 0))
    assert results == ["timed out", "answered", "timed out", "answered"]


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    deadlines = Deadlines(tick=0.01)
    entered = asyncio.Event()

    async def request() -> None:
        with deadlines.bound(10):
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(request())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(deadlines) == 0


async def test_one_bound_per_task_at_a_time() -> None:
    deadlines = Deadlines()
    with deadlines.bound(1), pytest.raises(RuntimeError), deadlines.bound(1):
        pass
    assert len(deadlines) == 0


def test_the_tick_is_positive() -> None:
    with pytest.raises(ValueError):
        Deadlines(tick=0)


def test_one_deadlines_serves_one_loop_after_another() -> None:
    deadlines = Deadlines(tick=0.01)

    async def slow() -> str:
        try:
            with deadlines.bound(0.02):
                await asyncio.sleep(10)
        except TimeoutError:
            return "timed out"
        return "answered"

    async def fast() -> str:
        with deadlines.bound(5):
            await asyncio.sleep(0)
        return "answered"

    for _ in range(2):  # a new loop each time: the bound finds the running one
        assert asyncio.run(fast()) == "answered"
        assert asyncio.run(slow()) == "timed out"
    assert len(deadlines) == 0

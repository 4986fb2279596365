"""The reconcile runner: what every controller gets from it (sync wait, leader gate, wake and settle, requeue,
backoff, the error line and controller-runtime's metrics) and the keyed queue's per-object guarantees."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import logging
from collections.abc import Awaitable, Callable

import pytest
from prometheus_client import CollectorRegistry

import extender.kube.client  # noqa: F401  (the runner's error line imports it on first use: not timed here)
from extender.common.tasks import cancel_and_wait
from extender.controllers.runner import (
    Backoff,
    ControllerMetrics,
    KeyedQueue,
    KeyedReconciler,
    Reconciler,
    Runner,
)


class Flag:
    def __init__(self, is_leader: bool) -> None:
        self.is_leader = is_leader


class Cache:
    def __init__(self) -> None:
        self.synced = asyncio.Event()


async def until(check: Callable[[], bool], seconds: float = 5.0) -> None:
    async with asyncio.timeout(seconds):
        while not check():
            await asyncio.sleep(0.005)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def running(runner: Runner, controller: Reconciler | KeyedReconciler[str],
                  body: Callable[[], Awaitable[None]]) -> None:
    task = asyncio.create_task(runner.run(controller))
    try:
        await body()
    finally:
        await cancel_and_wait([task])


async def test_no_reconcile_before_every_cache_it_reads_has_synced() -> None:
    calls: list[dt.datetime] = []
    caches = [Cache(), Cache()]

    async def reconcile(now: dt.datetime) -> None:
        calls.append(now)

    async def body() -> None:
        caches[0].synced.set()
        await asyncio.sleep(0.05)
        assert calls == []
        caches[1].synced.set()
        await until(lambda: len(calls) == 1)

    await running(Runner(), Reconciler("c", reconcile, interval=60, caches=caches), body)


async def test_a_leader_only_controller_acts_only_while_leading_and_forgets_on_demotion(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("extender.controllers.runner.LEADER_POLL_SECONDS", 0.01)
    leader, calls, demoted = Flag(False), [], []

    async def reconcile(now: dt.datetime) -> None:
        calls.append(now)

    controller = Reconciler("c", reconcile, interval=0.01, leader_only=True,
                            on_demoted=lambda: demoted.append(True))

    async def body() -> None:
        await asyncio.sleep(0.05)
        assert calls == []
        leader.is_leader = True
        await until(lambda: len(calls) >= 2)
        leader.is_leader = False
        await until(lambda: demoted == [True])
        seen = len(calls)
        await asyncio.sleep(0.05)
        assert len(calls) == seen  # a follower does nothing
        assert demoted == [True]  # once per loss, not per round

    await running(Runner(leader), controller, body)


async def test_losing_leadership_cancels_a_pass_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that outlasts the Lease (a cloud call, a write on a cut network) stops when leadership is lost,
    before it does its next thing: the replica that stepped down buys nothing more."""
    monkeypatch.setattr("extender.controllers.runner.LEADER_POLL_SECONDS", 0.01)
    leader, registry = Flag(True), CollectorRegistry()
    started, bought, demoted = asyncio.Event(), [], []
    answered = asyncio.Event()  # the cloud's answer to the call in flight

    async def reconcile(now: dt.datetime) -> None:
        started.set()
        await answered.wait()
        bought.append("the next VM")

    controller = Reconciler("c", reconcile, interval=0.01, leader_only=True,
                            on_demoted=lambda: demoted.append(True))

    async def body() -> None:
        await started.wait()
        leader.is_leader = False
        await until(lambda: demoted == [True])
        answered.set()
        await asyncio.sleep(0.05)
        assert bought == []
        assert sample(registry, "controller_runtime_reconcile_errors_total", controller="c") == 0

    await running(Runner(leader, ControllerMetrics(registry)), controller, body)


async def test_a_pass_that_is_not_leader_only_runs_to_its_end() -> None:
    answered, done = asyncio.Event(), []

    async def reconcile(now: dt.datetime) -> None:
        await answered.wait()
        done.append(now)

    async def body() -> None:
        await asyncio.sleep(0.02)
        answered.set()
        await until(lambda: len(done) == 1)

    await running(Runner(Flag(False)), Reconciler("c", reconcile, interval=60), body)


async def test_a_controller_that_is_not_leader_only_runs_on_every_replica() -> None:
    calls: list[dt.datetime] = []

    async def reconcile(now: dt.datetime) -> None:
        calls.append(now)

    await running(Runner(Flag(False)), Reconciler("c", reconcile, interval=60),
                  lambda: until(lambda: len(calls) == 1))


async def test_a_wake_reconciles_after_the_settle_time_once_for_a_burst() -> None:
    calls: list[float] = []
    loop = asyncio.get_running_loop()

    async def reconcile(now: dt.datetime) -> None:
        calls.append(loop.time())

    controller = Reconciler("c", reconcile, settle=0.1)  # interval inf: only when woken

    async def body() -> None:
        await until(lambda: len(calls) == 1)  # the first pass
        await asyncio.sleep(0.05)
        woken = loop.time()
        for _ in range(10):
            controller.wake()
        await until(lambda: len(calls) == 2)
        assert calls[1] - woken >= 0.09
        await asyncio.sleep(0.2)
        assert len(calls) == 2  # ten wakes, one pass

    await running(Runner(), controller, body)


async def test_the_returned_requeue_decides_when_the_next_pass_runs() -> None:
    calls: list[float] = []
    loop = asyncio.get_running_loop()

    async def reconcile(now: dt.datetime) -> float | None:
        calls.append(loop.time())
        return 0.05 if len(calls) < 3 else None

    async def body() -> None:
        await until(lambda: len(calls) == 3)
        await asyncio.sleep(0.2)
        assert len(calls) == 3  # None: the interval (an hour) applies again

    await running(Runner(), Reconciler("c", reconcile, interval=3600), body)


async def test_min_gap_spaces_passes_however_often_it_is_woken() -> None:
    calls: list[float] = []
    loop = asyncio.get_running_loop()

    async def reconcile(now: dt.datetime) -> None:
        calls.append(loop.time())

    controller = Reconciler("c", reconcile, settle=0.0, min_gap=0.1)

    async def body() -> None:
        for _ in range(30):
            controller.wake()
            await asyncio.sleep(0.01)
        await until(lambda: len(calls) >= 3)
        gaps = [b - a for a, b in itertools.pairwise(calls)]
        assert min(gaps) >= 0.09

    await running(Runner(), controller, body)


async def test_a_failure_is_logged_counted_and_retried_with_growing_backoff(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr("extender.controllers.runner.BACKOFF_BASE_SECONDS", 0.02)
    registry = CollectorRegistry()
    calls: list[float] = []
    delays: list[float] = []
    loop = asyncio.get_running_loop()
    backoff_next = Backoff.next

    def recorded(backoff: Backoff) -> float:
        delays.append(backoff_next(backoff))
        return delays[-1]

    monkeypatch.setattr(Backoff, "next", recorded)

    async def reconcile(now: dt.datetime) -> None:
        calls.append(loop.time())
        if len(calls) <= 3:
            raise RuntimeError("the API server said no")

    async def body() -> None:
        await until(lambda: len(calls) == 4)

    with caplog.at_level(logging.ERROR, logger="extender.controllers.runner"):
        await running(Runner(metrics=ControllerMetrics(registry)),
                      Reconciler("flaky", reconcile, interval=3600), body)
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert delays == [0.02, 0.04, 0.08]  # doubled per failure in a row, not the hour's interval
    assert all(g >= d * 0.9 for g, d in zip(gaps, delays, strict=True))  # and waited (load only adds time)
    assert sample(registry, "controller_runtime_reconcile_errors_total", controller="flaky") == 3
    assert sample(registry, "controller_runtime_reconcile_total", controller="flaky", result="error") == 3
    assert sample(registry, "controller_runtime_reconcile_total", controller="flaky", result="success") == 1
    assert sample(registry, "controller_runtime_reconcile_time_seconds_count", controller="flaky") == 4
    failures = [r for r in caplog.records if r.getMessage() == "reconcile failed"]
    assert len(failures) == 3 and all(getattr(r, "controller", "") == "flaky" for r in failures)


def test_a_queued_key_keeps_its_place_and_takes_the_latest_value() -> None:
    queue: KeyedQueue[int] = KeyedQueue()
    queue.add("a", 1)
    queue.add("b", 2)
    queue.add("a", 3)
    assert list(queue) == ["a", "b"] and len(queue) == 2 and "a" in queue
    assert queue.pop(busy={"a"}) == ("b", 2)
    assert queue.pop() == ("a", 3)
    assert queue.pop() is None


async def test_keyed_work_never_runs_one_key_twice_at_once_and_respects_the_worker_bound() -> None:
    active: dict[str, int] = {}
    most_at_once = 0
    done: list[tuple[str, str]] = []
    release = asyncio.Event()

    async def reconcile(key: str, value: str) -> None:
        nonlocal most_at_once
        active[key] = active.get(key, 0) + 1
        most_at_once = max(most_at_once, sum(active.values()))
        assert active[key] == 1
        await release.wait()
        active[key] -= 1
        done.append((key, value))

    controller: KeyedReconciler[str] = KeyedReconciler("k", reconcile, workers=2)

    async def body() -> None:
        controller.queue.add("a", "1")
        controller.queue.add("b", "1")
        controller.queue.add("c", "1")
        await until(lambda: sum(active.values()) == 2)
        controller.queue.add("a", "2")  # a is running: its new value waits for it
        await asyncio.sleep(0.05)
        assert sum(active.values()) == 2
        release.set()
        await until(lambda: len(done) == 4)

    await running(Runner(), controller, body)
    assert most_at_once == 2
    assert sorted(done) == [("a", "1"), ("a", "2"), ("b", "1"), ("c", "1")]


async def test_a_failed_key_is_retried_after_its_backoff_unless_retries_are_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("extender.controllers.runner.BACKOFF_BASE_SECONDS", 0.01)
    calls: list[str] = []

    async def reconcile(key: str, value: str) -> None:
        calls.append(key)
        if len(calls) < 3:
            raise RuntimeError("boom")

    retried: KeyedReconciler[str] = KeyedReconciler("k", reconcile)

    async def body() -> None:
        retried.queue.add("a", "v")
        await until(lambda: len(calls) == 3)

    await running(Runner(), retried, body)
    calls.clear()
    once: KeyedReconciler[str] = KeyedReconciler("k", reconcile, retry_errors=False)

    async def body_once() -> None:
        once.queue.add("a", "v")
        await until(lambda: len(calls) == 1)
        await asyncio.sleep(0.1)
        assert calls == ["a"]

    await running(Runner(), once, body_once)


async def test_losing_leadership_cancels_keyed_work_in_flight_and_drops_the_queue(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("extender.controllers.runner.LEADER_POLL_SECONDS", 0.01)
    leader = Flag(True)
    started: list[str] = []
    cancelled: list[str] = []
    demoted: list[bool] = []

    async def reconcile(key: str, value: str) -> None:
        started.append(key)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(key)
            raise

    controller: KeyedReconciler[str] = KeyedReconciler("k", reconcile, leader_only=True,
                                                       on_demoted=lambda: demoted.append(True))

    async def body() -> None:
        controller.queue.add("a", "v")
        await until(lambda: started == ["a"])
        controller.queue.add("a", "again")  # waits for the run of a
        leader.is_leader = False
        await until(lambda: cancelled == ["a"] and demoted == [True])
        assert len(controller.queue) == 0
        controller.queue.add("b", "v")  # queued while following: not worked
        await asyncio.sleep(0.05)
        assert started == ["a"]

    await running(Runner(leader), controller, body)

"""The one reconcile runner: every background controller of ``tf-extender serve`` runs through it.

A controller is data, not a loop: a name, whether it acts only while this process leads, the caches it
reads (waited for before its first reconcile), and one of two shapes, as controller-runtime has them:

- ``Reconciler``: ``reconcile(now) -> requeue_after`` over the whole picture, run again after
  ``requeue_after`` seconds (``None``: after ``interval``), or sooner when its ``Wake`` is set (then after
  ``settle`` seconds, so a burst of watch events makes one pass);
- ``KeyedReconciler``: per-object work from a ``KeyedQueue`` (one entry per key, the latest value wins),
  ``reconcile(key, value) -> requeue_after``, at most ``workers`` keys at once and never one key twice.

The runner owns what each controller used to write out itself: the wait for its caches, the leader gate
(a leader-only controller does nothing while another replica leads; when leadership is lost, its pass
or keyed work in flight is cancelled and its queue dropped, since the new leader rebuilds it from the
cluster), the wake and settle, the requeue, exponential backoff after an error, one log line per error,
and controller-runtime's reconcile metrics (``controller_runtime_reconcile_total``, ``..._errors_total``,
``..._time_seconds``, and ``workqueue_depth`` for keyed queues), so its dashboards work unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from extender.common.tasks import cancel_and_wait

log = logging.getLogger(__name__)

V = TypeVar("V")

SETTLE_SECONDS = 0.5  # after a wake-up, let a burst of watch events settle before reconciling
LEADER_POLL_SECONDS = 1.0  # how often a controller waiting for leadership looks again
BACKOFF_BASE_SECONDS = 0.5  # the first retry after an error; doubled per error in a row
BACKOFF_CAP_SECONDS = 60.0
# controller-runtime's buckets for controller_runtime_reconcile_time_seconds
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7,
                     0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0,
                     10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0)


class Synced(Protocol):
    """A cache a controller reads: ``synced`` is set once its first list is in."""

    @property
    def synced(self) -> asyncio.Event: ...


class Leader(Protocol):
    """Whether this process may act on the cluster now."""

    @property
    def is_leader(self) -> bool: ...


class Wake:
    """Asks a controller to reconcile soon (after its settle time). Callable with any arguments, so it is
    a watch listener (``cache.subscribe(wake)``) as it is."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def __call__(self, *_: Any) -> None:
        self.event.set()


class KeyedQueue(Generic[V]):
    """Work per key, first in first out; adding a key already queued replaces its value in place."""

    def __init__(self) -> None:
        self._items: OrderedDict[str, V] = OrderedDict()
        self.ready = asyncio.Event()

    def add(self, key: str, value: V) -> None:
        self._items[key] = value
        self.ready.set()

    def pop(self, busy: Iterable[str] = ()) -> tuple[str, V] | None:
        """The oldest entry whose key is not ``busy``, taken out of the queue."""
        skip = set(busy)
        for key in self._items:
            if key not in skip:
                return key, self._items.pop(key)
        return None

    def clear(self) -> None:
        self._items.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        """The keys waiting, oldest first."""
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)


@dataclass(eq=False)
class Reconciler:
    """A controller over the whole picture (controller-runtime's singleton reconciler)."""

    name: str
    reconcile: Callable[[dt.datetime], Awaitable[float | None]]
    interval: float = math.inf  # seconds between passes when nothing asks sooner; inf: only when woken
    leader_only: bool = False
    caches: Sequence[Synced] = ()
    wake: Wake = field(default_factory=Wake)
    settle: float = SETTLE_SECONDS
    min_gap: float = 0.0  # at least this long from the start of one pass to the start of the next
    on_demoted: Callable[[], None] | None = None  # leadership was lost: forget what only a leader keeps


@dataclass(eq=False)
class KeyedReconciler(Generic[V]):
    """A controller of per-object work."""

    name: str
    reconcile: Callable[[str, V], Awaitable[float | None]]
    queue: KeyedQueue[V] = field(default_factory=KeyedQueue)
    leader_only: bool = False
    caches: Sequence[Synced] = ()
    workers: int = 1  # keys reconciled at once; 0: no bound
    retry_errors: bool = True  # a failed key is queued again after its backoff
    on_demoted: Callable[[], None] | None = None


Controller = Reconciler | KeyedReconciler[Any]


class ControllerMetrics:
    """controller-runtime's reconcile metrics, labelled by controller."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry or CollectorRegistry()
        self.total = Counter("controller_runtime_reconcile_total",
                             "Reconciles per controller and result (success, error, requeue_after)",
                             ["controller", "result"], registry=r)
        self.errors = Counter("controller_runtime_reconcile_errors_total", "Reconciles that failed",
                              ["controller"], registry=r)
        self.time = Histogram("controller_runtime_reconcile_time_seconds", "Time of one reconcile",
                              ["controller"], buckets=RECONCILE_BUCKETS, registry=r)
        self.depth = Gauge("workqueue_depth", "Keys waiting in a controller's queue", ["name"], registry=r)


class _Always:
    is_leader = True


class Backoff:
    """Exponential: ``base``, doubled per failure in a row, at most ``cap``."""

    def __init__(self, base: float | None = None, cap: float | None = None) -> None:
        self.base = BACKOFF_BASE_SECONDS if base is None else base
        self.cap = BACKOFF_CAP_SECONDS if cap is None else cap
        self.failures = 0

    def next(self) -> float:
        self.failures += 1
        return float(min(self.cap, self.base * 2.0 ** (self.failures - 1)))

    def reset(self) -> None:
        self.failures = 0


async def wait_synced(caches: Iterable[Synced]) -> None:
    """Until every cache has synced."""
    await asyncio.gather(*(cache.synced.wait() for cache in caches))


class Runner:
    """Runs controllers: ``run(controller)`` returns only when cancelled."""

    def __init__(self, leader: Leader | None = None, metrics: ControllerMetrics | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.leader: Leader = leader or _Always()
        self.metrics = metrics or ControllerMetrics()
        self._clock = clock

    def leads(self, controller: Controller) -> bool:
        return not controller.leader_only or self.leader.is_leader

    async def run(self, controller: Controller) -> None:
        await wait_synced(controller.caches)
        if isinstance(controller, Reconciler):
            await self._run_reconciler(controller)
        else:
            await self._run_keyed(controller)

    # -- the whole-picture shape ------------------------------------------------------------------

    async def _run_reconciler(self, c: Reconciler) -> None:
        backoff = Backoff(cap=min(BACKOFF_CAP_SECONDS, c.interval))
        leading = False
        while True:
            started = self._clock()
            delay: float | None = c.interval
            if self.leads(c):
                leading = True
                requeue, failed = await self._while_leading(c)
                if failed:
                    delay = backoff.next()
                else:
                    backoff.reset()
                    if requeue is not None:
                        delay = requeue
            else:
                if leading and c.on_demoted is not None:
                    c.on_demoted()
                leading = False
                delay = min(c.interval, LEADER_POLL_SECONDS)
            woken = await _wait(c.wake.event, delay)
            if woken:
                await asyncio.sleep(c.settle)
            if c.min_gap:
                await asyncio.sleep(max(0.0, started + c.min_gap - self._clock()))

    async def _while_leading(self, c: Reconciler) -> tuple[float | None, bool]:
        """One pass of ``c``. A leader-only pass is cancelled as soon as leadership is lost: a pass can
        outlast the Lease (a cloud call, a write waiting on a cut network), and what it would go on to do
        (buy the next VM, write a claim's phase) is the new leader's now, which redoes it from the cluster."""
        pass_ = self._timed(c.name, c.reconcile(dt.datetime.now(dt.UTC)))
        if not c.leader_only:
            return await pass_
        task = asyncio.ensure_future(pass_)
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=LEADER_POLL_SECONDS)
                if not task.done() and not self.leads(c):
                    log.warning("leadership lost: pass cancelled", extra={"controller": c.name})
                    await cancel_and_wait([task])
                    return None, False
        finally:
            if not task.done():  # the runner itself is stopping
                await cancel_and_wait([task])
        return task.result()

    async def _timed(self, name: str, pass_: Awaitable[float | None]) -> tuple[float | None, bool]:
        """Run one reconcile; its requeue and whether it failed, counted and logged."""
        started = time.perf_counter()
        try:
            requeue = await pass_
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            from extender.kube.client import error_message  # here: the option declarations import this

            log.exception("reconcile failed", extra={"controller": name, "error": error_message(exc)})
            self.metrics.errors.labels(name).inc()
            self.metrics.total.labels(name, "error").inc()
            return None, True
        finally:
            self.metrics.time.labels(name).observe(time.perf_counter() - started)
        self.metrics.total.labels(name, "success" if requeue is None else "requeue_after").inc()
        return requeue, False

    # -- the per-object shape ------------------------------------------------------------------------

    async def _run_keyed(self, c: KeyedReconciler[Any]) -> None:
        running: dict[str, asyncio.Task[None]] = {}
        backoffs: dict[str, Backoff] = {}
        depth = self.metrics.depth.labels(c.name)
        leading = False

        def done(key: str, task: asyncio.Task[None]) -> None:
            if running.get(key) is task:
                del running[key]
            c.queue.ready.set()  # a worker is free, or the key may run again

        async def work(key: str, value: Any) -> None:
            requeue, failed = await self._timed(c.name, c.reconcile(key, value))
            if failed and c.retry_errors:
                requeue = backoffs.setdefault(key, Backoff()).next()
            else:
                backoffs.pop(key, None)
            if requeue is not None:
                asyncio.get_running_loop().call_later(requeue, self._requeue, c, key, value)

        try:
            while True:
                if not self.leads(c):
                    await cancel_and_wait(list(running.values()))
                    c.queue.clear()  # a follower keeps no work: the leader rebuilds it from the cluster
                    backoffs.clear()
                    if leading and c.on_demoted is not None:
                        c.on_demoted()
                    leading = False
                    depth.set(0)
                    await asyncio.sleep(LEADER_POLL_SECONDS)
                    continue
                leading = True
                c.queue.ready.clear()
                while not c.workers or len(running) < c.workers:
                    entry = c.queue.pop(busy=running)
                    if entry is None:
                        break
                    key, value = entry
                    task = asyncio.create_task(work(key, value), name=f"{c.name}-{key}")
                    running[key] = task
                    task.add_done_callback(functools.partial(done, key))
                depth.set(len(c.queue))
                await _wait(c.queue.ready, LEADER_POLL_SECONDS if c.leader_only else math.inf)
        finally:
            await cancel_and_wait(list(running.values()))

    def _requeue(self, c: KeyedReconciler[Any], key: str, value: Any) -> None:
        if key not in c.queue and self.leads(c):
            c.queue.add(key, value)


async def _wait(event: asyncio.Event, seconds: float | None) -> bool:
    """Wait for ``event`` at most ``seconds`` (inf or None: no bound); True when it was set (and clear it)."""
    # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation (shutdown hangs)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(None if seconds is None or math.isinf(seconds) else max(0.0, seconds)):
            await event.wait()
    woken = event.is_set()
    event.clear()
    return woken

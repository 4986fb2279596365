"""Request deadlines without a timer per request.

``asyncio.timeout`` schedules a timer for every request and cancels it when the request ends early, as
nearly every admission does: at thousands of requests a second with an 8 s bound, the event loop's timer
heap holds tens of thousands of cancelled timers, and every push compares timers in Python. ``Deadlines``
keeps the requests in flight in a dict instead; one timer, running only while requests are in flight, looks
at them every ``tick`` seconds and cancels those past due, so a request ends at most ``tick`` after its
deadline. Inside ``with deadlines.bound(seconds):`` the effect is ``async with asyncio.timeout(seconds)``'s:
the cancellation it caused leaves the block as ``TimeoutError``, any other cancellation as itself.

Event-loop only (not thread-safe), like the rest of the server.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

DEFAULT_REQUEST_TIMEOUT = 8.0  # seconds to answer one AdmissionReview (tf-webhook serve --request-timeout)
DEFAULT_TICK = 0.1


class Deadlines:
    def __init__(self, tick: float = DEFAULT_TICK) -> None:
        if tick <= 0:
            raise ValueError("tick must be positive")
        self.tick = tick
        self._due: dict[asyncio.Task[object], Deadline] = {}
        self._timer: asyncio.TimerHandle | None = None
        # The loop of the last bound: asyncio.current_task(loop) is a dict lookup, while finding the running
        # loop costs a getpid() system call per request on Python 3.11.
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        return len(self._due)

    def bound(self, seconds: float) -> Deadline:
        """A context manager bounding the current task's time inside it to ``seconds`` (plus up to a tick)."""
        # A task is current on a loop only while that loop runs it, in the calling thread (one thread at a
        # time uses these Deadlines): found there, it is ours; else the running loop is another one.
        loop = self._loop
        task = asyncio.current_task(loop) if loop is not None else None
        if task is None or loop is None:
            loop = asyncio.get_running_loop()
            if loop is not self._loop:  # another loop (tests run one after another): its own timer and tasks
                self._loop, self._timer = loop, None
                self._due = {t: d for t, d in self._due.items() if t.get_loop() is loop}
            task = asyncio.current_task(loop)
            if task is None:
                raise RuntimeError("Deadlines.bound needs a running task")
        return Deadline(self, task, loop.time() + seconds)

    def _sweep(self) -> None:
        self._timer = None
        if not self._due:
            return  # nothing in flight: the next request starts the timer again
        loop = next(iter(self._due.values())).task.get_loop()
        now = loop.time()
        for deadline in [d for d in self._due.values() if d.when <= now and not d.expired]:
            deadline.expired = True
            deadline.task.cancel()
        self._timer = loop.call_later(self.tick, self._sweep)


class Deadline:
    __slots__ = ("_cancelling", "_deadlines", "expired", "task", "when")

    def __init__(self, deadlines: Deadlines, task: asyncio.Task[object], when: float) -> None:
        self._deadlines = deadlines
        self.task = task
        self.when = when
        self.expired = False
        self._cancelling = 0

    def __enter__(self) -> Deadline:
        deadlines, task = self._deadlines, self.task
        if task in deadlines._due:
            raise RuntimeError("the task is already inside a deadline of these Deadlines")
        self._cancelling = task.cancelling()
        deadlines._due[task] = self
        if deadlines._timer is None:
            deadlines._timer = task.get_loop().call_later(deadlines.tick, deadlines._sweep)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._deadlines._due.pop(self.task, None)
        # as asyncio.Timeout: our own cancellation (and only ours) becomes TimeoutError
        if self.expired and self.task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc

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

DEFAULT_TICK = 0.1


class Deadlines:
    def __init__(self, tick: float = DEFAULT_TICK) -> None:
        if tick <= 0:
            raise ValueError("tick must be positive")
        self.tick = tick
        self._due: dict[asyncio.Task[object], Deadline] = {}
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._due)

    def bound(self, seconds: float) -> Deadline:
        """A context manager bounding the current task's time inside it to ``seconds`` (plus up to a tick)."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadlines.bound needs a running task")
        loop = task.get_loop()
        return Deadline(self, task, loop.time() + seconds)

    def _enter(self, deadline: Deadline) -> None:
        if deadline.task in self._due:
            raise RuntimeError("the task is already inside a deadline of these Deadlines")
        self._due[deadline.task] = deadline
        if self._timer is None:
            self._timer = deadline.task.get_loop().call_later(self.tick, self._sweep)

    def _exit(self, deadline: Deadline) -> None:
        self._due.pop(deadline.task, None)

    def _sweep(self) -> None:
        self._timer = None
        if not self._due:
            return  # nothing in flight: the next request starts the timer again
        loop = next(iter(self._due)).get_loop()
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
        self._cancelling = self.task.cancelling()
        self._deadlines._enter(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._deadlines._exit(self)
        # as asyncio.Timeout: our own cancellation (and only ours) becomes TimeoutError
        if self.expired and self.task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc

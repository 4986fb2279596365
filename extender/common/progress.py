"""Progress lines on stderr for the offline tools (``simulate``, ``plan``) on large inputs.

Nothing is printed for a run that ends within ``delay`` (one second): small inputs stay quiet. After that a
background thread prints the current step (``reading pods.yaml``, ``placing pods 1200/2000``) once every
``every`` seconds, and ``finish`` prints the total time. The work itself only sets the step and the count,
which costs nothing.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TextIO


class Progress:
    def __init__(self, prog: str, stream: TextIO | None = None, delay: float = 1.0,
                 every: float = 1.0) -> None:
        self.prog = prog
        self.stream = stream or sys.stderr
        self.delay = delay
        self.every = every
        self.step = "starting"
        self.done = 0
        self.total: int | None = None
        self.printed = False
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def begin(self, step: str, total: int | None = None) -> None:
        self.step, self.done, self.total = step, 0, total

    def line(self) -> str:
        count = "" if self.total is None else f" {self.done}/{self.total}"
        return f"{self.prog}: {self.step}{count} ({time.monotonic() - self._start:.1f}s)"

    def _run(self) -> None:
        if self._stop.wait(self.delay):
            return
        while True:
            print(self.line(), file=self.stream, flush=True)
            self.printed = True
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> Progress:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        if self.printed and kind is None:
            print(f"{self.prog}: done in {time.monotonic() - self._start:.1f}s", file=self.stream, flush=True)

"""Starving the API server of CPU, as an overloaded production control plane is: kube-apiserver and etcd
at the lowest CPU priority (nice 19, every thread) and busy-loop processes oversubscribing every core.

Used by the end-to-end test of the bind path under load and by the benchmark's contended variant. Bounded
twice: the context manager stops the loops and restores the priorities on exit, and each loop ends by
itself after ``seconds`` even if the harness dies without cleaning up.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

LOWEST = 19

# Exits by itself at its deadline: a harness killed mid-test leaves no busy loop behind for long.
_BUSY_LOOP = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return [pid]


def set_priority(pids: Iterable[int], niceness: int) -> None:
    """Set the niceness of every thread of these processes (on Linux, nice is per thread; Go runtimes
    start threads all the time, so callers repeat this while the starvation lasts)."""
    for pid in pids:
        for tid in _threads(pid):
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, tid, niceness)


@contextlib.contextmanager
def starved(pids: Iterable[int], *, seconds: float, loops: int | None = None,
            loop_niceness: int = 10, log_dir: Path | None = None) -> Iterator[None]:
    """While inside: ``pids`` at nice 19 and ``loops`` busy loops (default two per core) at
    ``loop_niceness``. The loops run below the machine's ordinary processes (nice 0) so that other work
    on a shared machine is slowed less, but far above the starved ones (nice 10 weighs 110 against 15
    for nice 19 in the Linux scheduler): the API server gets a few percent of a core."""
    targets = list(pids)
    count = loops if loops is not None else 2 * (os.cpu_count() or 1)
    output = subprocess.DEVNULL
    if log_dir is not None:
        output = open(log_dir / "busy-loops.log", "ab")  # noqa: SIM115 - closed below
    busy = [subprocess.Popen([sys.executable, "-c", _BUSY_LOOP.format(seconds=seconds)],
                             stdout=output, stderr=output, stdin=subprocess.DEVNULL,
                             preexec_fn=lambda: os.nice(loop_niceness))
            for _ in range(count)]
    stop = threading.Event()

    def keep_low() -> None:  # threads started meanwhile inherit from their creator, but not always
        while not stop.wait(2.0):
            set_priority(targets, LOWEST)

    set_priority(targets, LOWEST)
    keeper = threading.Thread(target=keep_low, name="starve-renice", daemon=True)
    keeper.start()
    try:
        yield
    finally:
        stop.set()
        keeper.join()
        for proc in busy:
            proc.kill()
        for proc in busy:
            proc.wait()
        set_priority(targets, 0)
        if output is not subprocess.DEVNULL:
            output.close()

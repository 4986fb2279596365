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


def set_priority(pids: Iterable[int], niceness: int, group_niceness: int | None = None) -> None:
    """Set the niceness of every thread of these processes (on Linux, nice is per thread; Go runtimes
    start threads all the time, so callers repeat this while the starvation lasts), and of their
    autogroup: with autogroup scheduling on (the default of most distributions), each session is one
    group sharing the CPU with the others by the group's own nice value (``group_niceness``, default
    ``niceness``), whatever its threads' nice."""
    for pid in pids:
        for tid in _threads(pid):
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
        with contextlib.suppress(OSError):
            Path(f"/proc/{pid}/autogroup").write_text(str(niceness if group_niceness is None
                                                          else group_niceness))


@contextlib.contextmanager
def starved(pids: Iterable[int], *, seconds: float, loops: int | None = None, group_niceness: int = 5,
            loop_niceness: int = 0, log_dir: Path | None = None) -> Iterator[None]:
    """While inside: every thread of ``pids`` at nice 19, their autogroups at ``group_niceness``, and
    ``loops`` busy loops (default two per core), each in an autogroup of its own at ``loop_niceness``.

    The group's nice is what decides between sessions: at 19 (weight 15 against 1024 for nice 0) the API
    server would get nothing at all on a machine where other sessions keep the cores busy, and the test
    would measure a dead control plane; at 5 (weight 335) against two loops per core at 0 it gets a few
    percent of a core, and each API call takes from tens of milliseconds to seconds."""
    targets = list(pids)
    count = loops if loops is not None else 2 * (os.cpu_count() or 1)
    output = subprocess.DEVNULL
    if log_dir is not None:
        output = open(log_dir / "busy-loops.log", "ab")  # noqa: SIM115 - closed below
    # each loop in a session (so an autogroup) of its own: one full share of the CPU each
    busy = [subprocess.Popen([sys.executable, "-c", _BUSY_LOOP.format(seconds=seconds)],
                             stdout=output, stderr=output, stdin=subprocess.DEVNULL, start_new_session=True)
            for _ in range(count)]
    set_priority([proc.pid for proc in busy], loop_niceness)
    stop = threading.Event()

    def keep_low() -> None:  # threads started meanwhile inherit from their creator, but not always
        while not stop.wait(2.0):
            set_priority(targets, LOWEST, group_niceness)

    set_priority(targets, LOWEST, group_niceness)
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

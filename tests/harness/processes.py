"""Child processes of the harness and the waiting around them.

Every process a test starts (etcd, kube-apiserver, the schedulers, kwok, Karpenter, the project's own
services) is a ``ManagedProcess``: its own process group, its output in ``<log_dir>/<name>.log``, stopped as a
group. ``PROCESSES`` holds them all so that one call stops everything at session end or at exit.

Ports: ``free_port()`` hands out a loopback port that no other process of the suite holds, even with
pytest-xdist workers (and the programs they start, such as the demo) allocating at the same time. Each port
comes from below the kernel's ephemeral range (where outgoing connections take theirs) and is reserved by
an ``flock`` on a file named after it (in ``TF_E2E_PORT_LOCK_DIR``, default ``$TMPDIR/tf-e2e-ports``), held
until the allocating process exits: a port is never handed to two live processes, and it stays reserved
while the program it was given to restarts on it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

# Listening ports come from here: under the ephemeral range (32768-60999 on Linux), so no outgoing
# connection holds one, and above the well-known services of a developer's machine.
PORT_RANGE = range(20000, 32000)
PORT_LOCK_DIR = Path(os.environ.get("TF_E2E_PORT_LOCK_DIR") or Path(tempfile.gettempdir()) / "tf-e2e-ports")


class _PortAllocator:
    """Ports reserved for this process: each by an exclusive flock on ``PORT_LOCK_DIR/<port>`` (released by
    the kernel when the process ends, however it ends) and checked free by a bind."""

    def __init__(self, ports: range, lock_dir: Path) -> None:
        self._ports = ports
        self._lock_dir = lock_dir
        self._held: dict[int, IO[bytes]] = {}
        self._lock = threading.Lock()
        # processes start at different places of the range, so they seldom contend for the same file
        self._next = ports.start + (os.getpid() * 7919) % len(ports)

    def allocate(self) -> int:
        with self._lock:
            self._lock_dir.mkdir(parents=True, exist_ok=True)
            for _ in range(len(self._ports)):
                port = self._next
                self._next = port + 1 if port + 1 < self._ports.stop else self._ports.start
                if port not in self._held and self._reserve(port):
                    return port
        raise RuntimeError(f"no free port left in {self._ports.start}-{self._ports.stop - 1}")

    def _reserve(self, port: int) -> bool:
        handle = open(self._lock_dir / str(port), "ab")  # noqa: SIM115 - held as long as this process lives
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.close()
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False  # another live process holds it
            raise
        if not _bindable(port):  # something outside the suite listens there
            handle.close()
            return False
        self._held[port] = handle
        return True


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_PORTS = _PortAllocator(PORT_RANGE, PORT_LOCK_DIR)


def free_port() -> int:
    """A loopback TCP port that nothing listens on and that no other process of the suite was given."""
    return _PORTS.allocate()


# Every wait in the suite is a poll for an outcome; its bound only matters when the outcome never comes.
# On a busy machine (CI shares 2 cores) things take longer, so bounds are stretched rather than trusted.
TIMEOUT_SCALE = float(os.environ.get("TF_E2E_TIMEOUT_SCALE", "3"))


def wait_until(
    pred: Callable[[], Any], timeout: float, interval: float = 0.2, what: str = "condition"
) -> Any:
    timeout *= TIMEOUT_SCALE
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = pred()
            if value:
                return value
        except Exception as exc:
            last_exc = exc
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"timed out after {timeout}s waiting for {what}" + (f": {last_exc!r}" if last_exc else "")
            )
        time.sleep(interval)


def tail(path: Path, lines: int = 60) -> str:
    try:
        data = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(data[-lines:])


class ManagedProcess:
    """A child process in its own process group, logging to a file; stop() kills the whole group."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log_dir: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the process
        self._log.write(f"$ {' '.join(self.argv)}\n".encode())
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,  # own process group: Ctrl-C in the terminal does not hit it, stop() does
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            raise RuntimeError(
                f"{self.name} exited with {self.proc.returncode}; log tail:\n{tail(self.log_path)}"
            )

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        with contextlib.suppress(OSError):
            self._log.close()


class ProcessRegistry:
    """Every process the harness starts; stop_all() runs at session end and at interpreter exit."""

    def __init__(self) -> None:
        self._procs: list[ManagedProcess] = []
        self._lock = threading.Lock()

    def start(self, name: str, argv: list[str], log_dir: Path, **kw: Any) -> ManagedProcess:
        p = ManagedProcess(name, argv, log_dir, **kw)
        with self._lock:
            self._procs.append(p)
        return p

    def forget(self, p: ManagedProcess) -> None:
        with self._lock:
            if p in self._procs:
                self._procs.remove(p)

    def all(self) -> list[ManagedProcess]:
        with self._lock:
            return list(self._procs)

    def stop_all(self) -> None:
        with self._lock:
            procs, self._procs = list(reversed(self._procs)), []
        for p in procs:
            with contextlib.suppress(Exception):  # best effort at shutdown
                p.stop()


PROCESSES = ProcessRegistry()


def console_script(name: str) -> Path:
    """A console script of the installed project: next to the running interpreter (the venv), else PATH."""


    here = Path(sys.executable).parent / name
    if here.exists():
        return here
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"console script {name} is not installed (pip install -e .)")
    return Path(found)


def run_console_script(name: str, *args: str | Path, timeout: float = 60) -> str:
    """Run one of the project's console scripts to completion; raise with its output when it fails."""
    argv = [str(console_script(name)), *(str(a) for a in args)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def https_ready(url: str, ca_file: Path, proc: ManagedProcess | None = None) -> bool:
    if proc is not None:
        proc.check_alive()
    ctx = ssl.create_default_context(cafile=str(ca_file))
    with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
        return r.status == 200


def http_ready(url: str, proc: ManagedProcess | None = None) -> bool:
    if proc is not None:
        proc.check_alive()
    with urllib.request.urlopen(url, timeout=2) as r:
        return r.status == 200

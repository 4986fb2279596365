"""Child processes of the harness and the waiting around them.

Every process a test starts (etcd, kube-apiserver, the schedulers, kwok, Karpenter, the project's own
services) is a ``ManagedProcess``: its own process group, its output in ``<log_dir>/<name>.log``, stopped as a
group. ``PROCESSES`` holds them all so that one call stops everything at session end or at exit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

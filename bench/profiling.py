"""Sampling profiles of the processes under test with py-spy (PyPI), summarised as top frames.

    with PySpy(pid, out_dir / "extender.txt"):
        ...  # the load
    print(summarise(out_dir / "extender.txt"))
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import TracebackType

from bench.common import VENV_BIN, log


def py_spy() -> str | None:
    local = VENV_BIN / "py-spy"
    if local.exists():
        return str(local)
    found = shutil.which("py-spy")
    if found:
        return found
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "py-spy"], check=False, timeout=600)
    return str(local) if local.exists() else shutil.which("py-spy")


class PySpy:
    """``py-spy record`` of ``pid`` into a collapsed-stack file while the block runs."""

    def __init__(self, pid: int, out: Path, rate: int = 97, idle: bool = False) -> None:
        self.pid, self.out, self.rate, self.idle = pid, out, rate, idle
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PySpy:
        tool = py_spy()
        if tool is None:
            log("py-spy is not available: no profile")
            return self
        self.out.parent.mkdir(parents=True, exist_ok=True)
        argv = [tool, "record", "-p", str(self.pid), "-o", str(self.out), "-f", "raw", "-r", str(self.rate),
                "--nonblocking", "--function"]
        if self.idle:
            argv.append("--idle")
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        if not self.out.exists():
            log(f"py-spy wrote no profile: {err.decode(errors='replace')[-300:]}")


def summarise(path: Path, top: int = 15, focus: str = "") -> dict[str, list[tuple[str, float]]]:
    """Top frames of a collapsed-stack file by inclusive and by self share of samples (0..1).

    ``focus`` keeps only stacks containing that substring (e.g. a thread or handler name)."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    if not path.exists():
        return {"inclusive": [], "self": []}
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit() or (focus and focus not in stack):
            continue
        n = int(count)
        total += n
        frames = [_short(f) for f in stack.split(";")]
        for f in set(frames):
            inclusive[f] += n
        own[frames[-1]] += n
    if not total:
        return {"inclusive": [], "self": []}
    return {"inclusive": [(f, round(c / total, 3)) for f, c in inclusive.most_common(top)],
            "self": [(f, round(c / total, 3)) for f, c in own.most_common(top)],
            "samples": [("total", float(total))]}


def _short(frame: str) -> str:
    """``func (path/to/module.py:123)`` -> ``func (module.py:123)``; site-packages paths shortened."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    if "site-packages/" in where:
        where = where.split("site-packages/", 1)[1]
    elif "/lib/python" in where:
        where = "stdlib/" + where.rsplit("/", 1)[-1]
    else:
        where = "/".join(where.split("/")[-2:])
    return f"{name} ({where})"


def main() -> None:
    for kind, rows in summarise(Path(sys.argv[1]), focus=sys.argv[2] if len(sys.argv) > 2 else "").items():
        print(f"== {kind}")
        for frame, share in rows:
            print(f"{share:6.1%}  {frame}" if kind != "samples" else f"{share:.0f} samples")


if __name__ == "__main__":
    main()

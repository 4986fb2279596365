"""Shared helpers of the benchmarks: timing statistics, result files, tool installation."""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
TMP_DIR = RESULTS_DIR / "tmp"
VENV_BIN = Path(sys.executable).parent


def quick_mode(flag: bool = False) -> bool:
    return flag or os.environ.get("QUICK", "") not in ("", "0", "false", "no")


# ----------------------------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summary_ms(samples_s: Sequence[float]) -> dict[str, float]:
    """Median and p99 of samples given in seconds, in milliseconds."""
    return {
        "median_ms": round(statistics.median(samples_s) * 1e3, 4),
        "p99_ms": round(percentile(samples_s, 99) * 1e3, 4),
        "n": len(samples_s),
    }


def time_calls(fn: Callable[[], Any], repeat: int, warmup: int = 2) -> list[float]:
    """Wall time in seconds of each of ``repeat`` calls of ``fn`` (after ``warmup`` untimed calls)."""
    for _ in range(warmup):
        fn()
    out = []
    clock = time.perf_counter
    for _ in range(repeat):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def ratio(a: float | None, b: float | None, digits: int = 3) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, digits)


# -------------------------------------------------------------------------------------------- results


@dataclass
class Table:
    """A Markdown table of one benchmark, with notes under it."""

    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: Any) -> None:
        self.rows.append(list(cells))

    def markdown(self) -> str:
        def cell(v: Any) -> str:
            if v is None:
                return "n/a"
            if isinstance(v, float):
                return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.1f}"
            return str(v)

        lines = [f"### {self.title}", "", "| " + " | ".join(self.columns) + " |",
                 "|" + "|".join("---" for _ in self.columns) + "|"]
        lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in self.rows]
        if self.notes:
            lines.append("")
            lines += [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


@dataclass
class Target:
    """A reported (never gating) target: ``value <op> limit``."""

    name: str
    value: float | None
    op: str  # "<=" or ">="
    limit: float
    unit: str = ""

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value <= self.limit if self.op == "<=" else self.value >= self.limit

    def verdict(self) -> str:
        return {True: "met", False: "**missed**", None: "not measured"}[self.met]

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "op": self.op, "limit": self.limit,
                "unit": self.unit, "met": self.met}

    def row(self) -> list[Any]:
        value = "n/a" if self.value is None else f"{self.value:,.3f} {self.unit}".strip()
        return [self.name, value, f"{self.op} {self.limit:g} {self.unit}".strip(), self.verdict()]


@dataclass
class BenchResult:
    """What one benchmark module returns to ``bench.run``."""

    name: str
    data: dict[str, Any]
    tables: list[Table]
    targets: list[Target] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    error: str | None = None


def environment() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": [round(x, 2) for x in load],
        "git_commit": _git_commit(),
    }


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return None
    return out.stdout.strip() or None


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    tmp.replace(path)


# ------------------------------------------------------------------------------------ tools on demand


def ensure_pip(*packages: str) -> list[str]:
    """Install missing bench-only PyPI packages into the running venv; returns those still missing.

    ``packages`` are (import name, distribution) pairs written ``import:dist`` (or one name for both).
    """
    missing = []
    for spec in packages:
        module, _, dist = spec.partition(":")
        dist = dist or module
        try:
            __import__(module)
        except ImportError:
            missing.append((module, dist))
    if not missing:
        return []
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *(d for _, d in missing)],
                   check=False, timeout=600)
    still = []
    for module, _ in missing:
        try:
            __import__(module)
        except ImportError:
            still.append(module)
    return still


def ensure_apt(binary: str, package: str | None = None) -> str | None:
    """Path of ``binary``, installing the Debian package when missing (the bench runs as root)."""
    found = shutil.which(binary)
    if found:
        return found
    apt = shutil.which("apt-get")
    if apt is None:
        return None
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    sudo = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if sudo is None:
        return None
    subprocess.run([*sudo, apt, "update", "-qq"], env=env, check=False, timeout=600,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([*sudo, apt, "install", "-y", "-qq", package or binary], env=env, check=False,
                   timeout=600, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return shutil.which(binary)


def console_script(name: str) -> str | None:
    """A console script of the project: next to the running interpreter, else on PATH."""
    local = VENV_BIN / name
    if local.exists():
        return str(local)
    return shutil.which(name)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def chunks(items: Iterable[Any], size: int) -> Iterable[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch

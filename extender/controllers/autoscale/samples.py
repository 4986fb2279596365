"""Usage samples from a JSON file: the usage source of ``--autoscale-usage-file`` and of
``tf-extender plan --autoscale --samples``, until a Prometheus reader stands behind the same seam.

The file holds a list of ``{"namespace", "workload", "worker", "tflops", "vram", "time"}``: TFLOPS in use,
VRAM bytes in use, and an RFC 3339 time (or ``unix_ns``). A sample that cannot be read is skipped and
counted in the error, which names the first such entry.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from extender.autoscaling.usage import StaticUsageSource, WorkerUsage
from extender.common.timefmt import parse_time


class SamplesError(ValueError):
    pass


def _sample(raw: Any) -> tuple[str, str, WorkerUsage]:
    if not isinstance(raw, dict):
        raise SamplesError("not an object")
    ns, workload, worker = raw.get("namespace"), raw.get("workload"), raw.get("worker")
    if not all(isinstance(v, str) and v for v in (ns, workload, worker)):
        raise SamplesError("namespace, workload and worker must be non-empty strings")
    tflops, vram = raw.get("tflops"), raw.get("vram")
    if isinstance(tflops, bool) or not isinstance(tflops, int | float) or tflops < 0:
        raise SamplesError(f"tflops {tflops!r} is not a non-negative number")
    if isinstance(vram, bool) or not isinstance(vram, int | float) or vram < 0:
        raise SamplesError(f"vram {vram!r} is not a non-negative number of bytes")
    if isinstance(raw.get("unix_ns"), int):
        unix_ns = int(raw["unix_ns"])
    else:
        when = parse_time(raw.get("time"))
        if when is None:
            raise SamplesError(f"time {raw.get('time')!r} is not an RFC 3339 time")
        unix_ns = int(when.timestamp()) * 10**9 + when.microsecond * 1000
    assert isinstance(ns, str) and isinstance(workload, str) and isinstance(worker, str)
    return ns, workload, WorkerUsage(worker, float(tflops), int(vram), unix_ns)


def parse_samples(data: Any) -> tuple[StaticUsageSource, list[str]]:
    """The samples, and one line per entry that could not be read."""
    source = StaticUsageSource()
    problems: list[str] = []
    if not isinstance(data, list):
        return source, ["expected a JSON list of samples"]
    for i, raw in enumerate(data):
        try:
            ns, workload, sample = _sample(raw)
        except SamplesError as exc:
            problems.append(f"sample [{i}]: {exc}")
            continue
        source.add(ns, workload, [sample])
    return source, problems


def load_samples(path: str) -> tuple[StaticUsageSource, list[str]]:
    try:
        data = json.loads(pathlib.Path(path).read_text())
    except FileNotFoundError:
        return StaticUsageSource(), [f"{path}: no such file"]
    except (OSError, ValueError) as exc:
        return StaticUsageSource(), [f"{path}: {exc}"]
    return parse_samples(data)

"""A ``UsageSource`` over Prometheus' HTTP API: two PromQL templates, one for TFLOPS and one for VRAM bytes
per worker, read with ``query_range`` in pages of bounded points.

Each template is PromQL with ``$namespace`` and ``$workload`` substituted (as PromQL string contents,
escaped), and must return one series per worker with a ``pod`` label. Two presets:

- ``dcgm``: NVIDIA dcgm-exporter. Its series are per device (``UUID``); a GPU that several pods share
  cannot be attributed by the kubelet's PodResources API, so the device's use is apportioned to each
  worker by its share of what the extender allocated on that GPU (``tf_extender_pod_allocated_*`` over
  ``tf_extender_gpu_allocated_*``, joined ``on(UUID)``). That split is an estimate: it assumes every holder
  uses the GPU in proportion to its allocation. TFLOPS in use = ``DCGM_FI_DEV_GPU_UTIL`` % x the GPU's
  capacity (``tf_extender_gpu_capacity_tflops``); VRAM = ``DCGM_FI_DEV_FB_USED`` MiB x 2^20.
- ``hypervisor``: TensorFusion's hypervisor worker metrics (``tf_worker_usage``: ``compute_tflops`` and
  ``memory_bytes`` per ``namespace``, ``workload``, ``worker``), as the PromQL endpoint of the store they
  are written to names them; the worker label is renamed ``pod``.

Any failure (connection, HTTP status, a Prometheus error, an answer that is not a matrix) raises
``UsageUnavailable`` with the reason: the autoscaler puts it in the workload's condition and resizes nothing.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from extender.autoscaling.usage import WorkerUsage

MIB = 2**20
DEFAULT_STEP_SECONDS = 30.0
DEFAULT_MAX_POINTS = 1000  # per query_range request; Prometheus itself refuses more than 11,000
TIMEOUT_SECONDS = 10.0

# the device's use, apportioned by allocation share: an estimate on a shared GPU
_DCGM_SHARE = ("tf_extender_pod_allocated_{r}{{namespace=\"$namespace\",workload=\"$workload\"}}"
               " / on(UUID) group_left max by (UUID) (tf_extender_gpu_allocated_{r})")
DCGM_TFLOPS = ("sum by (pod) ((" + _DCGM_SHARE.format(r="tflops") + ") * on(UUID) group_left() "
               "(max by (UUID) (DCGM_FI_DEV_GPU_UTIL) / 100 * on(UUID) "
               "max by (UUID) (tf_extender_gpu_capacity_tflops)))")
DCGM_VRAM = ("sum by (pod) ((" + _DCGM_SHARE.format(r="vram_bytes") + ") * on(UUID) group_left() "
             f"(max by (UUID) (DCGM_FI_DEV_FB_USED) * {MIB}))")
HYPERVISOR_TFLOPS = ('label_replace(max by (worker) (tf_worker_usage_compute_tflops{namespace="$namespace",'
                     'workload="$workload"}), "pod", "$1", "worker", "(.*)")')
HYPERVISOR_VRAM = ('label_replace(max by (worker) (tf_worker_usage_memory_bytes{namespace="$namespace",'
                   'workload="$workload"}), "pod", "$1", "worker", "(.*)")')
PRESETS = {"dcgm": (DCGM_TFLOPS, DCGM_VRAM), "hypervisor": (HYPERVISOR_TFLOPS, HYPERVISOR_VRAM)}


class UsageUnavailable(Exception):
    """Prometheus could not answer; the message says why (for the workload's condition)."""


def promql_string(value: str) -> str:
    """``value`` as the contents of a double-quoted PromQL string."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(template: str, namespace: str, workload: str) -> str:
    # "$1" in label_replace is not a placeholder: safe_substitute leaves it
    return string.Template(template).safe_substitute(namespace=promql_string(namespace),
                                                     workload=promql_string(workload))


def pages(start_s: float, end_s: float, step_s: float, max_points: int) -> list[tuple[float, float]]:
    """``[start, end]`` cut into ranges of at most ``max_points`` evaluation steps each."""
    span = step_s * (max_points - 1)
    out: list[tuple[float, float]] = []
    at = start_s
    while at <= end_s:
        stop = min(end_s, at + span)
        out.append((at, stop))
        at = stop + step_s
    return out


@dataclass(frozen=True)
class PrometheusOptions:
    url: str
    tflops_query: str = DCGM_TFLOPS
    vram_query: str = DCGM_VRAM
    step_seconds: float = DEFAULT_STEP_SECONDS
    max_points: int = DEFAULT_MAX_POINTS


class PrometheusUsage:
    def __init__(self, options: PrometheusOptions) -> None:
        self.options = options
        self.requests = 0  # query_range calls made (for tests and logs)

    async def workload_usage(self, namespace: str, workload: str, start_ns: int,
                             end_ns: int) -> Sequence[WorkerUsage]:
        o = self.options
        # evaluation points aligned to the step, strictly after start: each sample is read once
        first = (math.floor(start_ns / 1e9 / o.step_seconds) + 1) * o.step_seconds
        last = math.floor(end_ns / 1e9 / o.step_seconds) * o.step_seconds
        if last < first:
            return []
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)
        tflops: dict[tuple[str, float], float] = {}
        vram: dict[tuple[str, float], float] = {}
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                for begin, stop in pages(first, last, o.step_seconds, o.max_points):
                    tflops.update(await self._range(session, render(o.tflops_query, namespace, workload),
                                                    begin, stop))
                    vram.update(await self._range(session, render(o.vram_query, namespace, workload),
                                                  begin, stop))
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise UsageUnavailable(f"Prometheus at {o.url}: {type(exc).__name__}: {exc}"
                                   if str(exc) else f"Prometheus at {o.url}: {type(exc).__name__}") from exc
        out = []
        for key in sorted(set(tflops) | set(vram), key=lambda k: (k[1], k[0])):
            worker, at = key
            out.append(WorkerUsage(worker, max(0.0, tflops.get(key, 0.0)), max(0, int(vram.get(key, 0.0))),
                                   round(at * 1e9)))
        return out

    async def _range(self, session: aiohttp.ClientSession, query: str, start: float,
                     end: float) -> dict[tuple[str, float], float]:
        o = self.options
        self.requests += 1
        params = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{o.step_seconds:g}"}
        async with session.post(o.url.rstrip("/") + "/api/v1/query_range", data=params) as resp:
            try:
                body: Any = await resp.json(content_type=None)
            except ValueError:
                body = None
            if not isinstance(body, dict):
                raise UsageUnavailable(f"Prometheus at {o.url}: HTTP {resp.status}, not a Prometheus answer")
            if body.get("status") != "success":
                raise UsageUnavailable(f"Prometheus at {o.url}: HTTP {resp.status}: "
                                       f"{body.get('errorType')}: {body.get('error')}")
        data = body.get("data") or {}
        if data.get("resultType") != "matrix":
            raise UsageUnavailable(f"Prometheus at {o.url}: the query gave a {data.get('resultType')}, "
                                   "not a range vector")
        values: dict[tuple[str, float], float] = {}
        for series in data.get("result") or []:
            worker = (series.get("metric") or {}).get("pod")
            if not worker:
                continue
            for at, value in series.get("values") or []:
                number = float(value)
                if math.isfinite(number):
                    values[(str(worker), float(at))] = number
        return values

"""``--write-gpu-status``: keep GPU and GPUPool status in step with the extender's ledger.

What is written:

- each GPU object's ``status.available`` (``tflops``, ``vram``: capacity minus what the ledger hands out)
  and ``status.runningApps`` (the pods holding a share, grouped by workload, in TensorFusion's shape);
- each GPUPool's status totals: ``totalNodes``, ``totalGPUs``, ``totalTFlops``, ``totalVRAM``,
  ``allocatedTFlops``, ``allocatedVRAM``, ``availableTFlops``, ``availableVRAM``, ``partiallyUsedGPUs``.

How: a background task wakes every ``interval`` seconds, asks the cluster state which nodes changed since
its last pass, computes the wanted status of their GPUs from the ledger, and patches (JSON merge patch on
the ``status`` subresource) only those whose stored status differs. A GPU is written at most once per
pass, so a burst of binds costs at most ``1/interval`` writes per GPU per second however many pods
land on it; at most ``concurrency`` writes are in flight. Binds never wait for it: the verbs only append
to the state's change log. Pools are recomputed at most every ``pool_interval`` seconds, and only when
something changed. Every ``resync_interval`` seconds a pass compares every GPU, which repairs status that
someone else overwrote. Nodes described only by GPU Feature Discovery labels have no GPU objects and are
skipped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter

from extender.contract import WORKLOAD_LABEL
from extender.inventory import tflops_of
from extender.ledger import Allocation
from extender.placement import share_on
from extender.quantity import Format, format_quantity
from extender.state import ClusterState, GPUView

log = logging.getLogger(__name__)

# Status keys this module owns; anything else in the status (capacity, phase, ...) is left alone.
GPU_KEYS = ("available", "runningApps")
POOL_KEYS = ("totalNodes", "totalGPUs", "totalTFlops", "totalVRAM", "allocatedTFlops", "allocatedVRAM",
             "availableTFlops", "availableVRAM", "partiallyUsedGPUs")


@dataclass(frozen=True)
class StatusSettings:
    interval: float = 1.0  # seconds between passes: at most one write per GPU per interval
    pool_interval: float = 5.0
    resync_interval: float = 60.0
    concurrency: int = 4
    settle: float = 10.0  # how long our own write may take to come back through the watch


class StatusApi(Protocol):
    async def patch_status(self, plural: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch ``{"status": status}`` into the object's status subresource; the stored object."""
        ...


def tflops_text(value: Fraction) -> str:
    return format_quantity(value)


def vram_text(value: int) -> str:
    return format_quantity(value, Format.BINARY_SI)


# --- pure: what the status should say -------------------------------------------------------------


def _pod_entry(allocation: Allocation, gpu: GPUView) -> dict[str, Any]:
    namespace, _, name = allocation.pod_key.partition("/")
    request = allocation.request
    taken_t, taken_v = share_on(request, gpu.device.capacity_tflops, gpu.capacity_vram)
    if request.takes_whole_gpu:
        limit_t, limit_v = gpu.capacity_tflops, gpu.capacity_vram
    elif request.percent_limit is not None:
        limit_t, limit_v = request.percent_limit * gpu.capacity_tflops / 100, request.vram_limit
    else:
        limit_t, limit_v = request.tflops_limit or tflops_of(taken_t), request.vram_limit
    return {
        "name": name, "namespace": namespace, "qos": request.qos.value,
        "requests": {"tflops": tflops_text(tflops_of(taken_t)), "vram": vram_text(taken_v)},
        "limits": {"tflops": tflops_text(limit_t), "vram": vram_text(max(limit_v, taken_v))},
    }


def running_apps(gpu: GPUView, holders: Iterable[Allocation],
                 workload_of: Callable[[str], str | None]) -> list[dict[str, Any]]:
    """``status.runningApps``: one entry per (namespace, workload) holding a share of ``gpu``; a pod
    without a workload label is its own workload."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for allocation in holders:
        entry = _pod_entry(allocation, gpu)
        workload = workload_of(allocation.pod_key) or entry["name"]
        groups.setdefault((entry["namespace"], workload), []).append(entry)
    return [
        {"name": workload, "namespace": namespace, "count": len(pods),
         "pods": sorted(pods, key=lambda p: str(p["name"]))}
        for (namespace, workload), pods in sorted(groups.items())
    ]


def gpu_status(gpu: GPUView, holders: Iterable[Allocation],
               workload_of: Callable[[str], str | None]) -> dict[str, Any]:
    free_t = max(gpu.capacity_tflops - gpu.used_tflops, Fraction(0))
    free_v = max(gpu.capacity_vram - gpu.used_vram, 0)
    return {
        "available": {"tflops": tflops_text(free_t), "vram": vram_text(free_v)},
        "runningApps": running_apps(gpu, holders, workload_of),
    }


@dataclass
class PoolTotals:
    nodes: set[str] = field(default_factory=set)
    gpus: int = 0
    partially_used: int = 0
    total_tflops: Fraction = Fraction(0)
    total_vram: int = 0
    used_tflops: Fraction = Fraction(0)
    used_vram: int = 0

    def add(self, gpu: GPUView) -> None:
        self.nodes.add(gpu.node)
        self.gpus += 1
        self.total_tflops += gpu.capacity_tflops
        self.total_vram += gpu.capacity_vram
        self.used_tflops += min(gpu.used_tflops, gpu.capacity_tflops)
        self.used_vram += min(gpu.used_vram, gpu.capacity_vram)
        if 0.0 < gpu.used_percent < 100.0:
            self.partially_used += 1

    def status(self) -> dict[str, Any]:
        return {
            "totalNodes": len(self.nodes), "totalGPUs": self.gpus,
            "totalTFlops": tflops_text(self.total_tflops), "totalVRAM": vram_text(self.total_vram),
            "allocatedTFlops": tflops_text(self.used_tflops), "allocatedVRAM": vram_text(self.used_vram),
            "availableTFlops": tflops_text(self.total_tflops - self.used_tflops),
            "availableVRAM": vram_text(self.total_vram - self.used_vram),
            "partiallyUsedGPUs": self.partially_used,
        }


def pool_totals(gpus: Iterable[GPUView], pools: Iterable[str]) -> dict[str, PoolTotals]:
    """Totals of every named pool (zero when it has no GPUs yet)."""
    out = {pool: PoolTotals() for pool in pools}
    for gpu in gpus:
        if gpu.pool in out:
            out[gpu.pool].add(gpu)
    return out


def stored_part(obj: Mapping[str, Any] | None, keys: Iterable[str]) -> dict[str, Any]:
    """The part of a stored object's status that this module writes, shaped like what it writes."""
    status = (obj or {}).get("status") or {}
    out: dict[str, Any] = {}
    for key in keys:
        value = status.get(key)
        if key == "available" and isinstance(value, Mapping):
            value = {k: value.get(k) for k in ("tflops", "vram")}
        if key == "runningApps" and value is None:
            value = []
        out[key] = value
    return out


# --- the writer -----------------------------------------------------------------------------------


@dataclass
class _Written:
    status: dict[str, Any]
    resource_version: str
    at: float


class StatusMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.writes = Counter(
            "tf_extender_status_writes_total", "GPU and GPUPool status writes by --write-gpu-status",
            ["kind", "outcome"], registry=registry)
        for kind in ("gpu", "gpupool"):
            for outcome in ("ok", "error"):
                self.writes.labels(kind, outcome)


class Lookup(Protocol):
    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None: ...

    def list(self) -> list[dict[str, Any]]: ...


class GPUStatusWriter:
    def __init__(self, state: ClusterState, api: StatusApi, *, gpus: Lookup, pools: Lookup, pods: Lookup,
                 settings: StatusSettings | None = None, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 ready: Callable[[], Awaitable[object]] | None = None) -> None:
        self.state = state
        self.api = api
        self.gpus = gpus
        self.pools = pools
        self.pods = pods
        self.settings = settings or StatusSettings()
        self.metrics = StatusMetrics(registry)
        self._clock = clock
        self._ready = ready
        self._tick = 0
        self._full_due = 0.0
        self._pool_due = 0.0
        self._pools_dirty = True
        self._written: dict[tuple[str, str], _Written] = {}
        self._retry: set[str] = set()  # nodes with a failed GPU write

    def _workload(self, pod_key: str) -> str | None:
        namespace, _, name = pod_key.partition("/")
        pod = self.pods.get(name, namespace)
        labels = ((pod or {}).get("metadata") or {}).get("labels") or {}
        value = labels.get(WORKLOAD_LABEL)
        return str(value) if value else None

    def _due(self, plural: str, name: str, wanted: dict[str, Any], stored: Mapping[str, Any] | None,
             keys: Iterable[str]) -> bool:
        if stored is None:
            return False  # the object is gone (or not yet seen): nothing to write to
        if stored_part(stored, keys) == wanted:
            return False
        last = self._written.get((plural, name))
        rv = str((stored.get("metadata") or {}).get("resourceVersion") or "")
        # Our own write not yet back through the watch: the cache is behind, not wrong.
        return not (last is not None and last.status == wanted and last.resource_version != rv
                    and self._clock() - last.at < self.settings.settle)

    def gpu_writes(self, nodes: Iterable[str] | None) -> list[tuple[str, str, dict[str, Any]]]:
        """The GPU status patches due for ``nodes`` (None: every node): (node, GPU, status)."""
        out = []
        for node in self.state.nodes() if nodes is None else sorted(nodes):
            for gpu in self.state.node_gpus(node):
                if gpu.device.synthetic:
                    continue
                wanted = gpu_status(gpu, self.state.gpu_holders(gpu.name), self._workload)
                if self._due("gpus", gpu.name, wanted, self.gpus.get(gpu.name), GPU_KEYS):
                    out.append((node, gpu.name, wanted))
        return out

    def pool_writes(self) -> list[tuple[str, dict[str, Any]]]:
        names = [str((p.get("metadata") or {}).get("name")) for p in self.pools.list()]
        views = (gpu for node in self.state.nodes() for gpu in self.state.node_gpus(node))
        out = []
        for name, totals in sorted(pool_totals(views, names).items()):
            wanted = totals.status()
            if self._due("gpupools", name, wanted, self.pools.get(name), POOL_KEYS):
                out.append((name, wanted))
        return out

    async def step(self) -> int:
        """One pass; returns the number of writes attempted."""
        now = self._clock()
        changed, self._tick = self.state.changed_since(self._tick)
        if now >= self._full_due:
            changed = None
            self._full_due = now + self.settings.resync_interval
        elif self._retry:
            changed = (changed or set()) | self._retry
        self._retry = set()
        writes = [("gpus", node, name, status) for node, name, status in self.gpu_writes(changed)]
        self._pools_dirty = self._pools_dirty or changed is None or bool(changed)
        if self._pools_dirty and now >= self._pool_due:
            writes += [("gpupools", "", name, status) for name, status in self.pool_writes()]
            self._pools_dirty = False
            self._pool_due = now + self.settings.pool_interval
        gate = asyncio.Semaphore(self.settings.concurrency)

        async def write(plural: str, node: str, name: str, status: dict[str, Any]) -> None:
            kind = "gpu" if plural == "gpus" else "gpupool"
            async with gate:
                try:
                    stored = await self.api.patch_status(plural, name, status)
                except Exception as exc:  # status is informational; the next pass retries
                    self.metrics.writes.labels(kind, "error").inc()
                    self._written.pop((plural, name), None)
                    if node:
                        self._retry.add(node)
                    else:
                        self._pools_dirty = True
                    log.warning("status write failed",
                                extra={"object": f"{plural}/{name}", "error": str(exc)})
                    return
            rv = str((stored.get("metadata") or {}).get("resourceVersion") or "")
            self._written[(plural, name)] = _Written(status, rv, self._clock())
            self.metrics.writes.labels(kind, "ok").inc()

        await asyncio.gather(*(write(*w) for w in writes))
        return len(writes)

    async def run(self) -> None:
        if self._ready is not None:
            await self._ready()
        while True:
            started = self._clock()
            try:
                await self.step()
            except Exception:  # a bug here must never stop the extender
                log.exception("status pass failed")
            await asyncio.sleep(max(self.settings.interval - (self._clock() - started), 0.05))


class KubeStatusApi:
    """Merge patches on the ``status`` subresource of tensor-fusion.ai objects."""

    def __init__(self, api_client: Any) -> None:
        self._api = api_client

    async def patch_status(self, plural: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        from extender.kube import resources
        from extender.kube.client import api_call, request_json

        resource = resources.GPUS if plural == "gpus" else resources.GPU_POOLS
        path = resources.object_path(resource, name, subresource="status")
        result: dict[str, Any] = await api_call(
            request_json, self._api, "PATCH", path, body={"status": status},
            content_type="application/merge-patch+json")
        return result

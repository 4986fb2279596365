"""``--write-gpu-status``: keep GPU and GPUPool status in step with the extender's ledger.

What is written:

- each GPU object's ``status.available`` (``tflops``, ``vram``: capacity minus what the ledger hands out)
  and ``status.runningApps`` (the pods holding a share, grouped by workload, in TensorFusion's shape);
- each GPUPool's status totals: ``totalNodes``, ``totalGPUs``, ``totalTFlops``, ``totalVRAM``,
  ``allocatedTFlops``, ``allocatedVRAM``, ``availableTFlops``, ``availableVRAM``, ``partiallyUsedGPUs``;
  and, as TensorFusion's pool controller writes them, ``phase`` (``Running`` when every node of the pool
  is Ready, or it has none and no ``minResources``; ``Updating`` otherwise; ``Destroying`` while deleted),
  ``readyNodes``, ``notReadyNodes`` and the ``Ready`` condition, whose message names the nodes at fault
  (the other conditions, the capacity controllers', are kept as they are).

How: a background task wakes every ``interval`` seconds, asks the cluster state which nodes changed since
its last pass, computes the wanted status of their GPUs from the ledger, and patches (JSON merge patch on
the ``status`` subresource) only those whose stored status differs. A GPU is written at most once per
pass, so a burst of binds costs at most ``1/interval`` writes per GPU per second however many pods
land on it; at most ``concurrency`` writes are in flight. Binds never wait for it: the verbs only append
to the state's change log, and a pass yields to the event loop every few nodes. The first pass compares
every GPU; after that a status someone else overwrote is repaired because the GPU watch puts its node in
the change log too. Pool totals are kept per node and summed, updated for the changed nodes only, and
compared with the GPUPools every ``pool_interval`` seconds. Nodes described only by GPU Feature Discovery
labels have no GPU objects and are skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter

from extender.common.conditions import with_condition
from extender.common.contract import WORKLOAD_LABEL
from extender.common.options import duration
from extender.common.quantity import Format, format_quantity
from extender.controllers.runner import Reconciler
from extender.scheduling.inventory import tflops_of
from extender.scheduling.ledger import Allocation
from extender.scheduling.placement import share_on
from extender.scheduling.state import ClusterState, GPUView

if TYPE_CHECKING:
    from extender.controllers.wiring import Built, Deps

log = logging.getLogger(__name__)

# Status keys this module owns; anything else in the status (capacity, phase, ...) is left alone.
GPU_KEYS = ("available", "runningApps")
# GPUs plus pods compared between two yields to the event loop (about 10 ms of work)
WORK_PER_SLICE = 200
POOL_KEYS = ("totalNodes", "totalGPUs", "totalTFlops", "totalVRAM", "allocatedTFlops", "allocatedVRAM",
             "availableTFlops", "availableVRAM", "partiallyUsedGPUs", "phase", "readyNodes", "notReadyNodes",
             "conditions")
# TensorFusion's pool phases (api/v1 TensorFusionPoolPhase) and its condition type (ConditionStatusTypeReady)
PHASE_RUNNING, PHASE_UPDATING, PHASE_DESTROYING = "Running", "Updating", "Destroying"
READY = "Ready"
NAMED_NODES = 5  # nodes named in a condition message


@dataclass(frozen=True)
class StatusSettings:
    interval: float = 1.0  # seconds between passes: at most one write per GPU per interval
    pool_interval: float = 5.0
    concurrency: int = 4
    settle: float = 10.0  # how long our own write may take to come back through the watch


NAME = "gpustatus"
DEFAULT: StatusSettings | None = None  # --write-gpu-status is off unless asked for


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("GPU and GPUPool status")
    group.add_argument("--write-gpu-status", action=argparse.BooleanOptionalAction, default=False,
                       help="keep GPU status.available / status.runningApps and GPUPool status totals in "
                            "step with the extender's ledger (off when another component owns them)")
    group.add_argument("--gpu-status-interval", type=duration("--gpu-status-interval", positive=True),
                       default=StatusSettings.interval, metavar="DURATION",
                       help="time between status passes: at most one write per GPU per pass (default 1s)")


def from_args(args: argparse.Namespace) -> StatusSettings | None:
    """The status writer's settings, or None when it does not run."""
    return StatusSettings(interval=float(args.gpu_status_interval)) if args.write_gpu_status else None


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
    """One pool's figures; nodes are counted, so totals of nodes add up (``merge``)."""

    nodes: int = 0
    gpus: int = 0
    partially_used: int = 0
    total_tflops: Fraction = Fraction(0)
    total_vram: int = 0
    used_tflops: Fraction = Fraction(0)
    used_vram: int = 0

    def add(self, gpu: GPUView) -> None:
        self.gpus += 1
        self.total_tflops += gpu.capacity_tflops
        self.total_vram += gpu.capacity_vram
        self.used_tflops += min(gpu.used_tflops, gpu.capacity_tflops)
        self.used_vram += min(gpu.used_vram, gpu.capacity_vram)
        if 0.0 < gpu.used_percent < 100.0:
            self.partially_used += 1

    def merge(self, other: PoolTotals, sign: int = 1) -> None:
        self.nodes += sign * other.nodes
        self.gpus += sign * other.gpus
        self.partially_used += sign * other.partially_used
        self.total_tflops += sign * other.total_tflops
        self.total_vram += sign * other.total_vram
        self.used_tflops += sign * other.used_tflops
        self.used_vram += sign * other.used_vram

    def status(self) -> dict[str, Any]:
        return {
            "totalNodes": self.nodes, "totalGPUs": self.gpus,
            "totalTFlops": tflops_text(self.total_tflops), "totalVRAM": vram_text(self.total_vram),
            "allocatedTFlops": tflops_text(self.used_tflops), "allocatedVRAM": vram_text(self.used_vram),
            "availableTFlops": tflops_text(self.total_tflops - self.used_tflops),
            "availableVRAM": vram_text(self.total_vram - self.used_vram),
            "partiallyUsedGPUs": self.partially_used,
        }


def node_ready(node: Mapping[str, Any] | None) -> bool:
    """The Node's Ready condition is True (a Node not in the cache is not ready)."""
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in ((node or {}).get("status") or {}).get("conditions") or [])


def _asks_capacity(pool: Mapping[str, Any]) -> bool:
    """``spec.capacityConfig.minResources`` asks for TFLOPS or VRAM: the pool may not sit at zero nodes."""
    minimum = (((pool.get("spec") or {}).get("capacityConfig") or {}).get("minResources")) or {}
    return any(str(minimum.get(k) or "0").strip() not in ("0", "") for k in ("tflops", "vram"))


def pool_health(pool: Mapping[str, Any], ready: Mapping[str, bool]) -> dict[str, Any]:
    """The phase, node counts and Ready condition (no time) of ``pool`` whose nodes are ``ready``'s keys,
    decided as TensorFusion's pool controller decides the phase."""
    waiting = sorted(name for name, ok in ready.items() if not ok)
    named = ", ".join(waiting[:NAMED_NODES]) + (f" and {len(waiting) - NAMED_NODES} more"
                                                if len(waiting) > NAMED_NODES else "")
    if (pool.get("metadata") or {}).get("deletionTimestamp"):
        phase, status, reason, message = PHASE_DESTROYING, "False", "Deleting", "the GPUPool is being deleted"
    elif waiting:
        phase, status, reason = PHASE_UPDATING, "False", "NodesNotReady"
        message = f"{len(waiting)} of {len(ready)} nodes not Ready: {named}"
    elif not ready and _asks_capacity(pool):
        phase, status, reason = PHASE_UPDATING, "False", "NoNodes"
        message = "no GPU node in the pool yet, and capacityConfig.minResources asks for capacity"
    else:
        phase, status, reason = PHASE_RUNNING, "True", "NodesReady"
        message = f"all {len(ready)} nodes Ready" if ready else "no nodes, none asked for (minResources 0)"
    return {"phase": phase, "readyNodes": len(ready) - len(waiting), "notReadyNodes": len(waiting),
            "condition": {"type": READY, "status": status, "reason": reason, "message": message}}


def node_parts(gpus: Iterable[GPUView], no_pool: str | None = None) -> dict[str, PoolTotals]:
    """One node's contribution to each of its pools (GPUs without a pool under ``no_pool``, or left out)."""
    out: dict[str, PoolTotals] = {}
    for gpu in gpus:
        pool = gpu.pool or no_pool
        if pool is None:
            continue
        part = out.get(pool)
        if part is None:
            part = out[pool] = PoolTotals(nodes=1)
        part.add(gpu)
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
                 clock: Callable[[], float] = time.monotonic, nodes: Lookup | None = None) -> None:
        self.state = state
        self.api = api
        self.gpus = gpus
        self.pools = pools
        self.pods = pods
        self.nodes = nodes  # Node objects, for the pools' phase (None: every node counts as Ready)
        self.settings = settings or StatusSettings()
        self.metrics = StatusMetrics(registry)
        self._clock = clock
        self._tick = 0
        self._first = True
        self._pool_due = 0.0
        self._node_parts: dict[str, dict[str, PoolTotals]] = {}
        self._pool_sums: dict[str, PoolTotals] = {}
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

    def _node_changed(self, node: str, views: list[GPUView]) -> None:
        """Replace the node's contribution to the pool totals."""
        for pool, part in self._node_parts.pop(node, {}).items():
            self._pool_sums[pool].merge(part, -1)
        parts = node_parts(views)
        if parts:
            self._node_parts[node] = parts
        for pool, part in parts.items():
            self._pool_sums.setdefault(pool, PoolTotals()).merge(part)

    async def gpu_writes(self, nodes: Iterable[str]) -> list[tuple[str, str, dict[str, Any]]]:
        """The GPU status patches due for ``nodes``: (node, GPU, status). Yields to the event loop every
        ``WORK_PER_SLICE`` GPUs and pods, so a pass over a large cluster never holds up a scheduler verb."""
        out = []
        work = 0
        for node in nodes:
            if work >= WORK_PER_SLICE:
                await asyncio.sleep(0)
                work = 0
            views = self.state.node_gpus(node)
            self._node_changed(node, views)
            for gpu in views:
                if gpu.device.synthetic:
                    continue
                holders = self.state.gpu_holders(gpu.name)
                work += 1 + len(holders)
                wanted = gpu_status(gpu, holders, self._workload)
                if self._due("gpus", gpu.name, wanted, self.gpus.get(gpu.name), GPU_KEYS):
                    out.append((node, gpu.name, wanted))
        return out

    def _pool_health(self, name: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The pool's phase, node counts and conditions (its Ready condition set among the others)."""
        members = [node for node, parts in self._node_parts.items() if name in parts]
        ready = {node: self.nodes is None or node_ready(self.nodes.get(node)) for node in members}
        health = pool_health(obj, ready)
        conditions = (obj.get("status") or {}).get("conditions") or []
        health["conditions"] = with_condition(conditions, health.pop("condition"))
        return health

    def pool_writes(self) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for obj in self.pools.list():
            name = str((obj.get("metadata") or {}).get("name"))
            wanted = {**self._pool_sums.get(name, PoolTotals()).status(), **self._pool_health(name, obj)}
            if self._due("gpupools", name, wanted, obj, POOL_KEYS):
                out.append((name, wanted))
        return sorted(out, key=lambda w: w[0])

    async def step(self) -> int:
        """One pass; returns the number of writes attempted."""
        changed, self._tick = self.state.changed_since(self._tick)
        if self._first or changed is None:
            # everything once at the start (and when the change log has moved on too far): after that,
            # every change of a GPU object, ours or anyone's, reaches the change log through the watch
            nodes = set(self.state.nodes()) | set(self._node_parts)
            self._first = False
        else:
            nodes = changed | self._retry
        self._retry = set()
        writes = [("gpus", node, name, status)
                  for node, name, status in await self.gpu_writes(sorted(nodes))]
        now = self._clock()
        if now >= self._pool_due:
            writes += [("gpupools", "", name, status) for name, status in self.pool_writes()]
            self._pool_due = now + self.settings.pool_interval

        async def write(plural: str, node: str, name: str, status: dict[str, Any]) -> None:
            kind = "gpu" if plural == "gpus" else "gpupool"
            try:
                stored = await self.api.patch_status(plural, name, status)
            except Exception as exc:  # status is informational; the next pass retries
                self.metrics.writes.labels(kind, "error").inc()
                self._written.pop((plural, name), None)
                if node:
                    self._retry.add(node)
                else:
                    self._pool_due = 0.0
                log.warning("status write failed", extra={"object": f"{plural}/{name}", "error": str(exc)})
                return
            rv = str((stored.get("metadata") or {}).get("resourceVersion") or "")
            self._written[(plural, name)] = _Written(status, rv, self._clock())
            self.metrics.writes.labels(kind, "ok").inc()

        pending = iter(writes)

        async def worker() -> None:  # a few workers share the list: no task per write
            for item in pending:
                await write(*item)

        await asyncio.gather(*(worker() for _ in range(min(self.settings.concurrency, len(writes)))))
        return len(writes)

    async def reconcile(self, now: dt.datetime) -> float:
        """One pass; the next one ``interval`` seconds after this one started."""
        started = self._clock()
        await self.step()
        return max(self.settings.interval - (self._clock() - started), 0.05)


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


class _NoObjects:
    """No GPU objects are watched (--inventory-source node-labels): no GPU status to write."""

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return None

    def list(self) -> list[dict[str, Any]]:
        return []


def build(deps: Deps, settings: StatusSettings | None) -> Built | None:
    """The status writer, on every replica (its writes compare with the watched objects), once the ledger
    is known."""
    from extender.controllers.wiring import Built

    if settings is None:
        return None
    writer = GPUStatusWriter(deps.state, KubeStatusApi(deps.api_client), gpus=deps.core.gpus or _NoObjects(),
                             pools=deps.core.gpupools, pods=deps.core.pods, settings=settings,
                             registry=deps.registry, nodes=deps.core.nodes)
    return Built(controllers=(Reconciler("gpu-status", writer.reconcile, caches=deps.core.all),), part=writer)

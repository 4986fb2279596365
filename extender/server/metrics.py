"""Prometheus metrics of the extender, on a registry of its own."""

from __future__ import annotations

import asyncio
import collections
import functools
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.utils import floatToGoString

from extender.common.version import version

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# up to 60 s: a bind may take up to its 55 s deadline on a slow API server
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class NodeUse:
    node: str
    pool: str
    tflops_percent: float
    vram_percent: float


@dataclass(frozen=True)
class GPUAllocated:
    """One GPU: ``uuid`` as dcgm-exporter's ``UUID`` label writes it, so PromQL can join ``on(UUID)``."""

    uuid: str
    gpu: str
    node: str
    pool: str
    model: str
    capacity_tflops: float
    capacity_vram: int
    tflops: float
    vram: int


@dataclass(frozen=True)
class PodAllocated:
    """One bound pod's share of one of its GPUs."""

    namespace: str
    pod: str
    workload: str
    node: str
    uuid: str
    tflops: float
    vram: int


@dataclass(frozen=True)
class PoolUse:
    pool: str
    tflops_percent: float
    vram_percent: float
    capacity_tflops: float = 0.0
    capacity_vram_bytes: int = 0


AllocationRows = Callable[[], Awaitable[tuple[list["GPUAllocated"], list["PodAllocated"]]]]

# Rejection messages carry numbers and names; the metric keeps a short class of them.
_REASON_CLASSES = (
    ("not_ready", re.compile(r"not ready|not synced", re.I)),
    ("pod_limit", re.compile(r"GPU pods \(limit", re.I)),
    ("no_gpus", re.compile(r"no GPUs known|no GPU in pool", re.I)),
    ("model_mismatch", re.compile(r"no GPU of model", re.I)),
    ("vendor_mismatch", re.compile(r"no GPU of vendor", re.I)),
    ("indices_mismatch", re.compile(r"no GPU with index", re.I)),
    ("gpu_not_schedulable", re.compile(r"no Running GPU", re.I)),
    ("too_large", re.compile(r"exceeds the largest GPU|large enough", re.I)),
    ("too_few_gpus", re.compile(r"matching GPUs .*this node has", re.I)),
    ("no_idle_gpu", re.compile(r"idle", re.I)),
    ("insufficient_capacity", re.compile(r"\bfree\b|\bfit\b|busy", re.I)),
    ("bad_request", re.compile(r"tensor-fusion\.ai/|invalid|malformed", re.I)),
)


@functools.lru_cache(maxsize=4096)
def reason_class(message: str) -> str:
    # Memoised: the pods of one shape meet the same few messages on every filter.
    for name, pattern in _REASON_CLASSES:
        if pattern.search(message):
            return name
    return "other"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.request_duration = Histogram(
            "tf_extender_request_duration_seconds", "Time to answer a scheduler call, by verb",
            ["verb"], buckets=_BUCKETS, registry=r)
        self.requests = Counter(
            "tf_extender_requests_total", "Scheduler calls by verb and outcome", ["verb", "outcome"],
            registry=r)
        self.filter_rejections = Counter(
            "tf_extender_filter_rejections_total", "Nodes filtered out, by reason class", ["reason"],
            registry=r)
        self.binds = Counter("tf_extender_binds_total", "Bind calls by outcome", ["outcome"], registry=r)
        self.topology_placements = Counter(
            "tf_extender_gpu_topology_placements_total",
            "Multi-GPU pods bound, by pool and the GPU topology tier of their GPUs (0 one NVLink group, "
            "1 one NUMA node, 2 across NUMA nodes, 3 unknown)", ["pool", "tier"], registry=r)
        self.build_info = Gauge(
            "tf_extender_build_info", "Always 1; the version label says which release of tf-extender runs",
            ["version"], registry=r)
        self.build_info.labels(version()).set(1)
        self.pool_allocated = Gauge(
            "tf_extender_pool_allocated_ratio", "Allocated share of a pool's GPUs, 0 to 1",
            ["pool", "resource"], registry=r)
        self.pool_capacity_tflops = Gauge(
            "tf_extender_pool_capacity_tflops", "TFLOPS of a pool's GPUs, allocated or not", ["pool"],
            registry=r)
        self.pool_capacity_vram = Gauge(
            "tf_extender_pool_capacity_vram_bytes", "VRAM of a pool's GPUs in bytes, allocated or not",
            ["pool"], registry=r)
        self.leader = Gauge(
            "tf_extender_leader", "1 on the replica whose leader-only controllers act (it holds the Leases), "
            "0 on a standby; the identity label is the Lease holder name this replica writes",
            ["identity"], registry=r)
        self.partially_used = Gauge(
            "tf_extender_partially_used_gpus", "GPUs that are neither idle nor full", registry=r)
        self.preemptions = Counter(
            "tf_extender_preemptions_total", "Pods evicted to make room for higher-priority GPU pods",
            ["outcome"], registry=r)
        self.distrusted = Counter(
            "tf_extender_distrusted_allocations_total",
            "Allocation records of pods the ledger did not believe (a GPU of another node, more than the GPU "
            "has left, a record changed after the bind), by reason", ["reason"], registry=r)
        self.scheduler_nudges = Counter(
            "tf_extender_scheduler_nudges_total",
            "Node annotation updates that prompt kube-scheduler to retry GPU pods the extender turned away, "
            "once room appeared on that node, by outcome (sent, error, gone)", ["outcome"], registry=r)
        # every node's, GPU's and bound pod's series, rendered from rows (``row_text``)
        r.register(RowFamilies())
        self.rows = Rows([], [], [])
        self._allocations: AllocationRows | None = None
        self._refresh: Callable[[], None] | None = None

    def set_allocations(self, gpus: list[GPUAllocated], pods: list[PodAllocated]) -> None:
        """Replace the per-GPU and per-pod allocation rows (gone GPUs and pods disappear)."""
        self.rows = Rows(self.rows.nodes, gpus, pods)

    def count_rejections(self, messages: Iterable[str]) -> None:
        # Thousands of nodes share a handful of messages: classify each distinct one once.
        per_class: collections.Counter[str] = collections.Counter()
        for message, count in collections.Counter(messages).items():
            per_class[reason_class(message)] += count
        for reason, count in per_class.items():
            self.filter_rejections.labels(reason).inc(count)

    def set_utilisation(self, nodes: Iterable[NodeUse], pools: Iterable[PoolUse],
                        partially_used: int) -> None:
        """Replace the gauges' series (nodes that left the cluster disappear)."""
        self.rows = Rows(list(nodes), self.rows.gpus, self.rows.pods)
        self.pool_allocated.clear()
        self.pool_capacity_tflops.clear()
        self.pool_capacity_vram.clear()
        for p in pools:
            self.pool_capacity_tflops.labels(p.pool).set(p.capacity_tflops)
            self.pool_capacity_vram.labels(p.pool).set(p.capacity_vram_bytes)
            self.pool_allocated.labels(p.pool, "tflops").set(p.tflops_percent / 100.0)
            self.pool_allocated.labels(p.pool, "vram").set(p.vram_percent / 100.0)
        self.partially_used.set(partially_used)

    def on_scrape(self, refresh: Callable[[], None], allocations: AllocationRows | None = None) -> None:
        """``refresh`` sets the gauges before each page; ``allocations``, if given, makes the per-GPU and
        per-pod rows for ``render_async``, yielding to the event loop as it goes."""
        self._refresh = refresh
        self._allocations = allocations

    def render(self) -> bytes:
        if self._refresh is not None:
            self._refresh()
        return generate_latest(self.registry) + b"".join(row_text(self.rows))

    async def render_async(self) -> bytes:
        """The page ``render`` makes, with the rows made and written a slice at a time, so that a scrape
        holds the verbs up for one slice at most."""
        if self._refresh is not None:
            self._refresh()
        parts = [generate_latest(self.registry)]
        if self._allocations is not None:
            self.set_allocations(*await self._allocations())
        for chunk in row_text(self.rows):
            parts.append(chunk)
            await asyncio.sleep(0)
        return b"".join(parts)


# ------------------------------------------------------------------------------ per node, GPU and pod

# Tens of thousands of series at a thousand nodes (four per GPU, two per pod and per node). Through
# prometheus_client's labelled children they cost tens of us each to set and render: 3.1 s per scrape at
# 1,000 nodes and 10,000 pods, with the event loop (and so every filter and bind) held all along. Rendered
# from plain rows they cost a few us each, in slices between which the verbs run.
_NODE_LABELS = ("node", "pool", "resource")
_GPU_LABELS = ("UUID", "gpu", "node", "pool", "modelName")
_POD_LABELS = ("namespace", "pod", "workload", "node", "UUID")
NODE_ALLOCATED = ("tf_extender_node_allocated_ratio", "Allocated share of a node's GPUs, 0 to 1")
GPU_FAMILIES = (
    ("tf_extender_gpu_capacity_tflops", "A GPU's TFLOPS capacity"),
    ("tf_extender_gpu_capacity_vram_bytes", "A GPU's VRAM capacity"),
    ("tf_extender_gpu_allocated_tflops", "TFLOPS the ledger has allocated on a GPU (bound pods)"),
    ("tf_extender_gpu_allocated_vram_bytes", "VRAM the ledger has allocated on a GPU (bound pods)"),
)
POD_FAMILIES = (
    ("tf_extender_pod_allocated_tflops", "TFLOPS a bound pod holds on one of its GPUs"),
    ("tf_extender_pod_allocated_vram_bytes", "VRAM a bound pod holds on one of its GPUs"),
)
ROWS_PER_SLICE = 500


@dataclass(frozen=True)
class Rows:
    nodes: list[NodeUse]
    gpus: list[GPUAllocated]
    pods: list[PodAllocated]


class RowFamilies:
    """The row families in the registry for their names and help (``describe``: the registry refuses a
    second family of a name, the reference docs list them); ``collect`` is empty, as ``Metrics`` renders
    their samples itself."""

    def describe(self) -> list[GaugeMetricFamily]:
        families = [(*NODE_ALLOCATED, _NODE_LABELS), *((n, d, _GPU_LABELS) for n, d in GPU_FAMILIES),
                    *((n, d, _POD_LABELS) for n, d in POD_FAMILIES)]
        return [GaugeMetricFamily(name, doc, labels=list(labels)) for name, doc, labels in families]

    def collect(self) -> list[GaugeMetricFamily]:
        return []


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _label_text(names: Sequence[str]) -> Callable[[Sequence[str]], str]:
    """Label values to ``{name="value",...}``, the names sorted as prometheus_client writes them."""
    order = sorted(range(len(names)), key=names.__getitem__)

    def text(values: Sequence[str]) -> str:
        return "{" + ",".join(f'{names[i]}="{_escape(values[i])}"' for i in order) + "}"
    return text


_node_labels, _gpu_labels, _pod_labels = (_label_text(n) for n in (_NODE_LABELS, _GPU_LABELS, _POD_LABELS))


def _family(name: str, doc: str, samples: Iterable[tuple[str, float]], per_slice: int) -> Iterator[bytes]:
    """One family's text in chunks of ``per_slice`` samples."""
    help_text = doc.replace("\\", "\\\\").replace("\n", "\\n")
    yield f"# HELP {name} {help_text}\n# TYPE {name} gauge\n".encode()
    lines = []
    for labels, value in samples:
        lines.append(f"{name}{labels} {floatToGoString(value)}\n")  # type: ignore[no-untyped-call]
        if len(lines) >= per_slice:
            yield "".join(lines).encode()
            lines.clear()
    yield "".join(lines).encode()


def row_text(rows: Rows, per_slice: int = ROWS_PER_SLICE) -> Iterator[bytes]:
    """The exposition text of the row families in chunks of about ``per_slice`` rows (some empty: the
    labels of a slice made), between which a caller may yield. Each family's samples come together, as the
    format wants; a pod holding one GPU under two allocations sums into one series."""
    nodes: list[tuple[str, float]] = []
    for start in range(0, len(rows.nodes), per_slice):
        for n in rows.nodes[start:start + per_slice]:
            nodes.append((_node_labels((n.node, n.pool, "tflops")), n.tflops_percent / 100.0))
            nodes.append((_node_labels((n.node, n.pool, "vram")), n.vram_percent / 100.0))
        yield b""
    yield from _family(*NODE_ALLOCATED, nodes, per_slice)
    gpus: list[tuple[str, GPUAllocated]] = []
    for start in range(0, len(rows.gpus), per_slice):
        gpus += [(_gpu_labels((g.uuid, g.gpu, g.node, g.pool, g.model)), g)
                 for g in rows.gpus[start:start + per_slice]]
        yield b""
    for (name, doc), field in zip(GPU_FAMILIES, ("capacity_tflops", "capacity_vram", "tflops", "vram"),
                                  strict=True):
        yield from _family(name, doc, ((labels, getattr(g, field)) for labels, g in gpus), per_slice)
    held: dict[str, list[float]] = {}
    for start in range(0, len(rows.pods), per_slice):
        for p in rows.pods[start:start + per_slice]:
            sums = held.setdefault(_pod_labels((p.namespace, p.pod, p.workload, p.node, p.uuid)), [0.0, 0.0])
            sums[0] += p.tflops
            sums[1] += p.vram
        yield b""
    for i, (name, doc) in enumerate(POD_FAMILIES):
        yield from _family(name, doc, ((labels, sums[i]) for labels, sums in held.items()), per_slice)

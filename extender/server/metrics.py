"""Prometheus metrics of the extender, on a registry of its own."""

from __future__ import annotations

import collections
import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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
        self.node_allocated = Gauge(
            "tf_extender_node_allocated_ratio", "Allocated share of a node's GPUs, 0 to 1",
            ["node", "pool", "resource"], registry=r)
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
        gpu_labels = ["UUID", "gpu", "node", "pool", "modelName"]
        self.gpu_capacity_tflops = Gauge(
            "tf_extender_gpu_capacity_tflops", "A GPU's TFLOPS capacity", gpu_labels, registry=r)
        self.gpu_capacity_vram = Gauge(
            "tf_extender_gpu_capacity_vram_bytes", "A GPU's VRAM capacity", gpu_labels, registry=r)
        self.gpu_allocated_tflops = Gauge(
            "tf_extender_gpu_allocated_tflops", "TFLOPS the ledger has allocated on a GPU (bound pods)",
            gpu_labels, registry=r)
        self.gpu_allocated_vram = Gauge(
            "tf_extender_gpu_allocated_vram_bytes", "VRAM the ledger has allocated on a GPU (bound pods)",
            gpu_labels, registry=r)
        pod_labels = ["namespace", "pod", "workload", "node", "UUID"]
        self.pod_allocated_tflops = Gauge(
            "tf_extender_pod_allocated_tflops", "TFLOPS a bound pod holds on one of its GPUs", pod_labels,
            registry=r)
        self.pod_allocated_vram = Gauge(
            "tf_extender_pod_allocated_vram_bytes", "VRAM a bound pod holds on one of its GPUs", pod_labels,
            registry=r)
        self._refresh: Callable[[], None] | None = None

    def set_allocations(self, gpus: Iterable[GPUAllocated], pods: Iterable[PodAllocated]) -> None:
        """Replace the per-GPU and per-pod allocation series (gone GPUs and pods disappear)."""
        gauges = (self.gpu_capacity_tflops, self.gpu_capacity_vram, self.gpu_allocated_tflops,
                  self.gpu_allocated_vram, self.pod_allocated_tflops, self.pod_allocated_vram)
        for gauge in gauges:
            gauge.clear()
        for g in gpus:
            labels = (g.uuid, g.gpu, g.node, g.pool, g.model)
            self.gpu_capacity_tflops.labels(*labels).set(g.capacity_tflops)
            self.gpu_capacity_vram.labels(*labels).set(g.capacity_vram)
            self.gpu_allocated_tflops.labels(*labels).set(g.tflops)
            self.gpu_allocated_vram.labels(*labels).set(g.vram)
        for p in pods:
            labels = (p.namespace, p.pod, p.workload, p.node, p.uuid)
            self.pod_allocated_tflops.labels(*labels).inc(p.tflops)
            self.pod_allocated_vram.labels(*labels).inc(p.vram)

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
        self.node_allocated.clear()
        for n in nodes:
            self.node_allocated.labels(n.node, n.pool, "tflops").set(n.tflops_percent / 100.0)
            self.node_allocated.labels(n.node, n.pool, "vram").set(n.vram_percent / 100.0)
        self.pool_allocated.clear()
        self.pool_capacity_tflops.clear()
        self.pool_capacity_vram.clear()
        for p in pools:
            self.pool_capacity_tflops.labels(p.pool).set(p.capacity_tflops)
            self.pool_capacity_vram.labels(p.pool).set(p.capacity_vram_bytes)
            self.pool_allocated.labels(p.pool, "tflops").set(p.tflops_percent / 100.0)
            self.pool_allocated.labels(p.pool, "vram").set(p.vram_percent / 100.0)
        self.partially_used.set(partially_used)

    def on_scrape(self, refresh: Callable[[], None]) -> None:
        self._refresh = refresh

    def render(self) -> bytes:
        if self._refresh is not None:
            self._refresh()
        return generate_latest(self.registry)

"""Stranded GPU allocations: shares the ledger still counts although no workload can be using them.

A pod's ``tensor-fusion.ai/gpu-ids`` annotation holds its share until the pod object is gone (DESIGN §4),
so a pod whose container stopped long ago can keep GPUs allocated and idle:

- ``terminating``: the pod was deleted but is still there a minute past its deletion deadline (a node
  that stopped answering, a finalizer nobody removes);
- ``node_gone``: the pod is bound to a node that no longer exists (pod garbage collection has not run);
- ``phase_unknown``: the node stopped reporting the pod (phase ``Unknown``).

The gauge ``tf_extender_stranded_allocations{pool,reason}`` counts such pods; the ``TensorFusionIdleGPU``
alert fires when it stays above zero.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from extender.common.contract import GPU_IDS, POOL_LABEL
from extender.common.timefmt import parse_time

TERMINATING_GRACE = dt.timedelta(seconds=60)
REASONS = ("terminating", "node_gone", "phase_unknown")


def stranded_reason(pod: Mapping[str, Any], node_exists: Callable[[str], bool],
                    now: dt.datetime) -> str | None:
    meta = pod.get("metadata") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    if not node or not (meta.get("annotations") or {}).get(GPU_IDS):
        return None
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed"):
        return None  # finished pods hold nothing
    deadline = parse_time(meta.get("deletionTimestamp"))
    if deadline is not None and now > deadline + TERMINATING_GRACE:
        return "terminating"
    if not node_exists(str(node)):
        return "node_gone"
    if phase == "Unknown":
        return "phase_unknown"
    return None


def count_stranded(pods: Iterable[Mapping[str, Any]], node_exists: Callable[[str], bool],
                   now: dt.datetime) -> Counter[tuple[str, str]]:
    out: Counter[tuple[str, str]] = Counter()
    for pod in pods:
        reason = stranded_reason(pod, node_exists, now)
        if reason is not None:
            meta = pod.get("metadata") or {}
            annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
            pool = annotations.get(POOL_LABEL) or labels.get(POOL_LABEL)
            out[(str(pool or ""), reason)] += 1
    return out


class _Cache(Protocol):
    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None: ...

    def list(self) -> list[dict[str, Any]]: ...


class StrandedCollector(Collector):
    """Counted on each scrape from the watch caches (no API calls)."""

    def __init__(self, pods: _Cache, nodes: _Cache,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self._pods, self._nodes, self._clock = pods, nodes, clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "tf_extender_stranded_allocations",
            "GPU pods still holding their share with no workload running (terminating past the deadline, "
            "node gone, phase Unknown)", labels=["pool", "reason"])
        counts = count_stranded(self._pods.list(), lambda n: self._nodes.get(n) is not None, self._clock())
        for (pool, reason), value in sorted(counts.items()):
            family.add_metric([pool, reason], value)
        yield family

"""What the ledger has allocated, per GPU and per bound pod, as the metrics' rows.

The ``UUID`` label is the GPU's as dcgm-exporter writes it (``GPUDevice.dcgm_uuid``), so a dashboard or
the autoscaler's usage query can join allocation with use ``on(UUID)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from extender.common.contract import WORKLOAD_LABEL
from extender.scheduling.state import ClusterState
from extender.scheduling.views import GPUView
from extender.server.metrics import ROWS_PER_SLICE, GPUAllocated, PodAllocated

PodLookup = Callable[[str, str], Mapping[str, Any] | None]


def _rows(state: ClusterState, pod: PodLookup) -> Iterator[GPUAllocated | PodAllocated]:
    """Every GPU's row, then every bound pod's row per GPU it holds. The node and allocation lists are
    copied first, so a caller may yield to the event loop between rows while the ledger moves on."""
    views: dict[str, GPUView] = {}
    for node in state.nodes():
        for view in state.node_gpus(node):
            views[view.name] = view
            yield GPUAllocated(view.device.dcgm_uuid, view.name, node, view.pool or "", view.model,
                               float(view.capacity_tflops), view.capacity_vram,
                               float(view.used_tflops), view.used_vram)
    for allocation in state.allocations():
        if state.bound_allocation(allocation.uid) is not allocation:
            continue  # a bind in flight is not a pod yet (or the pod went while the rows were made)
        namespace, _, name = allocation.pod_key.partition("/")
        obj = pod(name, namespace) or {}
        workload = str(((obj.get("metadata") or {}).get("labels") or {}).get(WORKLOAD_LABEL) or "")
        request = allocation.request
        for gpu in allocation.gpu_ids:
            held = views.get(gpu)
            if held is None:
                continue
            yield PodAllocated(namespace, name, workload, allocation.node, held.device.dcgm_uuid,
                               float(request.tflops_on(held.capacity_tflops)),
                               request.vram_on(held.capacity_vram))


def _split(rows: list[GPUAllocated | PodAllocated]) -> tuple[list[GPUAllocated], list[PodAllocated]]:
    return ([row for row in rows if isinstance(row, GPUAllocated)],
            [row for row in rows if isinstance(row, PodAllocated)])


def allocation_rows(state: ClusterState, pod: PodLookup) -> tuple[list[GPUAllocated], list[PodAllocated]]:
    return _split(list(_rows(state, pod)))


async def allocation_rows_async(state: ClusterState, pod: PodLookup, per_slice: int = ROWS_PER_SLICE
                                ) -> tuple[list[GPUAllocated], list[PodAllocated]]:
    """``allocation_rows``, yielding to the event loop after every ``per_slice`` rows (at 40,000 GPUs and
    50,000 pods the rows take seconds)."""
    rows: list[GPUAllocated | PodAllocated] = []
    for row in _rows(state, pod):
        rows.append(row)
        if len(rows) % per_slice == 0:
            await asyncio.sleep(0)
    return _split(rows)

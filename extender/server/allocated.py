"""What the ledger has allocated, per GPU and per bound pod, as the metrics' rows.

The ``UUID`` label is the GPU's as dcgm-exporter writes it (``GPUDevice.dcgm_uuid``), so a dashboard or
the autoscaler's usage query can join allocation with use ``on(UUID)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from extender.common.contract import WORKLOAD_LABEL
from extender.scheduling.state import ClusterState
from extender.scheduling.views import GPUView
from extender.server.metrics import GPUAllocated, PodAllocated

PodLookup = Callable[[str, str], Mapping[str, Any] | None]


def allocation_rows(state: ClusterState, pod: PodLookup) -> tuple[list[GPUAllocated], list[PodAllocated]]:
    gpus: list[GPUAllocated] = []
    views: dict[str, GPUView] = {}
    for node in state.nodes():
        for view in state.node_gpus(node):
            views[view.name] = view
            gpus.append(GPUAllocated(view.device.dcgm_uuid, view.name, node, view.pool or "", view.model,
                                     float(view.capacity_tflops), view.capacity_vram,
                                     float(view.used_tflops), view.used_vram))
    pods: list[PodAllocated] = []
    for allocation in state.allocations():
        if state.bound_allocation(allocation.uid) is not allocation:
            continue  # a bind in flight is not a pod yet
        namespace, _, name = allocation.pod_key.partition("/")
        obj = pod(name, namespace) or {}
        workload = str(((obj.get("metadata") or {}).get("labels") or {}).get(WORKLOAD_LABEL) or "")
        request = allocation.request
        for gpu in allocation.gpu_ids:
            held = views.get(gpu)
            if held is None:
                continue
            pods.append(PodAllocated(namespace, name, workload, allocation.node, held.device.dcgm_uuid,
                                     float(request.tflops_on(held.capacity_tflops)),
                                     request.vram_on(held.capacity_vram)))
    return gpus, pods

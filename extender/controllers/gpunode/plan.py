"""What a node's GPUNode should say, from the inventory and the ledger (pure).

Name: the Node's. Labels: ``tensor-fusion.ai/managed-by: <pool>`` (the first of its pools by name) and
``tensor-fusion.ai/pool-<pool>: "true"`` for each pool, as TensorFusion labels its GPUNodes, plus
``app.kubernetes.io/managed-by: tensor-fusion-extender``, which marks the ones this project keeps (it never
touches a GPUNode without it). Owner: the Node, so the garbage collector removes it with the Node.
Status: ``phase`` (Running, Destroying while the Node is being deleted), ``totalTFlops``/``totalVRAM`` of
its GPUs, ``availableTFlops``/``availableVRAM`` (total minus what the ledger hands out, never below zero),
``virtualTFlops``/``virtualVRAM`` (the totals: no oversubscription), ``totalGPUs``, ``managedGPUs``,
``managedGPUDeviceIDs`` and ``totalGPUPods``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from extender.common.labels import APP_MANAGED_BY, MANAGED_BY, POOL_IDENTIFIER_PREFIX
from extender.common.quantity import Format, format_quantity
from extender.kube.resources import GPU_NODES
from extender.scheduling.ledger import Allocation
from extender.scheduling.state import GPUView

MANAGER = "tensor-fusion-extender"
RUNNING = "Running"
DESTROYING = "Destroying"
STATUS_KEYS = ("phase", "totalTFlops", "totalVRAM", "availableTFlops", "availableVRAM", "virtualTFlops",
               "virtualVRAM", "totalGPUs", "managedGPUs", "managedGPUDeviceIDs", "totalGPUPods")


def ours(gpunode: Mapping[str, Any] | None) -> bool:
    labels = ((gpunode or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(APP_MANAGED_BY) == MANAGER


def gpunode_status(node: Mapping[str, Any] | None, gpus: Iterable[GPUView],
                   holders: Iterable[Allocation]) -> dict[str, Any]:
    views = list(gpus)
    total_t = sum((g.capacity_tflops for g in views), Fraction(0))
    total_v = sum(g.capacity_vram for g in views)
    used_t = sum((min(g.used_tflops, g.capacity_tflops) for g in views), Fraction(0))
    used_v = sum(min(g.used_vram, g.capacity_vram) for g in views)
    deleting = bool(((node or {}).get("metadata") or {}).get("deletionTimestamp"))
    pods = {a.pod_key for a in holders}
    return {
        "phase": DESTROYING if deleting else RUNNING,
        "totalTFlops": format_quantity(total_t), "totalVRAM": format_quantity(total_v, Format.BINARY_SI),
        "availableTFlops": format_quantity(max(total_t - used_t, Fraction(0))),
        "availableVRAM": format_quantity(max(total_v - used_v, 0), Format.BINARY_SI),
        "virtualTFlops": format_quantity(total_t), "virtualVRAM": format_quantity(total_v, Format.BINARY_SI),
        "totalGPUs": len(views), "managedGPUs": len(views),
        "managedGPUDeviceIDs": sorted(g.name for g in views),
        "totalGPUPods": len(pods),
    }


def gpunode_labels(gpus: Iterable[GPUView]) -> dict[str, str]:
    pools = sorted({g.pool for g in gpus if g.pool})
    labels = {APP_MANAGED_BY: MANAGER}
    if pools:
        labels[MANAGED_BY] = pools[0]
    for pool in pools:
        labels[f"{POOL_IDENTIFIER_PREFIX}{pool}"] = "true"
    return labels


def gpunode_body(name: str, node: Mapping[str, Any] | None, gpus: Iterable[GPUView]) -> dict[str, Any]:
    """The GPUNode to create (its status is written next, through the status subresource)."""
    meta: dict[str, Any] = {"name": name, "labels": gpunode_labels(gpus)}
    uid = ((node or {}).get("metadata") or {}).get("uid")
    if uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": str(uid)}]
    return {"apiVersion": GPU_NODES.api_version, "kind": GPU_NODES.kind, "metadata": meta, "spec": {}}


def labels_patch(gpunode: Mapping[str, Any], wanted: Mapping[str, str]) -> dict[str, Any] | None:
    """A merge patch that makes the GPUNode's pool labels ``wanted`` (None: nothing to change); other labels
    are left alone."""
    have = (gpunode.get("metadata") or {}).get("labels") or {}
    patch: dict[str, str | None] = {}
    for key in have:
        if (key == MANAGED_BY or key.startswith(POOL_IDENTIFIER_PREFIX)) and key not in wanted:
            patch[key] = None
    for key, value in wanted.items():
        if have.get(key) != value:
            patch[key] = value
    return {"metadata": {"labels": patch}} if patch else None


def stored_status(gpunode: Mapping[str, Any] | None) -> dict[str, Any]:
    status = (gpunode or {}).get("status") or {}
    return {k: status.get(k) for k in STATUS_KEYS}

"""Cluster objects for the defragmentation tests: a pool over nodes of four 100-TFLOPS / 40 GiB GPUs."""

from __future__ import annotations

from typing import Any

TF = "tensor-fusion.ai/"
OLD = "2026-01-01T00:00:00Z"  # long before NOW: older than any maxDuration in the tests
NOW_TEXT = "2026-06-01T12:00:00+00:00"


def pool(name: str = "p", **defrag: Any) -> dict[str, Any]:
    settings = {"enabled": True, "timezone": "UTC", **defrag}
    return {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool",
            "metadata": {"name": name, "uid": f"uid-{name}"},
            "spec": {"nodeManagerConfig": {"nodeCompaction": {"defrag": settings}}}}


def node(name: str, unschedulable: bool = False, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"unschedulable": unschedulable} if unschedulable else {}}


def gpus(node_name: str, count: int = 4, pool_name: str = "p", vram: str = "40Gi") -> list[dict[str, Any]]:
    return [{
        "apiVersion": "tensor-fusion.ai/v1", "kind": "GPU",
        "metadata": {"name": f"{node_name}-gpu-{i}", "labels": {TF + "gpupool": pool_name}},
        "status": {"nodeSelector": {"kubernetes.io/hostname": node_name},
                   "capacity": {"tflops": "100", "vram": vram}, "gpuModel": "A100", "vendor": "NVIDIA",
                   "phase": "Running", "usedBy": "tensor-fusion", "index": i},
    } for i in range(count)]


def worker(name: str, node_name: str, gpu_index: int, *, tflops: str = "10", vram: str = "4Gi",
           app: str | None = None, owner: bool = True, created: str = OLD, namespace: str = "ml",
           pool_name: str = "p") -> dict[str, Any]:
    """A bound GPU worker holding one GPU of ``node_name``, owned by ReplicaSet ``app`` (default: name)."""
    app = app or name
    meta: dict[str, Any] = {
        "name": name, "namespace": namespace, "uid": f"uid-{name}", "creationTimestamp": created,
        "labels": {"app": app, TF + "component": "worker", TF + "gpupool": pool_name},
        "annotations": {TF + "gpupool": pool_name, TF + "tflops-request": tflops, TF + "tflops-limit": tflops,
                        TF + "vram-request": vram, TF + "vram-limit": vram, TF + "gpu-count": "1",
                        TF + "gpu-ids": f"{node_name}-gpu-{gpu_index}"},
    }
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{app}-rs",
                                    "uid": f"uid-rs-{app}", "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": node_name},
            "status": {"phase": "Running"}}


def pdb(app: str, namespace: str = "ml") -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": f"{app}-pdb", "namespace": namespace},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": app}}}}


def room_for_one() -> list[dict[str, Any]]:
    """heavy has one whole GPU left; light-a and light-b each run one worker that needs a whole GPU."""
    objects: list[dict[str, Any]] = [pool()]
    for name in ("heavy", "light-a", "light-b"):
        objects += [node(name), *gpus(name)]
    for i in range(3):
        objects += [worker(f"heavy-w{i}", "heavy", i, tflops="100", vram="40Gi"), pdb(f"heavy-w{i}")]
    for name in ("light-a", "light-b"):
        objects += [worker(f"{name}-w0", name, 0, tflops="100", vram="40Gi"), pdb(f"{name}-w0")]
    return objects


def four_nodes(**defrag: Any) -> list[dict[str, Any]]:
    """heavy-a 3/4 GPUs in use, heavy-b 4/4, light-a and light-b 1/4 each, every worker covered by a PDB."""
    objects: list[dict[str, Any]] = [pool(**defrag)]
    for name in ("heavy-a", "heavy-b", "light-a", "light-b"):
        objects += [node(name), *gpus(name)]
    layout = {"heavy-a": 3, "heavy-b": 4, "light-a": 1, "light-b": 1}
    for name, used in layout.items():
        for i in range(used):
            pod_name = f"{name}-w{i}"
            objects += [worker(pod_name, name, i), pdb(pod_name)]
    return objects

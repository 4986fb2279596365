"""Fakes at the extender's Kubernetes I/O boundary, and small object builders, for unit tests."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from kubernetes.client import ApiException

from extender.common.contract import GPU_IDS

POOL = "pool-a"


async def eventually(check: Any, timeout: float = 10.0, interval: float = 0.01) -> None:
    """Poll ``check`` until it holds (a generous bound: the machine may be busy)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(interval)


def gpu(name: str, node: str, tflops: str = "100", vram: str = "40Gi") -> dict[str, Any]:
    return {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPU",
            "metadata": {"name": name, "labels": {"tensor-fusion.ai/gpupool": POOL}},
            "status": {"phase": "Running", "capacity": {"tflops": tflops, "vram": vram},
                       "nodeSelector": {"kubernetes.io/hostname": node},
                       "gpuModel": "A100", "vendor": "NVIDIA"}}


def pod(name: str, uid: str, tflops: str = "60", index: int | None = None, node: str | None = None,
        gpu_ids: str | None = None, phase: str = "Pending") -> dict[str, Any]:
    annotations = {"tensor-fusion.ai/tflops-request": tflops, "tensor-fusion.ai/vram-request": "4Gi",
                   "tensor-fusion.ai/gpupool": POOL}
    if gpu_ids:
        annotations[GPU_IDS] = gpu_ids
    limits = {f"tensor-fusion.ai/index_{(index - 1) // 8:x}": str((index - 1) % 8 + 1)} if index else {}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": limits}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "uid": uid, "annotations": annotations,
                         "labels": {"tensor-fusion.ai/component": "worker"}},
            "spec": spec, "status": {"phase": phase}}


class Pods:
    def __init__(self, *pods: dict[str, Any]) -> None:
        self.pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self.pods.get((namespace or "", name))


class FakeApi:
    """The binder's I/O boundary: records calls, fails on demand.

    ``fail[what]`` is raised by every call of that kind; ``fail_next[what]`` lists errors raised by the
    next calls, one each, before calls succeed again. ``bound_after`` makes a failing Binding take
    effect anyway (as a timed-out request that the API server completes), so reads show it bound.
    """

    def __init__(self, pods: Pods) -> None:
        self.pods = pods
        self.calls: list[tuple[str, Any]] = []
        self.fail: dict[str, Exception] = {}
        self.fail_next: dict[str, list[Exception]] = {}
        self.gate: asyncio.Event | None = None
        self.node_after_bind_error: str | None = None
        self.bound_after: bool = False

    async def _step(self, what: str, detail: Any) -> None:
        self.calls.append((what, detail))
        if what == "bind" and self.gate is not None:
            await self.gate.wait()
        if self.fail_next.get(what):
            raise self.fail_next[what].pop(0)
        if what in self.fail:
            raise self.fail[what]

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        await self._step("get", name)
        found = self.pods.get(name, namespace)
        if found is None:
            raise ApiException(status=404, reason="Not Found")
        if self.node_after_bind_error:
            return {**found, "spec": {**found["spec"], "nodeName": self.node_after_bind_error}}
        return found

    async def merge_patch(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        await self._step("merge_patch", patch)
        return {}

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   annotations: Mapping[str, str]) -> None:
        try:
            await self._step("bind", (name, uid, node, dict(annotations)))
        except Exception:
            if self.bound_after:
                self._store_binding(namespace, name, node, annotations)
            raise
        self._store_binding(namespace, name, node, annotations)

    def _store_binding(self, namespace: str, name: str, node: str, annotations: Mapping[str, str]) -> None:
        found = self.pods.get(name, namespace)
        if found is not None and not found["spec"].get("nodeName"):
            self.pods.pods[(namespace, name)] = {
                **found, "metadata": {**found["metadata"],
                                      "annotations": {**found["metadata"]["annotations"], **annotations}},
                "spec": {**found["spec"], "nodeName": node}}
        elif found is not None:
            raise ApiException(status=409, reason="Conflict")

    async def delete(self, namespace: str, name: str, uid: str) -> None:
        await self._step("delete", (name, uid))

    async def evict(self, namespace: str, name: str, uid: str) -> None:
        await self._step("evict", (name, uid))


class Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str, str]] = []

    def record(self, obj: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        self.recorded.append((obj["metadata"]["name"], reason, message, type_))

"""Synthetic cluster objects shared by the benchmarks: GPU objects, pools, canonical GPU pods.

Pods are built in the canonical form the webhook writes (``contract.render_annotations``), so the
extender reads them exactly as it reads mutated pods in a cluster.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

from extender.common import contract

GI = 1 << 30
POOL = "bench-pool"
TEMPLATE = "bench-template"
NAMESPACE = "bench"
GPU_SCHEDULER = "tensor-fusion-scheduler"
HOSTNAME = "kubernetes.io/hostname"


@dataclass(frozen=True)
class GPUSpec:
    model: str
    tflops: int
    vram_gi: int


# The GPU mix of TensorFusion's own scheduler benchmark (test/sched/setup.go).
B200 = GPUSpec("B200", 2250, 141)
H100 = GPUSpec("H100", 989, 80)
L40S = GPUSpec("L40S", 450, 48)
A100 = GPUSpec("A100", 312, 40)
MIXED_MODELS = (B200, H100, L40S, A100)


@dataclass(frozen=True)
class PodShape:
    tflops: int
    vram_gi: int
    gpus: int

    @property
    def label(self) -> str:
        return f"{self.gpus}x{self.tflops}T/{self.vram_gi}Gi"


# The pod mix of TensorFusion's scheduler benchmark: single-GPU small/medium/large, two-GPU two sizes.
POD_SHAPES = (PodShape(20, 4, 1), PodShape(40, 8, 1), PodShape(100, 16, 1), PodShape(30, 4, 2),
              PodShape(200, 32, 2))


def node_name(i: int) -> str:
    return f"node-{i:05d}"


def gpu_name(node: str, j: int) -> str:
    return f"{node}-gpu-{j}"


def gpu_object(name: str, node: str, spec: GPUSpec, index: int, pool: str = POOL) -> dict[str, Any]:
    return {
        "apiVersion": "tensor-fusion.ai/v1",
        "kind": "GPU",
        "metadata": {"name": name, "labels": {contract.POOL_LABEL_ON_GPU: pool}},
        "status": {
            "capacity": {"tflops": str(spec.tflops), "vram": f"{spec.vram_gi}Gi"},
            "available": {"tflops": str(spec.tflops), "vram": f"{spec.vram_gi}Gi"},
            "gpuModel": spec.model, "vendor": "NVIDIA", "index": index, "phase": "Running",
            "usedBy": contract.USED_BY_TAINT_VALUE, "uuid": f"GPU-{name}",
            "nodeSelector": {HOSTNAME: node},
        },
    }


def node_object(name: str, gpus: int = 8) -> dict[str, Any]:
    alloc = {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    alloc.update({r: "1024" for r in contract.index_resource_names()})
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {HOSTNAME: name, contract.POOL_LABEL_ON_GPU: POOL}},
        "status": {"capacity": alloc, "allocatable": alloc,
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }


def pool_objects(mode: str | None = None, pool: str = POOL) -> list[dict[str, Any]]:
    """The GPUPool (default pool) and, with a mode, its SchedulingConfigTemplate."""
    spec: dict[str, Any] = {}
    objs: list[dict[str, Any]] = []
    if mode:
        spec["schedulingConfigTemplate"] = TEMPLATE
        objs.append({"apiVersion": "tensor-fusion.ai/v1", "kind": "SchedulingConfigTemplate",
                     "metadata": {"name": TEMPLATE}, "spec": {"placement": {"mode": mode}}})
    objs.insert(0, {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool",
                    "metadata": {"name": pool, "annotations": {contract.DEFAULT_POOL_ANNOTATION: "true"}},
                    "spec": spec})
    return objs


@lru_cache(maxsize=4096)
def _canonical(tflops: Fraction, vram: int, gpus: int, pool: str, model: str | None,
               isolation: str | None) -> tuple[tuple[str, str], ...]:
    t, v = contract.format_tflops(tflops), contract.format_bytes(vram)
    raw = {contract.TFLOPS_REQUEST: t, contract.TFLOPS_LIMIT: t,
           contract.VRAM_REQUEST: v, contract.VRAM_LIMIT: v,
           contract.GPU_COUNT: str(gpus), contract.GPU_POOL: pool}
    if model:
        raw[contract.GPU_MODEL] = model
    if isolation:
        raw[contract.ISOLATION] = isolation
        if isolation == contract.Isolation.SHARED.value:
            raw = {k: v for k, v in raw.items() if k not in (contract.TFLOPS_REQUEST, contract.TFLOPS_LIMIT,
                                                              contract.VRAM_REQUEST, contract.VRAM_LIMIT)}
    request = contract.parse_request(raw)
    return tuple(sorted(contract.render_annotations(request).items()))


def canonical_annotations(tflops: Fraction | int, vram: int, gpus: int = 1, pool: str = POOL,
                          model: str | None = None, isolation: str | None = None) -> dict[str, str]:
    return dict(_canonical(Fraction(tflops), int(vram), gpus, pool, model, isolation))


def gpu_pod(name: str, annotations: dict[str, str], *, index: int = 1, namespace: str = NAMESPACE,
            uid: str | None = None, node: str | None = None, gpu_ids: tuple[str, ...] = (),
            phase: str = "Pending") -> dict[str, Any]:
    """A pod as the webhook leaves it (canonical annotations, index resource, GPU scheduler)."""
    res_name, res_qty = contract.index_resource(index)
    ann = dict(annotations)
    if gpu_ids:
        ann[contract.GPU_IDS] = ",".join(gpu_ids)
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": namespace, "uid": uid or f"uid-{namespace}-{name}",
            "labels": {contract.ENABLED_LABEL: "true", contract.COMPONENT_LABEL: contract.COMPONENT_WORKER,
                       contract.POOL_LABEL: ann.get(contract.GPU_POOL, POOL),
                       contract.WORKLOAD_LABEL: name},
            "annotations": ann,
        },
        "spec": {
            "schedulerName": GPU_SCHEDULER,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "resources": {
                                "requests": {"cpu": "10m", "memory": "16Mi", res_name: str(res_qty)},
                                "limits": {res_name: str(res_qty)}}}],
            "tolerations": [{"key": contract.USED_BY_TAINT_KEY, "operator": "Equal",
                             "value": contract.USED_BY_TAINT_VALUE, "effect": "PreferNoSchedule"}],
            "terminationGracePeriodSeconds": 0,
        },
        "status": {"phase": phase},
    }
    if node:
        pod["spec"]["nodeName"] = node
    return pod


def whole_gpu_pod(name: str, namespace: str = NAMESPACE,
                  scheduler: str = "default-scheduler") -> dict[str, Any]:
    """A plain pod asking the device-plugin way for one whole GPU (the no-extender baseline)."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"bench": "whole-gpu"}},
        "spec": {
            "schedulerName": scheduler,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi", "nvidia.com/gpu": "1"},
                                          "limits": {"nvidia.com/gpu": "1"}}}],
            "terminationGracePeriodSeconds": 0,
        },
    }


# ------------------------------------------------------------------------------ allocated clusters


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int
    gpus_per_node: int = 8
    allocation: float = 0.5  # mean share of each GPU's TFLOPS and VRAM held by bound pods
    spread: float = 0.08  # per-GPU allocation is uniform in allocation +- spread
    two_pod_share: float = 0.25  # share of GPUs whose allocation is split over two pods
    seed: int = 6
    models: tuple[GPUSpec, ...] = (H100,)


def cluster_objects(spec: ClusterSpec) -> Iterator[tuple[str, dict[str, Any]]]:
    """("node"|"gpu"|"pod", object) for a cluster whose GPUs are ``allocation`` full with bound pods.

    A generator so that a 50,000-pod cluster never sits in memory twice (the RSS probe relies on it).
    Every GPU carries one bound pod (every ``1/two_pod_share``-th GPU two), sized so the GPU's TFLOPS
    and VRAM are used by ``allocation`` +- ``spread``: 8 GPUs per node give 10 bound pods per node.
    """
    rng = random.Random(spec.seed)
    pod_no = 0
    split_every = round(1 / spec.two_pod_share) if spec.two_pod_share > 0 else 0
    for i in range(spec.nodes):
        node = node_name(i)
        yield "node", node_object(node, spec.gpus_per_node)
        for j in range(spec.gpus_per_node):
            k = i * spec.gpus_per_node + j
            model = spec.models[k % len(spec.models)]
            gname = gpu_name(node, j)
            yield "gpu", gpu_object(gname, node, model, j)
            share = rng.uniform(spec.allocation - spec.spread, spec.allocation + spec.spread)
            # whole 0.5 % steps: few distinct requests, so the fixture's parse cache hits
            share = min(0.99, max(0.0, round(share * 200) / 200))
            parts = 2 if split_every and k % split_every == 0 else 1
            if share <= 0:
                continue
            tflops = Fraction(round(model.tflops * share / parts * 1000), 1000)
            vram = int(model.vram_gi * GI * share / parts) // (1 << 20) << 20  # whole MiB
            ann = canonical_annotations(tflops, vram, 1)
            for _ in range(parts):
                pod_no += 1
                yield "pod", gpu_pod(f"bound-{pod_no}", ann, index=(pod_no - 1) % 128 + 1,
                                     node=node, gpu_ids=(gname,), phase="Running")


def pending_pod(shape: PodShape = POD_SHAPES[1], name: str = "pending-0", index: int = 1,
                model: str | None = None) -> dict[str, Any]:
    ann = canonical_annotations(shape.tflops, shape.vram_gi * GI, shape.gpus, model=model)
    return gpu_pod(name, ann, index=index)


def extender_args(pod: dict[str, Any], node_names: list[str]) -> bytes:
    """An ExtenderArgs body as a node-cache-capable kube-scheduler sends it."""
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": node_names}).encode()

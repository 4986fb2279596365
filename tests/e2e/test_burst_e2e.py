"""A burst of 300 GPU pods into a cluster with exactly enough GPU capacity for them, through the webhook,
the real scheduler and the extender: every pod is placed and no GPU is over its capacity, checked from the
pods as stored in the API server. The same burst survives the extender being killed midway."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from kubernetes import client

from tests import harness as cpl

pytestmark = pytest.mark.e2e

NODES, GPUS_PER_NODE, PODS = 10, 2, 300
GPU_TFLOPS, GPU_VRAM_GI = 150, 150
POD_TFLOPS, POD_VRAM_GI = 10, 10  # 15 pods fill a GPU: 20 GPUs hold exactly 300 pods


def _burst(api_client, namespace: str, pool: str) -> list[str]:
    names = [f"burst-{i:03d}" for i in range(PODS)]

    def create(name: str) -> None:
        cpl.create_pod(api_client, namespace, cpl.gpu_pod_body(
            name, pool=pool, tflops=str(POD_TFLOPS), vram=f"{POD_VRAM_GI}Gi"))

    with ThreadPoolExecutor(max_workers=8) as pool_:
        list(pool_.map(create, names))
    return names


def _bound_count(core: client.CoreV1Api, namespace: str) -> int:
    return sum(1 for p in core.list_namespaced_pod(namespace).items if p.spec.node_name)


def _failing_on_dead_extender(api_client, core: client.CoreV1Api, namespace: str) -> bool:
    for p in core.list_namespaced_pod(namespace).items:
        if not p.spec.node_name:
            message = cpl.scheduling_failure(api_client, namespace, p.metadata.name) or ""
            if "connection refused" in message:
                return True
    return False


def _check_placements(core: client.CoreV1Api, namespace: str, gpus: dict[str, str]) -> None:
    pods = core.list_namespaced_pod(namespace).items
    assert len(pods) == PODS
    unbound = [p.metadata.name for p in pods if not p.spec.node_name]
    assert not unbound, f"{len(unbound)} pods not placed, e.g. {unbound[:5]}"
    holders: Counter[str] = Counter()
    for p in pods:
        ids = cpl.gpu_ids_of(p)
        assert len(ids) == 1, (p.metadata.name, ids)
        assert gpus[ids[0]] == p.spec.node_name, (p.metadata.name, ids, p.spec.node_name)
        ann = p.metadata.annotations
        assert (ann["tensor-fusion.ai/tflops-request"], ann["tensor-fusion.ai/vram-request"]) == (
            str(POD_TFLOPS), f"{POD_VRAM_GI}Gi")
        holders[ids[0]] += 1
    over = {g: n * POD_TFLOPS for g, n in holders.items() if n * POD_TFLOPS > GPU_TFLOPS}
    assert not over, f"GPUs over their {GPU_TFLOPS} TFLOPS / {GPU_VRAM_GI}Gi capacity: {over}"
    # exactly enough capacity: every GPU ends up full
    assert sorted(holders) == sorted(gpus) and set(holders.values()) == {GPU_TFLOPS // POD_TFLOPS}


def make_exact_capacity(pool: str, prefix: str, make_node, make_gpu, extender) -> dict[str, str]:
    """NODES nodes of GPUS_PER_NODE GPUs in ``pool``, known to the extender; GPU name -> node."""
    group = uuid.uuid4().hex[:6]
    gpus: dict[str, str] = {}
    for n in range(NODES):
        node = f"{prefix}-{group}-{n}"
        for i in range(GPUS_PER_NODE):
            make_gpu(f"{node}-gpu-{i}", node, pool=pool, index=i, tflops=str(GPU_TFLOPS),
                     vram=f"{GPU_VRAM_GI}Gi")
            gpus[f"{node}-gpu-{i}"] = node
        make_node(node)
    for node in set(gpus.values()):
        extender.wait_node_allocated(node, 0)
    return gpus


@pytest.mark.parametrize("crash", [False, True], ids=["steady", "extender-killed-midway"])
def test_burst_fills_exact_capacity_without_overcommit(api_client, gpu_cluster, extender, namespace,
                                                       make_pool, make_node, make_gpu, crash):
    pool = make_pool()
    gpus = make_exact_capacity(pool, "burst", make_node, make_gpu, extender)
    core = client.CoreV1Api(api_client)

    started, placed_at_crash = time.monotonic(), 0
    with ThreadPoolExecutor(max_workers=1) as background:
        creating = background.submit(_burst, api_client, namespace, pool)
        if crash:  # while pods are still being created and placed
            cpl.wait_until(lambda: _bound_count(core, namespace) >= PODS // 3, 180, interval=0.2,
                           what=f"{PODS // 3} pods placed before the crash")
            extender.kill()
            placed_at_crash = _bound_count(core, namespace)
            creating.result()
            assert placed_at_crash < PODS, "the burst was over before the crash"
            # the scheduler notices: pods fail on the unreachable extender
            cpl.wait_until(lambda: _failing_on_dead_extender(api_client, core, namespace), 60, interval=0.5,
                           what="a pod failing on the dead extender")
            extender.restart()
        creating.result()
    cpl.wait_until(lambda: _bound_count(core, namespace) == PODS, 300, interval=1,
                   what=f"all {PODS} pods placed")
    print(f"{PODS} pods placed in {time.monotonic() - started:.1f}s"
          + (f", {placed_at_crash} of them before the extender was killed" if crash else ""))
    _check_placements(core, namespace, gpus)

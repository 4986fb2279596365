"""The same fractional pods submitted at once and one by one end in the same packing, through the webhook,
the real kube-scheduler and the extender, for each placement mode.

A burst is where a scheduler that places a pod before it has counted the one before it over-packs a GPU
or spreads where it should pack (KAI-Scheduler#2153: 16 half-GPU pods submitted at once over-packed a card
that one-by-one submission packed correctly). Each mode gets two pools of identical nodes; the burst goes to
one, the trickle (each pod created once the one before is bound) to the other, in the same order.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter

import pytest
from kubernetes import client

from tests import harness as cpl

pytestmark = pytest.mark.e2e

NODES, GPUS_PER_NODE = 4, 2
CAP = {"tflops": "100", "vram": "100Gi"}  # a pod of x TFLOPS and x Gi uses x% of a GPU
# several sizes, half-GPU pods among them; 400% in all on 800% of GPUs, so packing and spreading differ
SIZES = (50, 25, 10, 40, 50, 15, 35, 50, 25, 20, 50, 30)


def make_nodes(make_node, make_gpu, extender, pool: str) -> dict[str, str]:
    prefix = f"bt-{uuid.uuid4().hex[:6]}"
    gpus: dict[str, str] = {}
    for n in range(NODES):
        node = f"{prefix}-{n}"
        for i in range(GPUS_PER_NODE):
            make_gpu(f"{node}-gpu-{i}", node, pool=pool, index=i, **CAP)
            gpus[f"{node}-gpu-{i}"] = node
        make_node(node)
    for node in set(gpus.values()):
        extender.wait_node_allocated(node, 0)
    return gpus


def submit(api_client, namespace: str, pool: str, trickle: bool) -> list[str]:
    names = []
    for i, size in enumerate(SIZES):
        name = f"{'trickle' if trickle else 'burst'}-{pool[-6:]}-{i:02d}"
        cpl.create_pod(api_client, namespace, cpl.gpu_pod_body(name, pool=pool, tflops=str(size),
                                                               vram=f"{size}Gi"))
        names.append(name)
        if trickle:
            cpl.wait_for_pod_bound(api_client, namespace, name, timeout=60)
    for name in names:
        cpl.wait_for_pod_bound(api_client, namespace, name, timeout=120)
    return names


def packing(api_client, namespace: str, names: list[str], gpus: dict[str, str]) -> dict[str, object]:
    """Nodes and GPUs used, and each used GPU's load, largest first; fails on a GPU over 100%."""
    core = client.CoreV1Api(api_client)
    load: Counter[str] = Counter()
    where: list[str] = []  # pod number: the GPU it got (node number-gpu-i), for a failure's message
    for name in names:
        pod = core.read_namespaced_pod(name, namespace)
        (gpu,) = cpl.gpu_ids_of(pod)
        where.append(f"{name.rsplit('-', 1)[1]}:{gpu.split('-', 2)[2]}")
        assert gpus[gpu] == pod.spec.node_name, (name, gpu, pod.spec.node_name)
        load[gpu] += int(pod.metadata.annotations["tensor-fusion.ai/tflops-request"])
    over = {g: v for g, v in load.items() if v > 100}
    assert not over, f"GPUs over capacity: {over}"
    return {"nodes": len({gpus[g] for g in load}), "gpus": len(load),
            "loads": sorted(load.values(), reverse=True), "placements": " ".join(where)}


@pytest.mark.parametrize(("mode", "expected"), [
    # packs: fewest GPUs on fewest nodes
    ("CompactFirst", {"nodes": 3, "gpus": 5}),
    # spreads over every node and GPU
    ("LowLoadFirst", {"nodes": NODES, "gpus": NODES * GPUS_PER_NODE}),
    # fewest nodes, spread over their GPUs
    ("NodeCompactGPULowLoad", {"nodes": 3, "gpus": 5}),
])
def test_a_burst_packs_as_one_by_one_submission_does(api_client, gpu_cluster, extender, namespace, make_pool,
                                                     make_node, make_gpu, mode, expected):
    results = {}
    for trickle in (True, False):
        pool = make_pool(mode)
        gpus = make_nodes(make_node, make_gpu, extender, pool)
        started = time.monotonic()
        names = submit(api_client, namespace, pool, trickle)
        results["trickle" if trickle else "burst"] = packing(api_client, namespace, names, gpus)
        print(f"{mode} {'trickle' if trickle else 'burst'}: {results['trickle' if trickle else 'burst']} "
              f"in {time.monotonic() - started:.1f}s")
    # the same node and GPU counts and the same load on each GPU used (GPU names differ between the pools)
    same = ("nodes", "gpus", "loads")
    assert {k: results["burst"][k] for k in same} == {k: results["trickle"][k] for k in same}, results
    assert {k: results["burst"][k] for k in expected} == expected

"""GPU topology through the real kube-scheduler: multi-GPU pods on one NVLink island, hard topology pods
left Pending with the reason, and a 1-GPU pod that keeps an island whole for the 4-GPU pod after it.

Each test builds one node in a pool of its own. Its GPUs are TensorFusion GPU objects whose status carries
``numaNode`` and the hypervisor's ``topology.peers`` (tier 0 within an island), as TensorFusion writes them.
GPUs have 100 TFLOPS and 100Gi, so ``x`` TFLOPS and ``x``Gi are ``x``% of one.
"""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client

from tests import harness as cpl

pytestmark = pytest.mark.e2e

CAP = {"tflops": "100", "vram": "100Gi"}


class TopologyNode:
    def __init__(self, api_client, namespace, make_node, make_gpu, extender, pool: str) -> None:
        self.api, self.namespace, self.extender, self.pool = api_client, namespace, extender, pool
        self.make_node, self.make_gpu = make_node, make_gpu
        self.name = f"topo-{uuid.uuid4().hex[:6]}"
        self.used = 0.0
        self.count = 0

    def gpu(self, i: int) -> str:
        return f"{self.name}-gpu-{i}"

    def build(self, numa: list[int], islands: list[list[int]]) -> None:
        """GPU objects with their NUMA node and NVLink islands (status first), then the Node."""
        custom = client.CustomObjectsApi(self.api)
        island_of = {i: group for group in islands for i in group}
        for i, numa_node in enumerate(numa):
            self.make_gpu(self.gpu(i), self.name, pool=self.pool, index=i, **CAP)
            peers = [{"peerGPUUUID": f"GPU-{self.gpu(j)}", "tier": 0, "linkType": "NVLink",
                      "bandwidth": 300_000_000_000} for j in island_of.get(i, []) if j != i]
            status = {"numaNode": numa_node, **({"topology": {"peers": peers}} if peers else {})}
            custom.patch_cluster_custom_object_status(cpl.TF_GROUP, cpl.TF_VERSION, "gpus", self.gpu(i),
                                                      {"status": status})
        self.make_node(self.name)
        self.count = len(numa)

    def load(self, i: int, percent: int) -> None:
        cpl.place_by_hand(self.api, self.namespace, f"load-{self.name}-{i}", self.pool, self.name,
                          [self.gpu(i)], tflops=str(percent), vram=f"{percent}Gi")
        self.used += percent

    def ready(self) -> None:
        self.extender.wait_node_allocated(self.name, self.used / self.count)

    def pod(self, name: str, percent: int, count: int, **annotations: str) -> None:
        cpl.create_pod(self.api, self.namespace, cpl.gpu_pod_body(
            name, pool=self.pool, tflops=str(percent), vram=f"{percent}Gi", gpu_count=count,
            annotations=annotations))

    def placement(self, name: str) -> tuple[str, set[str]]:
        node, ids = cpl.placement(self.api, self.namespace, name, timeout=60)
        return node, set(ids)


@pytest.fixture
def topology_node(api_client, gpu_cluster, namespace, make_node, make_gpu, extender, make_pool):
    def factory(mode: str = "NodeCompactGPULowLoad") -> TopologyNode:
        return TopologyNode(api_client, namespace, make_node, make_gpu, extender, make_pool(mode))

    return factory


ISLANDS_2x4 = ([0, 0, 0, 0, 1, 1, 1, 1], [[0, 1, 2, 3], [4, 5, 6, 7]])


def test_a_4_gpu_pod_lands_on_one_nvlink_island(topology_node):
    n = topology_node()
    n.build(*ISLANDS_2x4)
    n.load(0, 60)  # gpu-0 cannot take 50% more: island 0 has 3 GPUs left, island 1 all 4
    n.ready()
    # by load alone NodeCompactGPULowLoad would take gpu-1..gpu-4, across the two islands
    n.pod("train", 50, 4)
    assert n.placement("train") == (n.name, {n.gpu(i) for i in (4, 5, 6, 7)})
    cpl.wait_until(lambda: n.extender.metric("tf_extender_gpu_topology_placements_total", pool=n.pool,
                                             tier="0") == 1, 10, what="a tier-0 placement counted")
    events = cpl.wait_until(lambda: cpl.pod_events(n.api, n.namespace, "train", "GPUDeviceAllocated"), 30,
                            what="the bind's event")
    assert events[0].message.endswith("; GPU topology tier 0 (one NVLink group)")


def test_a_hard_topology_pod_stays_pending_and_says_why(topology_node, api_client, namespace):
    n = topology_node()
    n.build([0, 0, 1, 1], [])  # four PCIe GPUs in NUMA pairs: 4 GPUs can only be across NUMA nodes
    n.ready()
    n.pod("strict", 10, 4, **{"tensor-fusion.ai/require-gpu-topology": "true",
                              "tensor-fusion.ai/gpu-topology-max-tier": "1"})
    message = cpl.wait_until(lambda: cpl.scheduling_failure(api_client, namespace, "strict"), 60,
                             what="PodScheduled=False")
    assert "the best GPU set here is tier 2 (across NUMA nodes); the pod allows tier 1 at most" in message
    assert cpl.read_pod(api_client, namespace, "strict").spec.node_name is None
    # the same pod, soft: it runs across the NUMA nodes
    n.pod("relaxed", 10, 4)
    assert n.placement("relaxed") == (n.name, {n.gpu(i) for i in range(4)})


def test_a_1_gpu_pod_keeps_an_island_whole_for_the_4_gpu_pod_after_it(topology_node):
    n = topology_node()
    n.build(*ISLANDS_2x4)
    n.load(4, 60)  # island 1 has 3 GPUs free for a 50% share
    n.ready()
    # by load alone, the 1-GPU pod would take gpu-0 (idle, first by name) and split island 0
    n.pod("small", 50, 1)
    _, small = n.placement("small")
    assert small <= {n.gpu(i) for i in (5, 6, 7)}
    n.pod("large", 50, 4)
    assert n.placement("large") == (n.name, {n.gpu(i) for i in range(4)})


def test_hard_mode_from_the_pools_template_and_a_pods_soft_override(topology_node, api_client, namespace):
    n = topology_node()
    client.CustomObjectsApi(api_client).patch_cluster_custom_object(
        cpl.TF_GROUP, cpl.TF_VERSION, "schedulingconfigtemplates", f"{n.pool}-placement",
        {"spec": {"placement": {"gpuTopology": {"mode": "hard", "maxAllowedTier": 1}}}})
    n.build([0, 0, 1, 1], [])
    n.ready()
    n.pod("strict", 10, 4)
    message = cpl.wait_until(lambda: cpl.scheduling_failure(api_client, namespace, "strict"), 60,
                             what="PodScheduled=False")
    assert "tier 2 (across NUMA nodes); the pod allows tier 1 at most" in message
    n.pod("relaxed", 10, 4, **{"tensor-fusion.ai/require-gpu-topology": "false"})
    assert n.placement("relaxed") == (n.name, {n.gpu(i) for i in range(4)})

"""Topology where it meets the rest: GPU objects and feature-discovery nodes in the inventory, the
instance-type table, the pool setting and pod overrides, GPU choice and the hard-mode node filter."""

from __future__ import annotations

from typing import Any

import pytest

from extender.common.contract import GPURequest
from extender.scheduling.instance_topology import BUILT_IN, TableError, parse_table, tier_for
from extender.scheduling.inventory import NANO, GPUDevice, gpu_from_object, gpus_from_node_labels
from extender.scheduling.placement import Fit, Mode, Slot, choose_gpus, evaluate, tier_of
from extender.scheduling.topology import (
    Link,
    Settings,
    SettingsError,
    Source,
    Tier,
    TopologyMode,
    UnknownPolicy,
    parse_settings,
)

GIB = 1 << 30


def gpu_object(name: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"tensor-fusion.ai/gpupool": "p"}},
            "status": {"nodeSelector": {"kubernetes.io/hostname": "n1"}, "phase": "Running",
                       "capacity": {"tflops": "100", "vram": "40Gi"}, **status}}


def test_current_and_deprecated_gpu_status_forms() -> None:
    deprecated = gpu_from_object(gpu_object("gpu-a", uuid="GPU-A", numaNode=1, topology={"peers": [
        {"peerGPUUUID": "GPU-B", "tier": 0, "linkType": "NVLink", "bandwidth": 300},
        {"peerGPUUUID": "GPU-C", "tier": 2, "linkType": "PCIe"}]}))
    assert deprecated is not None
    assert deprecated.numa_node == 1
    assert deprecated.links == (Link("GPU-B", 0, 300), Link("GPU-C", 2, 0))
    current = gpu_from_object(gpu_object("gpu-b", uuid="GPU-B", numaNode=-1, nvLink={
        "peerCount": 1, "totalLinkCount": 12, "totalBandwidthMBps": 300000,
        "peers": [{"peerUUID": "GPU-A", "linkCount": 12, "linkVersion": 3, "bandwidthMBps": 300000}]}))
    assert current is not None
    assert current.numa_node is None  # -1: not on a NUMA node
    assert current.links == (Link("GPU-A", 0, 300_000 * 1_000_000),)
    both = gpu_from_object(gpu_object("gpu-c", topology={"peers": [{"peerGPUUUID": "X", "tier": 1}]},
                                      nvLink={"peers": [{"peerUUID": "Y"}]}))
    assert both is not None and both.links == (Link("X", 1, 0),)  # the hypervisor's tiers win
    bare = gpu_from_object(gpu_object("gpu-d", numaNode="0", topology={"peers": [{"tier": 0}, "junk"]}))
    assert bare is not None and (bare.numa_node, bare.links) == (None, ())


def test_feature_discovery_nodes_take_their_topology_from_the_instance_type() -> None:
    labels = {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
              "node.kubernetes.io/instance-type": "p4d.24xlarge"}
    devices = gpus_from_node_labels("n1", labels, "p", BUILT_IN)
    assert len(devices) == 8
    assert [d.numa_node for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(len(d.links) == 7 for d in devices)
    assert devices[3].dcgm_uuid == devices[3].name  # the synthetic name, as before
    other = {**labels, "node.kubernetes.io/instance-type": "m5.large"}
    unknown = gpus_from_node_labels("n1", other, "p", BUILT_IN)
    assert all(d.links == () and d.numa_node is None for d in unknown)
    partial = gpus_from_node_labels("n1", {**labels, "nvidia.com/gpu.count": "4"}, "p", BUILT_IN)
    assert all(d.links == () for d in partial)  # 4 GPUs on an 8-GPU shape: the table does not apply


@pytest.mark.parametrize(("instance", "count", "tier"), [
    ("p4d.24xlarge", 8, Tier.NVLINK),
    ("p5.48xlarge", 4, Tier.NVLINK),
    ("a2-megagpu-16g", 16, Tier.NVLINK),
    ("p3.16xlarge", 4, Tier.NVLINK),  # one fully linked quad
    ("p3.16xlarge", 8, Tier.CROSS_NUMA),  # the cube mesh is not all-to-all: 0 and 5 have no link
    ("g5.48xlarge", 4, Tier.NUMA),
    ("g5.48xlarge", 8, Tier.CROSS_NUMA),
])
def test_table_tiers(instance: str, count: int, tier: Tier) -> None:
    assert tier_for(BUILT_IN[instance], count) == tier


def test_every_built_in_entry_names_its_source() -> None:
    assert all(shape.source.startswith("https://") for shape in BUILT_IN.values())


def test_configmap_entries_parse_and_bad_ones_name_the_field() -> None:
    table = parse_table("""
custom.8gpu:
  gpus: 4
  nvlinkGroups: [[0, 1], [2, 3]]
  numa: [0, 0, 1, 1]
  source: measured with nvidia-smi topo -m
""")
    assert tier_for(table["custom.8gpu"], 2) == Tier.NVLINK
    assert tier_for(table["custom.8gpu"], 4) == Tier.CROSS_NUMA
    for text, needle in [("x: {gpus: 0}", "gpus must be 1..64"),
                         ("x: {gpus: 2, nvlinkGroups: [[0, 2]]}", "index 2 outside 0..1"),
                         ("x: {gpus: 2, numa: [0]}", "numa must list one NUMA node"),
                         ("x: {gpus: 2, nvlinkPairs: [[1, 1]]}", "two different indices"),
                         ("[1, 2]", "must map instance types"), ("x: [", "not YAML")]:
        with pytest.raises(TableError, match=needle.replace("[", r"\[")):
            parse_table(text)


def test_pool_setting_defaults_and_errors() -> None:
    assert parse_settings(None) == Settings()
    assert parse_settings({"mode": "hard", "topologySource": "numa", "maxAllowedTier": 2,
                           "unknownTopologyPolicy": "reject", "preferLeastDamage": False}) == Settings(
        TopologyMode.HARD, Source.NUMA, 2, UnknownPolicy.REJECT, False)
    assert parse_settings({"maxAllowedTier": 0}).max_tier == 1  # TensorFusion reads 0 as unset
    for raw, needle in [({"mode": "strict"}, "gpuTopology.mode='strict'"),
                        ({"maxAllowedTier": 7}, "maxAllowedTier=7"), ("x", "must be a map")]:
        with pytest.raises(SettingsError, match=needle):
            parse_settings(raw)


# ---- choice and the hard filter on a node ----

def device(i: int, numa: int | None, island: list[int] | None) -> GPUDevice:
    links = tuple(Link(f"U{j}", 0) for j in island or [] if j != i)
    return GPUDevice(f"gpu-{i}", "n1", "p", "A100", "NVIDIA", i, "Running", "tensor-fusion", "soft",
                     100 * NANO, 40 * GIB, uuid=f"U{i}", numa_node=numa, links=links)


ISLANDS = [device(i, 0 if i < 4 else 1, [0, 1, 2, 3] if i < 4 else [4, 5, 6, 7]) for i in range(8)]


def slots(devices: list[GPUDevice], busy: set[int] = frozenset()) -> tuple[Slot, ...]:  # type: ignore[assignment]
    return tuple(Slot(d, used_tflops=50 * NANO if i in busy else 0, used_vram=10 * GIB if i in busy else 0)
                 for i, d in enumerate(devices))


def req(count: int, **fields: Any) -> GPURequest:
    return GPURequest(pool="p", tflops_request=1, vram_request=GIB, gpu_count=count, **fields)


def test_a_4_gpu_pod_takes_one_island_whatever_the_placement_mode() -> None:
    node = slots(ISLANDS, busy={5})  # island 1 has a busy GPU, still fits a 1-TFLOPS share
    for mode in Mode:
        chosen = choose_gpus(node, req(4), mode)
        assert set(chosen) in ({f"gpu-{i}" for i in range(4)}, {f"gpu-{i}" for i in range(4, 8)})
        assert tier_of(node, chosen) is Tier.NVLINK
    # CompactFirst prefers the island with the busy GPU, the low-load modes the idle island
    assert choose_gpus(node, req(4), Mode.COMPACT_FIRST)[0] == "gpu-5"
    assert choose_gpus(node, req(4), Mode.LOW_LOAD_FIRST) == tuple(f"gpu-{i}" for i in range(4))


def test_without_topology_data_the_mode_order_is_unchanged() -> None:
    plain = [GPUDevice(f"gpu-{i}", "n1", "p", "A100", "NVIDIA", i, "Running", "tensor-fusion", "soft",
                       100 * NANO, 40 * GIB) for i in range(4)]
    node = slots(plain, busy={2})
    assert choose_gpus(node, req(2), Mode.COMPACT_FIRST) == ("gpu-2", "gpu-0")
    assert choose_gpus(node, req(2), Mode.LOW_LOAD_FIRST) == ("gpu-0", "gpu-1")


def test_hard_mode_rejects_a_node_naming_the_best_tier_it_offers() -> None:
    whole = req(4, isolation="shared", topology_required=True, topology_max_tier=0)
    split = slots(ISLANDS, busy={0, 4})  # 3 idle GPUs in each island: 4 idle GPUs only across islands
    verdict = evaluate(split, whole, 2, 256)
    assert verdict.fit is Fit.FAILED  # evicting the pod on gpu-0 or gpu-4 frees an island
    assert "tier 2 (across NUMA nodes)" in verdict.message and "allows tier 0 at most" in verdict.message
    assert evaluate(slots(ISLANDS), whole, 0, 256).fit is Fit.FITS
    # soft mode (the default) takes the split set rather than leave the pod pending
    assert evaluate(split, whole.model_copy(update={"topology_required": None}), 2, 256).fit is Fit.FITS
    pcie = [device(i, i // 2, None) for i in range(4)]
    verdict = evaluate(slots(pcie), whole, 0, 256)
    assert verdict.fit is Fit.UNRESOLVABLE and "tier 2 (across NUMA nodes)" in verdict.message


def test_hard_mode_from_the_pool_and_the_unknown_policy() -> None:
    plain = [GPUDevice(f"gpu-{i}", "n1", "p", "A100", "NVIDIA", i, "Running", "tensor-fusion", "soft",
                       100 * NANO, 40 * GIB) for i in range(2)]
    hard = Settings(mode=TopologyMode.HARD, max_tier=3)
    assert evaluate(slots(plain), req(2), 0, 256, topology=hard).fit is Fit.FITS  # unknown = tier 3: allowed
    verdict = evaluate(slots(plain), req(2), 0, 256, topology=Settings(mode=TopologyMode.HARD))
    assert verdict.fit is Fit.UNRESOLVABLE and "tier 3 (topology unknown)" in verdict.message
    reject = Settings(mode=TopologyMode.HARD, max_tier=3, unknown_policy=UnknownPolicy.REJECT)
    assert "unknownTopologyPolicy=reject" in evaluate(slots(plain), req(2), 0, 256, topology=reject).message
    # a pod's require-gpu-topology=false turns a hard pool soft for it
    assert evaluate(slots(plain), req(2, topology_required=False), 0, 256,
                    topology=Settings(mode=TopologyMode.HARD)).fit is Fit.FITS


def test_a_configmap_extends_the_table_and_a_broken_one_names_itself() -> None:
    from extender.scheduling.instance_topology import from_configmap

    assert from_configmap(None) == BUILT_IN
    good = {"metadata": {"namespace": "tf", "name": "topo"},
            "data": {"instance-topology.yaml": "lab.4gpu: {gpus: 4, nvlinkGroups: [[0, 1, 2, 3]]}"}}
    assert set(from_configmap(good)) == set(BUILT_IN) | {"lab.4gpu"}
    with pytest.raises(TableError, match=r"ConfigMap tf/topo: needs the key instance-topology\.yaml"):
        from_configmap({**good, "data": {}})
    with pytest.raises(TableError, match=r"ConfigMap tf/topo: lab: gpus must be 1\.\.64"):
        from_configmap({**good, "data": {"instance-topology.yaml": "lab: {gpus: 99}"}})


def test_the_cluster_rereads_feature_discovery_nodes_when_the_table_changes() -> None:
    from extender.scheduling.cluster import Cluster, Kind
    from extender.scheduling.instance_topology import table
    from extender.scheduling.requests import RequestCache

    cluster = Cluster(RequestCache())
    node = {"metadata": {"name": "n1", "labels": {
        "nvidia.com/gpu.count": "4", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
        "node.kubernetes.io/instance-type": "lab.4gpu", "tensor-fusion.ai/gpupool": "p"}}}
    cluster.apply(Kind.NODE, "ADDED", node)
    assert all(d.links == () for d in cluster.devices["n1"])
    tick = cluster.tick
    cluster.set_shapes(table(parse_table("lab.4gpu: {gpus: 4, nvlinkGroups: [[0, 1], [2, 3]]}")))
    assert cluster.tick > tick
    assert [len(d.links) for d in cluster.devices["n1"]] == [1, 1, 1, 1]
    assert tier_of(cluster.slots("n1"), ["n1-gpu-0", "n1-gpu-1"]) is Tier.NVLINK


def test_topology_overrides_are_part_of_the_request_shape() -> None:
    """Pods alike but for a topology override never share a verdict table: a hard pod's "no" on a node
    must not be the soft pod's answer."""
    from extender.scheduling.requests import shape

    soft = req(4)
    assert shape(soft) != shape(req(4, topology_required=True))
    assert shape(soft) != shape(req(4, topology_max_tier=0))
    assert shape(soft) != shape(req(4, topology_source="numa"))


def test_simulate_reports_the_tier_of_each_multi_gpu_pod() -> None:
    from extender.simulate_cmd import simulate
    from tests.unit.fixtures.simulate import CLUSTER, gpu, pod

    cluster = [o for o in CLUSTER if o["kind"] in ("GPUPool", "SchedulingConfigTemplate")]
    for i in range(4):  # node c: NVLink pairs (0,1) and (2,3), NUMA pairs
        g = gpu(f"c-{i}", "c")
        g["status"].update(uuid=f"c-{i}", numaNode=i // 2, topology={"peers": [
            {"peerGPUUUID": f"c-{i ^ 1}", "tier": 0}]})
        cluster.append(g)
    pair, four, one = pod("pair", "10"), pod("four", "10"), pod("one", "10")
    pair["metadata"]["annotations"]["tensor-fusion.ai/gpu-count"] = "2"
    four["metadata"]["annotations"]["tensor-fusion.ai/gpu-count"] = "4"
    results = {r["pod"]: r for r in simulate(cluster, [pair, four, one], None)}
    assert results["ml/pair"]["tier"] == 0 and len(results["ml/pair"]["gpus"]) == 2
    assert results["ml/four"]["tier"] == 2
    assert "tier" not in results["ml/one"]


def test_expansion_buys_an_instance_type_whose_topology_meets_a_hard_pod() -> None:
    from extender.controllers.expansion.fit import empty_copy_fits
    from extender.controllers.expansion.karpenter import NodePoolChoice, nodepool_choice

    nodepool = {"metadata": {"name": "gpu"}, "spec": {"template": {
        "metadata": {"labels": {"nvidia.com/gpu.count": "8", "tensor-fusion.ai/gpupool": "p",
                                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}},
        "spec": {"requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                   "values": ["g5.48xlarge", "p4d.24xlarge"]}]}}}}
    hard = req(8, topology_required=True, topology_max_tier=0)
    choice = nodepool_choice(None, "p", nodepool, hard)
    assert isinstance(choice, NodePoolChoice) and choice.instance_type == "p4d.24xlarge"
    assert empty_copy_fits(choice.devices, hard)
    soft = nodepool_choice(None, "p", nodepool, req(8))
    assert isinstance(soft, NodePoolChoice) and soft.instance_type is None  # Karpenter picks
    assert not empty_copy_fits(soft.devices, hard)  # no known topology: tier 3


def test_the_capacity_planner_buys_only_instance_types_whose_topology_meets_a_hard_pod() -> None:
    from fractions import Fraction

    from extender.controllers.capacity.launch_plan import _holds
    from extender.planning.catalog import DEFAULT_TYPES
    from extender.planning.offerings import Offering

    offers = {t.name: Offering(t, "on-demand", "", Fraction(1)) for t in DEFAULT_TYPES if t.gpu_count == 8}
    hard = req(8, topology_required=True, topology_max_tier=0)
    holding = sorted(n for n, o in offers.items() if _holds(o, hard, Settings()))
    assert holding == ["p4d.24xlarge", "p5.48xlarge"]
    assert all(_holds(o, req(8), Settings()) for o in offers.values())  # soft: any 8-GPU type
    numa_ok = req(4, topology_required=True, topology_max_tier=1)  # 4 A10G on one NUMA node
    assert _holds(offers["g5.48xlarge"], numa_ok, Settings())

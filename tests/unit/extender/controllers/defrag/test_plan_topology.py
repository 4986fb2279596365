"""Defragmentation never worsens a running multi-GPU worker's GPU topology tier."""

from __future__ import annotations

import datetime as dt
from typing import Any

from extender.controllers.defrag.config import parse_config
from extender.controllers.defrag.plan import defrag_actions, plan_pool, snapshot_of
from extender.plan_cmd import snapshot_inputs
from extender.scheduling.state import ClusterState
from extender.simulate_cmd import load_cluster
from tests.unit.fixtures.defrag import NOW_TEXT, TF, gpus, node, pdb, pool, worker

NOW = dt.datetime.fromisoformat(NOW_TEXT)


def with_topology(objects: list[dict[str, Any]], numa: list[int], island: list[int]) -> list[dict[str, Any]]:
    for i, gpu in enumerate(objects):
        name = gpu["metadata"]["name"]
        gpu["status"]["uuid"] = name
        gpu["status"]["numaNode"] = numa[i]
        prefix = name.rsplit("-", 1)[0]
        if i in island:
            gpu["status"]["topology"] = {"peers": [{"peerGPUUUID": f"{prefix}-{j}", "tier": 0}
                                                   for j in island if j != i]}
    return objects


def two_gpu_worker(name: str, node_name: str) -> dict[str, Any]:
    pod = worker(name, node_name, 0)
    pod["metadata"]["annotations"][TF + "gpu-count"] = "2"
    pod["metadata"]["annotations"][TF + "gpu-ids"] = f"{node_name}-gpu-0,{node_name}-gpu-1"
    return pod


def cluster(light_island: list[int]) -> list[dict[str, Any]]:
    """heavy: 4 PCIe GPUs in NUMA pairs, 3 running a small worker; light: 4 GPUs on NUMA 0 (NVLinked as
    ``light_island`` says) running one 2-GPU worker on gpu-0 and gpu-1."""
    objects: list[dict[str, Any]] = [pool(utilizationThresholdPercent=50), node("heavy"), node("light")]
    objects += with_topology(gpus("heavy"), [0, 0, 1, 1], [])
    objects += with_topology(gpus("light"), [0, 0, 0, 0], light_island)
    for i in range(3):
        objects += [worker(f"heavy-w{i}", "heavy", i), pdb(f"heavy-w{i}")]
    objects += [two_gpu_worker("pair", "light"), pdb("pair")]
    return objects


def plan_of(objects: list[dict[str, Any]]):
    state = ClusterState()
    load_cluster(state, objects)
    config = parse_config(next(o for o in objects if o["kind"] == "GPUPool"))
    return plan_pool(state, "p", config, snapshot_of(snapshot_inputs(objects, now=NOW)), NOW)


def test_a_worker_on_an_nvlink_pair_is_not_moved_to_a_numa_pair() -> None:
    plan = plan_of(cluster(light_island=[0, 1, 2, 3]))
    assert plan.moves == ()
    assert [s.node for s in plan.skips] == ["light"]
    assert "would get a worse GPU topology tier than its tier 0 (one NVLink group)" in plan.skips[0].message


def test_a_move_at_the_same_tier_goes_ahead_and_reports_the_tier() -> None:
    plan = plan_of(cluster(light_island=[]))  # on light the pair is tier 1 (one NUMA node) too
    assert [(m.pod, m.target, m.tier) for m in plan.moves] == [("ml/pair", "heavy", 1)]
    assert defrag_actions(plan)[0].as_json()["tier"] == 1

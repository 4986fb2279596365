"""A defrag plan is dry: its placement simulation runs on a what-if copy of the extender's state, so a plan
that tries workers on a node and gives the room back writes nothing to that node and leaves the
extender's ledger as it was.

Before the copy, the simulation reserved and released on the live state; a release tells the scheduler
nudger of room, and the nudger, armed by any pod the filter turned away, annotates the node
(``tensor-fusion.ai/gpu-room-seen``). This test sets up exactly that: a pending pod nothing can hold, and
a light node whose first worker fits on the fuller node and whose second does not (``no-room``).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from kubernetes import client

from tests import harness as cpl
from tests.harness import workloads as wl

from .test_defrag_e2e import (  # noqa: F401  (defrag_pool is a fixture)
    defrag_pool,
    gpu_node,
    place_on,
    run_now,
    wait_older_than,
    worker_pod,
)

pytestmark = pytest.mark.e2e

NUDGE_ANNOTATION = "tensor-fusion.ai/gpu-room-seen"


def node_record(api_client: Any, name: str) -> tuple[dict[str, str], dict[str, str], bool, list[Any]]:
    node = client.CoreV1Api(api_client).read_node(name)
    return (dict(node.metadata.annotations or {}), dict(node.metadata.labels or {}),
            bool(node.spec.unschedulable), [t.to_dict() for t in node.spec.taints or []])


def unschedulable(api_client: Any, namespace: str, name: str) -> bool:
    pod = client.CoreV1Api(api_client).read_namespaced_pod(name, namespace)
    return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in pod.status.conditions or [])


def allocated(extender: cpl.ExtenderRunner, pool: str, nodes: list[str]) -> dict[tuple[str, str], Any]:
    return {(node, resource): extender.metric("tf_extender_node_allocated_ratio", node=node, pool=pool,
                                             resource=resource)
            for node in nodes for resource in ("tflops", "vram")}


def test_a_defrag_plan_that_gives_room_back_patches_no_node_and_leaves_the_ledger(
        api_client, gpu_cluster, extender, defrag_pool, make_node, make_gpu, namespace):  # noqa: F811
    pool = defrag_pool(maxDuration="20s", utilizationThresholdPercent=50)
    heavy = gpu_node(make_node, make_gpu, pool, "heavy")
    light = gpu_node(make_node, make_gpu, pool, "light")
    # heavy: every GPU in use, room for one 30 GiB worker (on gpu-3) and no second one
    for i, vram in enumerate(("36Gi", "36Gi", "36Gi", "4Gi")):
        cpl.place_by_hand(api_client, namespace, f"load-{i}", pool, heavy, [f"{heavy}-gpu-{i}"], "10", vram)
    # light: two 30 GiB workers on two of its four GPUs (50 % in use: a candidate), PDB-covered
    place_on(api_client, namespace, light, [heavy], lambda: (
        wl.create_deployment(api_client, namespace, wl.deployment_body("pair", worker_pod(pool, vram="30Gi"),
                                                                       replicas=2)),
        wl.wait_running(api_client, namespace, "app=pair", 2)))
    wl.create_pdb(api_client, namespace, wl.pdb_body("pair", {"app": "pair"}))
    # a pod nothing can hold: the filter turns it away, which arms the nudger for any room that appears
    huge = f"huge-{uuid.uuid4().hex[:6]}"
    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body(huge, pool=pool, tflops="10", vram="60Gi"))
    cpl.wait_until(lambda: unschedulable(api_client, namespace, huge), 60,
                   what=f"pod {huge} turned away by the filter")
    extender.wait_node_allocated(heavy, 100 * (3 * 36 + 4) / (4 * 40))
    wait_older_than(api_client, namespace, 20)
    time.sleep(2)  # nudges of the set-up (if any) are written by now
    nodes_before = {n: node_record(api_client, n) for n in (heavy, light)}
    ledger_before = allocated(extender, pool, [heavy, light])

    events = run_now(api_client, pool)
    time.sleep(3)  # a nudge follows room within a second: give one the time to land

    skips = [e.message for e in events if e.reason == "DefragSkipNode"]
    # the one candidate, light, went through the simulation, which placed one worker and gave its room back
    assert len(skips) == 1 and "fits on no node" in skips[0] and "(no-room)" in skips[0], skips
    assert not [e for e in events if e.reason == "DefragPodEvicted"]
    nodes_after = {n: node_record(api_client, n) for n in (heavy, light)}
    # The set-up may nudge heavy itself (uncordoning it after a pod of an earlier module was turned away
    # gains room there); what the plan must not do is nudge it again.
    assert nodes_after[heavy][0].get(NUDGE_ANNOTATION) == nodes_before[heavy][0].get(NUDGE_ANNOTATION)
    assert nodes_after == nodes_before
    assert allocated(extender, pool, [heavy, light]) == ledger_before
    assert sorted(p.spec.node_name for p in wl.pods_of(api_client, namespace, "app=pair")) == [light, light]

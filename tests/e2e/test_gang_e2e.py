"""Gang scheduling through the real kube-scheduler, webhook and kube-controller-manager: Jobs whose pods carry
TensorFusion's gang annotations are placed all together or not at all.

Each GPU has 100 TFLOPS and 100Gi and every member asks for a whole GPU's VRAM, so a GPU holds one member.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from kubernetes import client

from tests import harness as cpl
from tests.harness import workloads as wl

pytestmark = pytest.mark.e2e

CAP = {"tflops": "100", "vram": "100Gi"}
GANG = {"tensor-fusion.ai/gang-enabled": "true"}
TFW = "tensorfusionworkloads"


def gpu_nodes(make_node: Any, make_gpu: Any, pool: str, nodes: int, gpus: int) -> list[str]:
    prefix = uuid.uuid4().hex[:6]
    names = []
    for n in range(nodes):
        name = f"{prefix}-n{n}"
        for i in range(gpus):
            make_gpu(f"{name}-gpu-{i}", name, pool=pool, index=i, **CAP)
        make_node(name)
        names.append(name)
    return names


def gang_job(api: Any, namespace: str, name: str, pool: str, members: int, **annotations: str) -> None:
    pod = cpl.gpu_pod_body("member", pool=pool, tflops="10", vram="100Gi",
                           annotations={**GANG, **{f"tensor-fusion.ai/{k.replace('_', '-')}": v
                                                   for k, v in annotations.items()}})
    wl.create_job(api, namespace, wl.job_body(name, pod, parallelism=members))


def bound(api: Any, namespace: str, job: str) -> tuple[int, int]:
    """(members bound, members there) of the Job's live pods."""
    pods = wl.pods_of(api, namespace, f"job={job}")
    return sum(1 for p in pods if p.spec.node_name), len(pods)


def wait_for(what: str, check: Any, timeout: float = 60, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def test_two_gangs_racing_for_room_for_one_place_one_whole_gang(api_client, gpu_cluster, namespace, make_node,
                                                                 make_gpu, make_pool, extender):
    pool = make_pool("NodeCompactGPULowLoad")
    for node in gpu_nodes(make_node, make_gpu, pool, nodes=2, gpus=2):  # room for 4 members: one gang
        extender.wait_node_allocated(node, 0.0)
    custom = client.CustomObjectsApi(api_client)
    for name in ("a", "b"):  # the workloads whose status.gang the extender writes
        custom.create_namespaced_custom_object(cpl.TF_GROUP, cpl.TF_VERSION, namespace, TFW, {
            "apiVersion": f"{cpl.TF_GROUP}/{cpl.TF_VERSION}", "kind": "TensorFusionWorkload",
            "metadata": {"name": name}, "spec": {}})
    gang_job(api_client, namespace, "a", pool, 4)
    gang_job(api_client, namespace, "b", pool, 4)
    deadline = time.monotonic() + 60
    seen: list[tuple[int, int]] = []
    while time.monotonic() < deadline:
        (a, _), (b, _) = bound(api_client, namespace, "a"), bound(api_client, namespace, "b")
        seen.append((a, b))
        assert not (a and b), f"both gangs got GPUs: a {a}, b {b}"
        if 4 in (a, b):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"no gang was placed whole: {seen[-5:]}")
    winner, loser = ("a", "b") if seen[-1][0] == 4 else ("b", "a")
    time.sleep(5)  # the loser stays fully Pending, not half placed
    assert bound(api_client, namespace, winner) == (4, 4)
    assert bound(api_client, namespace, loser) == (0, 4)
    pods = wl.pods_of(api_client, namespace, f"job={loser}")
    wait_for("the loser's scheduling failure naming its gang", lambda: f"gang {namespace}/{loser}" in (
        cpl.scheduling_failure(api_client, namespace, pods[0].metadata.name) or ""))


    def gang_status(name: str) -> dict[str, Any]:
        tfw = custom.get_namespaced_custom_object(cpl.TF_GROUP, cpl.TF_VERSION, namespace, TFW, name)
        return dict((tfw.get("status") or {}).get("gang") or {})

    wait_for("status.gang of both workloads", lambda: gang_status(winner).get("phase") == "Running"
             and gang_status(loser).get("phase") == "Waiting", timeout=30)
    assert gang_status(loser)["scheduledMembers"] == 0 and gang_status(winner)["scheduledMembers"] == 4

    # the winner finishes: the loser gets all the room at once
    client.BatchV1Api(api_client).delete_namespaced_job(winner, namespace, propagation_policy="Background")
    client.CoreV1Api(api_client).delete_collection_namespaced_pod(namespace, label_selector=f"job={winner}",
                                                                  grace_period_seconds=0)
    wait_for("the loser placed whole", lambda: bound(api_client, namespace, loser) == (4, 4), timeout=90)


def test_a_gang_waits_for_its_members_and_times_out_holding_nothing(
        api_client, gpu_cluster, namespace, make_node, make_gpu, make_pool, extender):
    pool = make_pool()
    gpu_nodes(make_node, make_gpu, pool, nodes=1, gpus=2)
    # four members wanted, three created: the quorum never exists
    gang_job(api_client, namespace, "short", pool, 3, enabled_replicas="4", gang_timeout="4s")
    pods = wait_for("three members", lambda: (p := wl.pods_of(api_client, namespace, "job=short"))
                    and len(p) == 3 and p)
    first = pods[0].metadata.name
    # the three are here, the fourth never comes (an earlier answer may still count fewer)
    wait_for("waiting for the fourth member", lambda: "waiting for 1 of 4 members" in (
        cpl.scheduling_failure(api_client, namespace, first) or ""))
    wait_for("GangTimedOut", lambda: cpl.pod_events(api_client, namespace, first, "GangTimedOut"), timeout=30)
    assert bound(api_client, namespace, "short") == (0, 3)
    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("other", pool=pool, tflops="10", vram="100Gi"))
    cpl.wait_for_pod_bound(api_client, namespace, "other", timeout=60)  # nothing of the pool is held


def test_a_restarted_extender_finishes_a_half_bound_gang(api_client, gpu_cluster, namespace, make_node,
                                                         make_gpu, make_pool, extender):
    pool = make_pool()
    n0, n1 = gpu_nodes(make_node, make_gpu, pool, nodes=2, gpus=2)
    writer = cpl.as_extender(api_client)
    # the half a crashed extender left bound: two members on n0, stamped as the webhook stamps them
    for i in range(2):
        body = cpl.placed_pod_body(f"half-{i}", pool, [f"{n0}-gpu-{i}"], "10", "100Gi")
        body["metadata"]["annotations"].update({
            "tensor-fusion.ai/gang-group-key": f"{namespace}/half",
            "tensor-fusion.ai/gang-desired-members": "4", "tensor-fusion.ai/gang-required-members": "4"})
        cpl.create_pod(writer, namespace, body)
        cpl.bind_pod(writer, namespace, f"half-{i}", n0)
    extender.kill()
    extender.restart()
    extender.wait_node_allocated(n0, 100.0)
    # the other half, from the same workload
    gang_job(api_client, namespace, "half", pool, 2, enabled_replicas="4")
    wait_for("the rest of the gang bound", lambda: bound(api_client, namespace, "half") == (2, 2), timeout=60)
    assert {p.spec.node_name for p in wl.pods_of(api_client, namespace, "job=half")} == {n1}


def test_a_restarted_extender_releases_a_half_bound_gang_that_cannot_finish(
        api_client, gpu_cluster, namespace, make_node, make_gpu, make_pool, extender):
    extender.ensure(gang_reserve_timeout="3s")
    pool = make_pool()
    (n0,) = gpu_nodes(make_node, make_gpu, pool, nodes=1, gpus=2)  # room for the bound half only
    writer = cpl.as_extender(api_client)
    for i in range(2):
        body = cpl.placed_pod_body(f"half-{i}", pool, [f"{n0}-gpu-{i}"], "10", "100Gi")
        body["metadata"]["annotations"].update({
            "tensor-fusion.ai/gang-group-key": f"{namespace}/half",
            "tensor-fusion.ai/gang-desired-members": "4", "tensor-fusion.ai/gang-required-members": "4"})
        cpl.create_pod(writer, namespace, body)
        cpl.bind_pod(writer, namespace, f"half-{i}", n0)
    extender.kill()
    extender.restart()
    extender.wait_node_allocated(n0, 100.0)
    gang_job(api_client, namespace, "half", pool, 2, enabled_replicas="4")
    for i in range(2):  # never left half: the bound half goes
        cpl.wait_for_pod_gone(api_client, namespace, f"half-{i}", timeout=60)
    assert bound(api_client, namespace, "half") == (0, 2)
    events = wait_for("GangReleased", lambda: cpl.object_events(  # events are posted in the background
        api_client, "Pod", "half-0", "GangReleased", namespace), timeout=30)
    assert "released: 2 of 4 members were bound" in events[0].message


def test_a_higher_priority_gang_preempts_only_what_makes_the_whole_gang_fit(
        api_client, gpu_cluster, namespace, make_node, make_gpu, make_pool, extender):
    pool = make_pool()
    for node in gpu_nodes(make_node, make_gpu, pool, nodes=2, gpus=2):
        extender.wait_node_allocated(node, 0.0)
    for i in range(2):  # two GPUs held by low-priority pods
        cpl.create_pod(api_client, namespace, cpl.gpu_pod_body(f"low-{i}", pool=pool, tflops="10",
                                                               vram="100Gi"))
        cpl.wait_for_pod_bound(api_client, namespace, f"low-{i}", timeout=60)
    gang_job(api_client, namespace, "urgent", pool, 3, qos="critical")  # three members, two free GPUs
    wait_for("the gang bound whole", lambda: bound(api_client, namespace, "urgent") == (3, 3), timeout=90)
    core = client.CoreV1Api(api_client)
    left = [p.metadata.name for p in core.list_namespaced_pod(namespace).items
            if p.metadata.name.startswith("low-") and p.metadata.deletion_timestamp is None]
    assert len(left) == 1, left  # one victim was enough: the other low-priority pod still runs
    victim = ({"low-0", "low-1"} - set(left)).pop()
    messages = [e.message for p in wl.pods_of(api_client, namespace, "job=urgent")
                for e in cpl.pod_events(api_client, namespace, p.metadata.name, "PreemptingGPUPods")]
    assert messages and all(f"{namespace}/{victim} so that the whole gang fits" in m for m in messages)

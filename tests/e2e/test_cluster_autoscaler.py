"""Scale-up and scale-down with the real Cluster Autoscaler (kwok cloud provider), kwok playing the kubelet.

One tainted GPU node group (``nvidia.com/gpu=present:NoSchedule``, min 0, max 5, one A100 80GB per node,
the index resources from the shipped node-template hints), the autoscaler with short scan and scale-down
timers (tests/harness/autoscaler.py), a plain default scheduler for native GPU pods and placeholders, and the
webhook + scheduler + extender. The scenarios run in order on the same group:

1. the practice-guide pod (native ``nvidia.com/gpu: 1``, not opted in) scales the group 0 -> 1 and, once
   deleted, back to 0;
2. an opted-in pod scales 0 -> 1 and lands through the extender;
3. with that GPU full by share, one more opted-in pod gets a placeholder, the autoscaler adds exactly one
   node, the pod lands there and the placeholder is gone;
4. with fractional pods on both nodes, the autoscaler removes neither while they run, and removes both
   after they finish.

They run only when ``TF_CLUSTER_AUTOSCALER`` names the binary (see autoscaler.py); otherwise they are
skipped and the session says so in one line.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests import harness as cpl
from tests.harness import autoscaler as ca
from tests.harness.expansion import ensure_pool

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(ca.source() is None, reason=ca.NOT_RUN)]

GROUP_LABEL = "tensor-fusion.ai/e2e-node-group"
GROUP = "gpu-a100"
GPU_LABEL = "k8s.amazonaws.com/accelerator"
GPU_TYPE = "nvidia-tesla-a100"
POOL = "pool-e2e-cluster-autoscaler"
CA_NS = "tf-e2e-cluster-autoscaler"
SCALE_TIMEOUT = 180  # the autoscaler's 30 s wait for GPU pods, scans every 5 s, kwok, a busy machine


@pytest.fixture(scope="module")
def autoscaled(cluster, webhook, api_client, extender_runner, e2e_binaries) -> Iterator[dict[str, Any]]:
    core = client.CoreV1Api(api_client)
    for ns in (CA_NS, "e2e-ca-pods"):
        try:
            core.create_namespace({"metadata": {"name": ns}})
        except ApiException as exc:
            if exc.status != 409:
                raise
    ensure_pool(api_client, POOL)
    extender_runner.ensure(expansion_delay=1)
    template = ca.gpu_template(GROUP_LABEL, GROUP, POOL, gpu_label=GPU_LABEL, gpu_type=GPU_TYPE)
    ca.write_provider_config(api_client, CA_NS, GROUP_LABEL, GPU_LABEL, GPU_TYPE, [template])
    scheduler = ca.start_default_scheduler(cluster, e2e_binaries["kube-scheduler"])
    binary = ca.binary()
    assert binary is not None
    autoscaler = ca.start_cluster_autoscaler(cluster, binary, CA_NS)
    yield {"namespace": "e2e-ca-pods", "extender": extender_runner}
    for proc in (autoscaler, scheduler):
        proc.stop()
        cluster.registry.forget(proc)
    with_group = core.list_node(label_selector=f"{GROUP_LABEL}={GROUP}").items
    for node in with_group:  # nodes the autoscaler left behind (a failed scenario)
        core.delete_node(node.metadata.name)
    client.AppsV1Api(api_client).delete_collection_namespaced_deployment("e2e-ca-pods")
    core.delete_collection_namespaced_pod("e2e-ca-pods", grace_period_seconds=0)


def group_nodes(api_client: Any) -> list[str]:
    nodes = client.CoreV1Api(api_client).list_node(label_selector=f"{GROUP_LABEL}={GROUP}").items
    return sorted(n.metadata.name for n in nodes if not n.metadata.deletion_timestamp)


def wait_for_size(api_client: Any, size: int, timeout: float = SCALE_TIMEOUT) -> tuple[list[str], float]:
    start = time.monotonic()
    cpl.wait_until(lambda: len(group_nodes(api_client)) == size, timeout, interval=1,
                   what=f"the node group at {size} nodes")
    return group_nodes(api_client), time.monotonic() - start


def opted_in(name: str, vram: str) -> dict[str, Any]:
    body = cpl.gpu_pod_body(name, pool=POOL, tflops="10", vram=vram, labels={"e2e-ca": name})
    body["spec"]["tolerations"] = [dict(ca.GPU_TOLERATION)]
    return body


def deploy(api_client: Any, namespace: str, name: str, vram: str) -> str:
    """An opted-in Deployment of one replica, as users run GPU work (the autoscaler would move its pod when
    draining a node, while a bare pod keeps its node by itself); returns its pod's name."""
    pod = opted_in(name, vram)
    client.AppsV1Api(api_client).create_namespaced_deployment(namespace, {
        "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"e2e-ca": name}},
                 "template": {"metadata": {k: pod["metadata"][k] for k in ("labels", "annotations")},
                              "spec": pod["spec"]}}})
    return str(cpl.wait_until(lambda: pod_of(api_client, namespace, name), 60,
                              what=f"the pod of Deployment {name}").metadata.name)


def pod_of(api_client: Any, namespace: str, name: str) -> Any:
    pods = client.CoreV1Api(api_client).list_namespaced_pod(namespace, label_selector=f"e2e-ca={name}").items
    live = [p for p in pods if not p.metadata.deletion_timestamp]
    return live[0] if live else None


def finish(api_client: Any, namespace: str, *names: str) -> None:
    """The workloads end: their Deployments go, and with them (garbage collector) their pods."""
    for name in names:
        client.AppsV1Api(api_client).delete_namespaced_deployment(name, namespace,
                                                                   propagation_policy="Foreground")
    cpl.wait_until(lambda: not any(client.CoreV1Api(api_client).list_namespaced_pod(
        namespace, label_selector=f"e2e-ca={name}").items for name in names), 120, what="the pods gone")


def delete(api_client: Any, namespace: str, *names: str) -> None:
    core = client.CoreV1Api(api_client)
    for name in names:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    for name in names:
        cpl.wait_for_pod_gone(api_client, namespace, name, timeout=60)


def placeholders_for(api_client: Any, pod: str) -> list[Any]:
    pods = client.CoreV1Api(api_client).list_namespaced_pod(
        cpl.PROJECT_NAMESPACE, label_selector="tensor-fusion.ai/placeholder=true").items
    return [p for p in pods if (p.metadata.annotations or {}).get("tensor-fusion.ai/placeholder-for") == pod]


def report(what: str, seconds: float) -> None:
    print(f"[cluster-autoscaler] {what}: {seconds:.0f}s")


def test_1_practice_guide_pod_scales_from_zero_and_back(autoscaled, api_client) -> None:
    ns = autoscaled["namespace"]
    assert group_nodes(api_client) == []
    pod = {"metadata": {"name": f"cuda-{uuid.uuid4().hex[:6]}"}, "spec": {
        "tolerations": [dict(ca.GPU_TOLERATION)], "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "cuda", "image": "nvidia/cuda",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    name = pod["metadata"]["name"]
    client.CoreV1Api(api_client).create_namespaced_pod(ns, pod)
    (node,), up = wait_for_size(api_client, 1)
    running = cpl.wait_for_pod_running(api_client, ns, name, timeout=SCALE_TIMEOUT)
    assert running.spec.node_name == node
    report("native GPU pod: 0 -> 1 node", up)
    delete(api_client, ns, name)
    _, down = wait_for_size(api_client, 0)
    report("native GPU pod deleted: 1 -> 0 nodes", down)


def test_2_opted_in_pod_scales_from_zero_and_lands_through_the_extender(autoscaled, api_client) -> None:
    ns = autoscaled["namespace"]
    pod = deploy(api_client, ns, "share-1", "48Gi")
    (node,), up = wait_for_size(api_client, 1)
    bound = cpl.wait_for_pod_bound(api_client, ns, pod, timeout=SCALE_TIMEOUT)
    assert bound.spec.node_name == node
    assert cpl.gpu_ids_of(bound) == [f"{node}-gpu-0"]  # placed by the extender (it wrote gpu-ids)
    report("opted-in pod: 0 -> 1 node", up)


def test_3_gpus_full_by_share_get_one_placeholder_and_exactly_one_node(autoscaled, api_client) -> None:
    ns = autoscaled["namespace"]
    (first,) = group_nodes(api_client)
    # 48 + 48 > 80 GiB: not on the first node
    pod = deploy(api_client, ns, "share-2", "48Gi")
    (placeholder,) = cpl.wait_until(lambda: placeholders_for(api_client, f"{ns}/{pod}"), 60,
                                    what="a placeholder for share-2")
    nodes, up = wait_for_size(api_client, 2)
    second = next(n for n in nodes if n != first)
    placed = cpl.wait_for_pod_bound(api_client, ns, pod, timeout=SCALE_TIMEOUT)
    assert placed.spec.node_name == second
    report("GPU full by share: placeholder -> +1 node, pod placed", up)
    cpl.wait_until(lambda: placeholders_for(api_client, f"{ns}/{pod}") == [], 60,
                   what="the placeholder gone")
    events = cpl.wait_until(lambda: cpl.pod_events(api_client, ns, pod, "NodeExpansionCompleted"), 30,
                            what="the NodeExpansionCompleted event")
    assert placeholder.metadata.name in events[0].message
    time.sleep(20)  # longer than a scan plus the scale-down delay after add: still exactly one new node
    assert len(group_nodes(api_client)) == 2


def test_4_shared_gpus_keep_their_nodes_until_the_pods_finish(autoscaled, api_client) -> None:
    ns = autoscaled["namespace"]
    nodes = group_nodes(api_client)
    assert len(nodes) == 2
    # Both GPUs are 60 % used by shares, by pods the autoscaler could move (Deployments'). Without
    # reservation pods it read nvidia.com/gpu 0 % used and drained a node within 24 s.
    watched = time.monotonic()
    while time.monotonic() - watched < 50:  # > scale-down-unneeded-time 15 s + delay after add 15 s + scans
        assert group_nodes(api_client) == nodes
        time.sleep(5)
    for name in ("share-1", "share-2"):
        assert pod_of(api_client, ns, name).status.phase == "Running"
    finish(api_client, ns, "share-1", "share-2")
    _, down = wait_for_size(api_client, 0)
    report("fractional pods finished: 2 -> 0 nodes", down)

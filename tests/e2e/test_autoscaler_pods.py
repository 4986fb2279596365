"""Our side of living with the Cluster Autoscaler, on the real control plane, without the autoscaler itself:
rejected GPU pods are Unschedulable (what the autoscaler acts on), placeholder and reservation pods have the
shape it needs, a plain default scheduler finds a placeholder unschedulable on a full GPU node and places it
on an empty copy of that node, and every helper pod goes away when it is no longer needed.

Nodes are kwok nodes described by GPU Feature Discovery labels (the extender's node-label inventory) that
advertise ``nvidia.com/gpu`` like nodes with the NVIDIA device plugin. Where the autoscaler would add a node,
the test creates it (playing the autoscaler; tests/e2e/test_cluster_autoscaler.py uses the real one).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from tests import harness as cpl
from tests.harness import autoscaler as ca
from tests.harness.expansion import ensure_pool

pytestmark = pytest.mark.e2e

PROJECT_NS = cpl.PROJECT_NAMESPACE
POOL = "pool-e2e-ca-pods"
PLACEHOLDER_SELECTOR = "tensor-fusion.ai/placeholder=true"
RESERVATION_SELECTOR = "tensor-fusion.ai/gpu-reservation=true"
GFD = {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
       "nvidia.com/gpu.memory": "81920", ca.POOL_LABEL: POOL}


@pytest.fixture(scope="module")
def default_scheduler(cluster, e2e_binaries) -> Iterator[cpl.ManagedProcess]:
    proc = ca.start_default_scheduler(cluster, e2e_binaries["kube-scheduler"])
    yield proc
    proc.stop()
    cluster.registry.forget(proc)


@pytest.fixture
def ca_cluster(gpu_cluster, api_client, extender_runner, default_scheduler) -> cpl.ExtenderRunner:
    """Webhook, extender (short expansion delay, default provisioner auto), the default scheduler, a pool."""
    ensure_pool(api_client, POOL)
    extender_runner.ensure(expansion_delay=1)
    return extender_runner


@pytest.fixture
def gpu_node(make_node) -> Callable[..., str]:
    def make(prefix: str = "ca", advertise: bool = True, discovered: bool = True) -> str:
        labels = dict(GFD) if discovered else {ca.POOL_LABEL: POOL}
        return make_node(f"{prefix}-{uuid.uuid4().hex[:6]}", labels=labels, taints=[ca.GPU_TAINT],
                         extra_allocatable={"nvidia.com/gpu": "1"} if advertise else None)
    return make


def gpu_pod(name: str, vram: str) -> dict[str, Any]:
    body = cpl.gpu_pod_body(name, pool=POOL, tflops="10", vram=vram)
    body["spec"]["tolerations"] = [dict(ca.GPU_TOLERATION)]
    return body


def helper_pods(api_client: Any, selector: str) -> list[Any]:
    return client.CoreV1Api(api_client).list_namespaced_pod(PROJECT_NS, label_selector=selector).items


def placeholders_for(api_client: Any, namespace: str, name: str) -> list[Any]:
    return [p for p in helper_pods(api_client, PLACEHOLDER_SELECTOR)
            if (p.metadata.annotations or {}).get("tensor-fusion.ai/placeholder-for") == f"{namespace}/{name}"
            and not p.metadata.deletion_timestamp]


def reservations_on(api_client: Any, node: str) -> list[Any]:
    return [p for p in helper_pods(api_client, RESERVATION_SELECTOR)
            if p.spec.node_name == node and not p.metadata.deletion_timestamp]


def wait_for_reservations(api_client: Any, node: str, gpus: list[str], timeout: float = 60) -> list[Any]:
    def exactly() -> list[Any] | None:
        pods = reservations_on(api_client, node)
        held = sorted((p.metadata.annotations or {}).get("tensor-fusion.ai/reserved-gpu") for p in pods)
        return pods if held == sorted(gpus) else None

    if not gpus:
        cpl.wait_until(lambda: reservations_on(api_client, node) == [], timeout,
                       what=f"no reservation pods on {node}")
        return []
    return cpl.wait_until(exactly, timeout, what=f"reservation pods on {node} for {gpus}")


def unschedulable(api_client: Any, namespace: str, name: str) -> Any:
    """The pod's PodScheduled=False condition once its reason is Unschedulable (what the autoscaler reads)."""
    def condition() -> Any:
        pod = client.CoreV1Api(api_client).read_namespaced_pod(name, namespace)
        for c in pod.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                return c
        return None

    return cpl.wait_until(condition, 60, what=f"{namespace}/{name} PodScheduled=False reason Unschedulable")


def bound_to(api_client: Any, namespace: str, name: str, timeout: float = 60) -> str:
    """The node the pod was bound to, from the pod or, once the pod is gone, from its Scheduled event.

    A placeholder may be deleted milliseconds after it is bound: when the new node joins, the scheduler
    retries the pending pod, which fails there for want of discovered GPUs (no longer a capacity-only
    failure), and the expander drops its placeholder on the next event it sees, the binding itself. A poll
    of the pod alone misses that window on a busy machine; the scheduler's event outlives the pod."""
    core = client.CoreV1Api(api_client)

    def node() -> str | None:
        try:
            pod = core.read_namespaced_pod(name, namespace)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
        else:
            if pod.spec.node_name:
                return str(pod.spec.node_name)
        for event in cpl.pod_events(api_client, namespace, name, "Scheduled"):
            found = re.search(rf"Successfully assigned {re.escape(namespace)}/{re.escape(name)} to (\S+)",
                              event.message or "")
            if found:
                return found.group(1)
        return None

    return cpl.wait_until(node, timeout, what=f"pod {namespace}/{name} bound (or its Scheduled event)")


def test_reservation_pods_follow_the_first_and_last_allocation_and_survive_a_restart(
        ca_cluster, api_client, namespace, gpu_node) -> None:
    node = gpu_node()
    plain = gpu_node("plain", advertise=False)  # no nvidia.com/gpu to hold: no reservation there
    core = client.CoreV1Api(api_client)
    cpl.create_pod(api_client, namespace, gpu_pod("a", "10Gi"))
    # both nodes are empty: the tie breaks by name, "ca-..." before "plain-..."
    assert cpl.wait_for_pod_bound(api_client, namespace, "a").spec.node_name == node
    (reservation,) = wait_for_reservations(api_client, node, [f"{node}-gpu-0"])
    assert reservation.spec.containers[0].resources.requests == {"nvidia.com/gpu": "1"}
    assert reservation.spec.priority_class_name == "tensor-fusion-gpu-reservation"
    assert reservation.metadata.annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    assert [(o.kind, o.name) for o in reservation.metadata.owner_references] == [("Node", node)]
    cpl.wait_until(lambda: core.read_namespaced_pod(reservation.metadata.name, PROJECT_NS).status.phase
                   == "Running", 60, what="kwok runs the reservation pod")
    assert reservations_on(api_client, plain) == []

    cpl.create_pod(api_client, namespace, gpu_pod("b", "10Gi"))
    assert cpl.wait_for_pod_bound(api_client, namespace, "b").spec.node_name == node
    wait_for_reservations(api_client, node, [f"{node}-gpu-0"])  # still one: one per GPU

    # A restart with the cluster changed meanwhile: the reservation was deleted and a stale one added.
    ca_cluster.kill()
    core.delete_namespaced_pod(reservation.metadata.name, PROJECT_NS, grace_period_seconds=0)
    stale = {"metadata": {"name": "tf-gpu-stale", "labels": {"tensor-fusion.ai/gpu-reservation": "true"},
                          "annotations": {"tensor-fusion.ai/reserved-gpu": "no-such-gpu"}},
             "spec": {"nodeName": node, "containers": [{"name": "pause", "image": "pause"}]}}
    core.create_namespaced_pod(PROJECT_NS, stale)
    ca_cluster.restart()
    wait_for_reservations(api_client, node, [f"{node}-gpu-0"])  # rebuilt from the ledger, stale one gone

    core.delete_namespaced_pod("a", namespace, grace_period_seconds=0)
    cpl.wait_for_pod_gone(api_client, namespace, "a")
    wait_for_reservations(api_client, node, [f"{node}-gpu-0"])  # b still shares the GPU
    core.delete_namespaced_pod("b", namespace, grace_period_seconds=0)
    wait_for_reservations(api_client, node, [])


def test_a_capacity_only_failure_gets_a_placeholder_that_only_an_empty_node_can_take(
        ca_cluster, api_client, namespace, gpu_node) -> None:
    core = client.CoreV1Api(api_client)
    full = gpu_node("full")
    cpl.create_pod(api_client, namespace, gpu_pod("filler", "60Gi"))
    assert cpl.wait_for_pod_bound(api_client, namespace, "filler").spec.node_name == full
    wait_for_reservations(api_client, full, [f"{full}-gpu-0"])

    pending = cpl.create_pod(api_client, namespace, gpu_pod("waiting", "60Gi"))
    unschedulable(api_client, namespace, "waiting")  # the extender's rejection, as the autoscaler reads it
    (placeholder,) = cpl.wait_until(lambda: placeholders_for(api_client, namespace, "waiting"), 60,
                                    what="a placeholder for the pending pod")
    completed = cpl.wait_until(
        lambda: cpl.pod_events(api_client, namespace, "waiting", "NodeExpansionCompleted"), 30,
        what="NodeExpansionCompleted")
    assert placeholder.metadata.name in completed[0].message

    spec = placeholder.spec
    assert spec.containers[0].resources.requests == {"nvidia.com/gpu": "1", "cpu": "10m", "memory": "16Mi"}
    assert spec.containers[0].resources.limits == {"nvidia.com/gpu": "1"}
    assert spec.node_selector == {ca.POOL_LABEL: POOL}
    assert any(t.key == "nvidia.com/gpu" and t.operator == "Exists" for t in spec.tolerations)
    assert (spec.priority_class_name, spec.priority, spec.preemption_policy) == (
        "tensor-fusion-placeholder", -10, "Never")
    assert spec.scheduler_name == "default-scheduler"
    assert [(o.kind, o.name) for o in placeholder.metadata.owner_references] == [
        ("PriorityClass", "tensor-fusion-placeholder")]
    assert placeholder.metadata.labels["tensor-fusion.ai/placeholder-for-uid"] == pending.metadata.uid

    # The default scheduler: the full node's only nvidia.com/gpu is held by the reservation pod.
    condition = unschedulable(api_client, PROJECT_NS, placeholder.metadata.name)
    assert "nvidia.com/gpu" in condition.message

    # What the autoscaler does next, played here: an empty copy of the full node joins. Its GPUs are not
    # discovered yet (no GPU Feature Discovery labels), so the pending pod cannot use it and keeps its
    # placeholder, which the default scheduler places there.
    fresh = gpu_node("fresh", discovered=False)
    assert bound_to(api_client, PROJECT_NS, placeholder.metadata.name) == fresh
    core.patch_node(fresh, {"metadata": {"labels": GFD}})  # the GPUs are discovered: the pod lands there
    assert cpl.wait_for_pod_bound(api_client, namespace, "waiting", timeout=60).spec.node_name == fresh
    cpl.wait_until(lambda: placeholders_for(api_client, namespace, "waiting") == [], 60,
                   what="the placeholder gone once its pod is placed")
    wait_for_reservations(api_client, fresh, [f"{fresh}-gpu-0"])
    assert core.read_namespaced_pod("waiting", namespace).spec.node_name == fresh


def test_the_placeholder_goes_with_its_pending_pod(ca_cluster, api_client, namespace, gpu_node) -> None:
    full = gpu_node("full")
    cpl.create_pod(api_client, namespace, gpu_pod("filler", "60Gi"))
    assert cpl.wait_for_pod_bound(api_client, namespace, "filler").spec.node_name == full
    cpl.create_pod(api_client, namespace, gpu_pod("given-up", "60Gi"))
    cpl.wait_until(lambda: placeholders_for(api_client, namespace, "given-up"), 60, what="a placeholder")
    client.CoreV1Api(api_client).delete_namespaced_pod("given-up", namespace, grace_period_seconds=0)
    cpl.wait_until(lambda: placeholders_for(api_client, namespace, "given-up") == [], 60,
                   what="the placeholder gone with its pod")

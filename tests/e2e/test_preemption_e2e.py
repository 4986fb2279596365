"""Preemption of GPU shares through the real scheduler.

kube-scheduler's own preemption cannot see GPU shares (the extender's filter is the only one that fails),
so the extender's preemptor picks the fewest lower-priority GPU pods whose release makes room, deletes them,
and the scheduler's retry places the high-priority pod on the node they left.
"""

from __future__ import annotations

import contextlib
import uuid

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests import harness as cpl

pytestmark = pytest.mark.e2e


def _exists(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        pod = core.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return pod.metadata.deletion_timestamp is None


@pytest.fixture
def gold_class(api_client):
    """A PriorityClass of the test's own: above the webhook's low and medium pods (no class: 0), below its
    high (tensor-fusion-high, 100000, also the QoS of a pod whose requests equal its limits) and critical."""
    scheduling = client.SchedulingV1Api(api_client)
    name = f"e2e-gold-{uuid.uuid4().hex[:6]}"
    scheduling.create_priority_class({"metadata": {"name": name}, "value": 5000})
    yield name
    with contextlib.suppress(ApiException):
        scheduling.delete_priority_class(name)


def _gpu_node(make_node, make_gpu, pool: str, short: str) -> str:
    name = f"{short}-{uuid.uuid4().hex[:6]}"
    make_gpu(f"{name}-gpu-0", name, pool=pool, tflops="100", vram="100Gi")
    make_node(name)
    return name


def _fill(api_client, namespace: str, node: str, prefix: str, count: int, **kw) -> list[str]:
    names = [f"{prefix}-{i}" for i in range(count)]
    for name in names:
        cpl.create_pod(api_client, namespace, cpl.gpu_pod_body(
            name, node_selector={"kubernetes.io/hostname": node}, **kw))
    for name in names:
        assert cpl.placement(api_client, namespace, name)[0] == node
    return names


def test_critical_pod_preempts_the_fewest_lower_priority_pods(api_client, gpu_cluster, extender, namespace,
                                                             make_pool, make_node, make_gpu):
    pool = make_pool()
    node = _gpu_node(make_node, make_gpu, pool, "full")
    extender.wait_node_allocated(node, 0)
    low = _fill(api_client, namespace, node, "low", 3, pool=pool, tflops="30", vram="30Gi", qos="low")
    extender.wait_node_allocated(node, 90)

    # 10 TFLOPS / 10Gi are left: the critical pod needs two of the three low pods gone
    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body(
        "vip", pool=pool, tflops="50", vram="50Gi", qos="critical"))
    placed = cpl.placement(api_client, namespace, "vip", timeout=90)
    assert placed == (node, [f"{node}-gpu-0"])

    core = client.CoreV1Api(api_client)
    survivors = [n for n in low if _exists(core, namespace, n)]
    assert len(survivors) == 1, survivors
    assert core.read_namespaced_pod("vip", namespace).spec.priority_class_name == "tensor-fusion-critical"
    preempting = cpl.pod_events(api_client, namespace, "vip", "PreemptingGPUPods")
    assert preempting and node in preempting[0].message
    cpl.wait_until(lambda: cpl.wait_for_pod_running(api_client, namespace, "vip"), 60, what="vip Running")
    extender.wait_node_allocated(node, 80)  # 30 + 50: the GPU is not over its capacity


def test_priority_class_pod_preempts_only_lower_priority_pods(api_client, gpu_cluster, extender, namespace,
                                                             make_pool, make_node, make_gpu, gold_class):
    pool = make_pool()
    cheap = _gpu_node(make_node, make_gpu, pool, "cheap")  # full of medium pods (priority 0)
    dear = _gpu_node(make_node, make_gpu, pool, "dear")  # full of critical pods: not preemptible by gold
    extender.wait_node_allocated(cheap, 0)
    extender.wait_node_allocated(dear, 0)
    medium = _fill(api_client, namespace, cheap, "medium", 2, pool=pool, tflops="50", vram="50Gi",
                   qos="medium")
    critical = _fill(api_client, namespace, dear, "critical", 2, pool=pool, tflops="50", vram="50Gi",
                     qos="critical")
    extender.wait_node_allocated(cheap, 100)
    extender.wait_node_allocated(dear, 100)

    # a pod of the same priority as the medium ones preempts nobody and waits
    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("peer", pool=pool, tflops="40", vram="40Gi",
                                                           qos="medium"))
    cpl.wait_until(lambda: cpl.scheduling_failure(api_client, namespace, "peer"), 60, what="peer Pending")
    # (and it must go before gold comes: the extender does not hold the capacity its preemption frees for
    # the preemptor, so a pending lower-priority pod could take it and cost another victim)
    core = client.CoreV1Api(api_client)
    core.delete_namespaced_pod("peer", namespace, grace_period_seconds=0)
    cpl.wait_for_pod_gone(api_client, namespace, "peer", timeout=30)
    assert [n for n in medium if _exists(core, namespace, n)] == medium

    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body(
        "gold", pool=pool, tflops="40", vram="40Gi", priority_class=gold_class))
    assert cpl.placement(api_client, namespace, "gold", timeout=90) == (cheap, [f"{cheap}-gpu-0"])

    assert [n for n in critical if _exists(core, namespace, n)] == critical
    assert len([n for n in medium if _exists(core, namespace, n)]) == 1
    extender.wait_node_allocated(cheap, 90)  # 50 + 40

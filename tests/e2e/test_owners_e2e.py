"""The webhook's workload label on pods that kube-controller-manager creates for real owners.

A Deployment's pods are created by the ReplicaSet controller (owner: a ReplicaSet the Deployment
controller made), a Job's pods by the Job controller; the webhook looks the owner up through the API.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from tests import harness as cpl
from tests.harness import workloads as wl

pytestmark = pytest.mark.e2e

TF = "tensor-fusion.ai/"


@pytest.fixture
def gpu_node(make_pool, make_node, make_gpu) -> tuple[str, str]:
    pool = make_pool()
    node = make_node()
    for i in range(2):
        make_gpu(f"{node}-gpu-{i}", node, pool=pool, tflops="100", vram="40Gi", index=i)
    return pool, node


def test_deployment_pods_carry_the_deployment_as_workload(api_client, gpu_cluster, gpu_node, namespace):
    pool, node = gpu_node
    pod = cpl.gpu_pod_body("ignored", pool=pool, tflops="10", vram="4Gi")
    wl.create_deployment(api_client, namespace, wl.deployment_body("trainer", pod, replicas=3))
    pods = wl.wait_running(api_client, namespace, "app=trainer", 3)
    for p in pods:
        owner = p.metadata.owner_references[0]
        assert (owner.kind, owner.controller) == ("ReplicaSet", True)
        assert owner.name.startswith("trainer-") and owner.name != "trainer"
        assert p.metadata.labels[TF + "workload"] == "trainer"
        assert p.metadata.labels[TF + "component"] == "worker"
        assert p.spec.scheduler_name == cpl.GPU_SCHEDULER_NAME
        assert p.spec.node_name == node
        assert cpl.gpu_ids_of(p)
    # the Deployment's status counts them: the pods are Ready as far as the controllers can tell
    apps = client.AppsV1Api(api_client)
    cpl.wait_until(
        lambda: apps.read_namespaced_deployment("trainer", namespace).status.available_replicas == 3,
        60, what="Deployment trainer available")


def test_replaced_deployment_pod_comes_back_with_the_same_workload(api_client, gpu_cluster, gpu_node,
                                                                   namespace):
    pool, node = gpu_node
    pod = cpl.gpu_pod_body("ignored", pool=pool, tflops="10", vram="4Gi")
    wl.create_deployment(api_client, namespace, wl.deployment_body("server", pod, replicas=1))
    (first,) = wl.wait_running(api_client, namespace, "app=server", 1)
    client.CoreV1Api(api_client).delete_namespaced_pod(first.metadata.name, namespace)
    cpl.wait_until(lambda: [p for p in wl.pods_of(api_client, namespace, "app=server")
                            if p.metadata.name != first.metadata.name], 60, what="a replacement pod")
    (second,) = wl.wait_running(api_client, namespace, "app=server", 1)
    assert second.metadata.name != first.metadata.name
    assert second.metadata.labels[TF + "workload"] == "server"
    assert second.spec.node_name == node


def test_job_pods_carry_the_job_as_workload(api_client, gpu_cluster, gpu_node, namespace):
    pool, node = gpu_node
    pod = cpl.gpu_pod_body("ignored", pool=pool, tflops="10", vram="4Gi")
    wl.create_job(api_client, namespace, wl.job_body("nightly-eval", pod, parallelism=2))
    pods = wl.wait_running(api_client, namespace, "job=nightly-eval", 2)
    for p in pods:
        owner = p.metadata.owner_references[0]
        assert (owner.kind, owner.name) == ("Job", "nightly-eval")
        assert p.metadata.labels[TF + "workload"] == "nightly-eval"
        assert p.spec.node_name == node


def test_deleting_a_deployment_collects_its_pods(api_client, gpu_cluster, gpu_node, namespace):
    pool, _ = gpu_node
    pod = cpl.gpu_pod_body("ignored", pool=pool, tflops="10", vram="4Gi")
    wl.create_deployment(api_client, namespace, wl.deployment_body("short-lived", pod, replicas=2))
    wl.wait_running(api_client, namespace, "app=short-lived", 2)
    client.AppsV1Api(api_client).delete_namespaced_deployment(
        "short-lived", namespace, propagation_policy="Background")
    core = client.CoreV1Api(api_client)
    cpl.wait_until(lambda: not core.list_namespaced_pod(namespace, label_selector="app=short-lived").items,
                   90, what="the garbage collector to delete the pods")

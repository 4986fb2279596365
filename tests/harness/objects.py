"""Objects the tests create and wait on: Nodes kwok plays the kubelet for, TensorFusion GPU objects, GPU pods
as a user writes them (or as the extender's bind leaves them), and waits for a pod's outcome.

There are no kubelets: kwok serves Nodes annotated ``kwok.x-k8s.io/node=fake`` (``KWOK_NODE_ANNOTATION``),
keeps them Ready, marks pods bound to them Running and finishes the deletion of their terminating pods.
"""

from __future__ import annotations

import base64
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .controlplane import as_extender
from .processes import wait_until

GPU_SCHEDULER_NAME = "tensor-fusion-scheduler"
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
INDEX_RESOURCES = [f"tensor-fusion.ai/index_{k:x}" for k in range(16)]
# see manifests/optional/karpenter-nodeoverlay.yaml for why 1024
DEFAULT_INDEX_CAPACITY = "1024"
TF_GROUP, TF_VERSION = "tensor-fusion.ai", "v1"
ENABLED_LABEL = "tensor-fusion.ai/enabled"
DEFAULT_POOL_ANNOTATION = "tensor-fusion.ai/is-default-pool"
GPU_IDS_ANNOTATION = "tensor-fusion.ai/gpu-ids"


def node_body(
    name: str,
    cpu: str = "64",
    memory: str = "256Gi",
    pods: str = "110",
    index_capacity: str = DEFAULT_INDEX_CAPACITY,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    taints: list[dict] | None = None,
    extra_allocatable: dict[str, str] | None = None,
    kwok: bool = True,
) -> dict:
    """A Node object with allocatable cpu, memory, pods and every tensor-fusion.ai/index_* resource.
    kwok=True adds the annotation that makes kwok manage it (Ready, pods Running)."""
    alloc = {"cpu": cpu, "memory": memory, "pods": pods}
    alloc.update({r: index_capacity for r in INDEX_RESOURCES})
    alloc.update(extra_allocatable or {})
    ann = dict(annotations or {})
    if kwok:
        ann[KWOK_NODE_ANNOTATION[0]] = KWOK_NODE_ANNOTATION[1]
    lbl = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    lbl.update(labels or {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": lbl, "annotations": ann},
        "spec": {"taints": taints or []},
        "status": {
            "phase": "Running",  # kwok's node-heartbeat stage selects Running + Ready nodes
            "capacity": dict(alloc),
            "allocatable": dict(alloc),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e"}],
            "addresses": [
                {"type": "InternalIP", "address": "10.1.0.1"},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "fake",
                "containerRuntimeVersion": "fake",
                "kernelVersion": "",
                "kubeProxyVersion": "",
                "machineID": "",
                "osImage": "",
                "systemUUID": "",
                "bootID": "",
            },
        },
    }


def create_node(api_client, name: str, **kw: Any):
    """Create a Node and write its status (allocatable, Ready) through the status subresource."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    body = node_body(name, **kw)
    status = body.pop("status")
    core.create_node(body)
    return core.patch_node_status(name, {"status": status})


def gpu_body(
    name: str,
    node: str,
    pool: str | None = None,
    model: str = "A100",
    vendor: str = "NVIDIA",
    tflops: str | int = "312",
    vram: str = "80Gi",
    index: int = 0,
    phase: str = "Running",
    used_by: str | None = "tensor-fusion",
    isolation_mode: str | None = None,
    labels: dict[str, str] | None = None,
) -> tuple[dict, dict]:
    lbl = dict(labels or {})
    if pool:
        lbl["tensor-fusion.ai/gpupool"] = pool
    status: dict[str, Any] = {
        "capacity": {"tflops": str(tflops), "vram": str(vram)},
        "available": {"tflops": str(tflops), "vram": str(vram)},
        "gpuModel": model,
        "vendor": vendor,
        "index": index,
        "phase": phase,
        "uuid": f"GPU-{name}",
        "message": "",
        "nodeSelector": {"kubernetes.io/hostname": node},
    }
    if used_by:
        status["usedBy"] = used_by
    if isolation_mode:
        status["isolationMode"] = isolation_mode
    return (
        {"apiVersion": f"{TF_GROUP}/{TF_VERSION}", "kind": "GPU", "metadata": {"name": name, "labels": lbl}},
        status,
    )


def create_gpu(api_client, name: str, node: str, **kw: Any) -> dict:
    """Create a TensorFusion GPU object and set its status through the status subresource."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api_client)
    body, status = gpu_body(name, node, **kw)
    custom.create_cluster_custom_object(TF_GROUP, TF_VERSION, "gpus", body)
    return custom.patch_cluster_custom_object_status(TF_GROUP, TF_VERSION, "gpus", name, {"status": status})


def create_cluster_object(api_client, plural: str, body: dict) -> dict:
    from kubernetes import client

    return client.CustomObjectsApi(api_client).create_cluster_custom_object(
        TF_GROUP, TF_VERSION, plural, body
    )


def read_pod(api_client, namespace: str, name: str):
    from kubernetes import client

    return client.CoreV1Api(api_client).read_namespaced_pod(name, namespace)


def wait_for_pod_bound(api_client, namespace: str, name: str, timeout: float = 60) -> Any:
    """Wait until spec.nodeName is set; returns the pod."""

    def bound():
        p = read_pod(api_client, namespace, name)
        return p if p.spec.node_name else None

    return wait_until(bound, timeout, what=f"pod {namespace}/{name} bound")


def wait_for_pod_running(api_client, namespace: str, name: str, timeout: float = 60) -> Any:
    def running():
        p = read_pod(api_client, namespace, name)
        return p if p.status and p.status.phase == "Running" else None

    return wait_until(running, timeout, what=f"pod {namespace}/{name} Running")


def wait_for_pod_gone(api_client, namespace: str, name: str, timeout: float = 60) -> None:
    from kubernetes.client.rest import ApiException

    def gone():
        try:
            read_pod(api_client, namespace, name)
            return False
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise

    wait_until(gone, timeout, what=f"pod {namespace}/{name} gone")


def scheduling_failure(api_client, namespace: str, name: str) -> str | None:
    """The message of the pod's PodScheduled=False condition, if any."""
    p = read_pod(api_client, namespace, name)
    for c in (p.status.conditions or []) if p.status else []:
        if c.type == "PodScheduled" and c.status == "False":
            return c.message or c.reason or ""
    return None


def pod_events(api_client, namespace: str, name: str, reason: str | None = None) -> list:
    from kubernetes import client

    evs = (
        client.CoreV1Api(api_client)
        .list_namespaced_event(
            namespace, field_selector=f"involvedObject.kind=Pod,involvedObject.name={name}"
        )
        .items
    )
    return [e for e in evs if reason is None or e.reason == reason]


def object_events(api_client: Any, kind: str, name: str, reason: str,
                  namespace: str = "default") -> list[Any]:
    """The events of one object (a cluster-scoped object's land in ``default``) with the given reason."""
    from kubernetes import client

    evs = client.CoreV1Api(api_client).list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind={kind},involvedObject.name={name}").items
    return [e for e in evs if e.reason == reason]


def bind_pod(api_client, namespace: str, name: str, node: str) -> None:
    """Post a Binding by hand (what a scheduler does)."""
    from kubernetes import client

    body = client.V1Binding(
        metadata=client.V1ObjectMeta(name=name),
        target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
    )
    # the generated client fails to deserialize the Status answer of a Binding; skip deserialization
    client.CoreV1Api(api_client).create_namespaced_binding(namespace, body, _preload_content=False)


def b64(path: Path) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode()


def which(name: str) -> str | None:
    return shutil.which(name)


def gpu_pod_body(
    name: str,
    pool: str | None = None,
    tflops: str | None = None,
    vram: str | None = None,
    gpu_count: int | None = None,
    model: str | None = None,
    vendor: str | None = None,
    isolation: str | None = None,
    qos: str | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
    priority_class: str | None = None,
) -> dict:
    """A pod as a user writes it: opted in with tensor-fusion.ai/enabled=true and GPU annotations (request =
    limit), no schedulerName: the webhook makes it canonical and hands it to the GPU scheduler."""
    ann: dict[str, str] = {}
    prefix = "tensor-fusion.ai/"
    for key, value in (
        ("gpupool", pool), ("tflops-request", tflops), ("tflops-limit", tflops), ("vram-request", vram),
        ("vram-limit", vram), ("gpu-count", gpu_count), ("gpu-model", model), ("vendor", vendor),
        ("isolation", isolation), ("qos", qos),
    ):
        if value is not None:
            ann[prefix + key] = str(value)
    ann.update(annotations or {})
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {ENABLED_LABEL: "true", **(labels or {})}, "annotations": ann},
        "spec": spec,
    }


def placed_pod_body(
    name: str, pool: str, gpu_ids: Iterable[str], tflops: str, vram: str, priority_class: str | None = None
) -> dict:
    """A GPU pod that already holds GPUs (canonical annotations with gpu-ids, as the extender's bind leaves
    them) and that no scheduler serves: the caller binds it by hand with bind_pod. It skips the webhook (not
    opted in) but carries the worker label, so the extender counts it."""
    ids = list(gpu_ids)
    p = "tensor-fusion.ai/"
    spec: dict[str, Any] = {
        "schedulerName": "e2e-manual",
        "containers": [{"name": "main", "image": "busybox"}],
        "terminationGracePeriodSeconds": 0,
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {p + "component": "worker", p + "gpupool": pool},
            "annotations": {
                p + "gpupool": pool, p + "tflops-request": tflops, p + "tflops-limit": tflops,
                p + "vram-request": vram, p + "vram-limit": vram, p + "gpu-count": str(len(ids)),
                p + "isolation": "soft", p + "qos": "medium", GPU_IDS_ANNOTATION: ",".join(ids),
            },
        },
        "spec": spec,
    }


def wait_for_webhook_pool(api_client, pool: str, timeout: float = 30) -> None:
    """Until the webhook admits a pod of ``pool`` (its pool cache has caught up): a dry-run create."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    body = gpu_pod_body("pool-probe", pool=pool, tflops="1", vram="1Gi")
    wait_until(
        lambda: core.create_namespaced_pod("default", body, dry_run="All"),
        timeout,
        interval=0.1,
        what=f"the webhook to know GPUPool {pool}",
    )


def gpu_ids_of(pod: Any) -> list[str]:
    """The GPUs the extender committed into a pod (V1Pod or dict)."""
    ann = pod.metadata.annotations if hasattr(pod, "metadata") else pod["metadata"].get("annotations")
    raw = (ann or {}).get(GPU_IDS_ANNOTATION) or ""
    return [g for g in raw.split(",") if g]


def create_pod(api_client, namespace: str, body: dict) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api_client).create_namespaced_pod(namespace, body)


def placement(api_client, namespace: str, name: str, timeout: float = 60) -> tuple[str, list[str]]:
    """Wait until the pod is bound; returns (node, GPUs from its gpu-ids annotation)."""
    pod = wait_for_pod_bound(api_client, namespace, name, timeout)
    return pod.spec.node_name, gpu_ids_of(pod)


def place_by_hand(
    api_client, namespace: str, name: str, pool: str, node: str, gpus: Iterable[str], tflops: str, vram: str,
    priority_class: str | None = None,
) -> None:
    """Pre-existing load: a pod holding ``tflops``/``vram`` on each of ``gpus``, bound to ``node`` by hand."""
    writer = as_extender(api_client)  # only the extender may write allocations
    create_pod(writer, namespace, placed_pod_body(name, pool, gpus, tflops, vram, priority_class))
    bind_pod(writer, namespace, name, node)

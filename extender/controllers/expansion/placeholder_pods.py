"""Shapes of the pods the extender creates for the Cluster Autoscaler (pure).

- A **placeholder pod** asks the Cluster Autoscaler for a node on behalf of a GPU pod that fails only for
  lack of GPU capacity. The Cluster Autoscaler simulates scheduling with the in-tree plugins only and never
  calls the extender, so the pending pod itself (it requests ``tensor-fusion.ai/index_*``, not
  ``nvidia.com/gpu``) looks schedulable to it wherever cpu and memory are free. The placeholder requests what
  the in-tree plugins can see: whole ``nvidia.com/gpu`` for the pod's gpu-count plus the pod's cpu and memory,
  with the pod's tolerations, nodeSelector and required affinity, at the lowest priority the Cluster
  Autoscaler still scales up for.
- A **reservation pod** holds ``nvidia.com/gpu: 1`` on a node for one GPU that GPU pods share, so that the
  Cluster Autoscaler's utilisation and scale-up simulation count that GPU as used.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from extender.common.contract import POOL_LABEL, GPURequest
from extender.common.labels import (
    APP_MANAGED_BY,
    NVIDIA_GPU,
    PLACEHOLDER_FOR,
    PLACEHOLDER_FOR_UID,
    PLACEHOLDER_LABEL,
    PLACEHOLDER_TEMPLATE,
    RESERVATION_LABEL,
    RESERVED_GPU,
    SAFE_TO_EVICT,
)
from extender.common.quantity import Format, QuantityError, format_quantity, parse_quantity

COMPONENT = "tensor-fusion-extender"



MAX_NAME = 63


def _requests(container: Mapping[str, Any]) -> dict[str, Fraction]:
    out: dict[str, Fraction] = {}
    resources = container.get("resources") or {}
    # Like the scheduler: a limit without a request stands for the request.
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    for name in ("cpu", "memory"):
        raw = merged.get(name)
        if raw is None:
            continue
        try:
            out[name] = parse_quantity(str(raw)).value
        except QuantityError:
            continue
    return out


def pod_cpu_memory(pod: Mapping[str, Any]) -> tuple[Fraction, Fraction]:
    """What the scheduler counts for the pod: the larger of its containers' sum and its biggest init
    container, plus the pod overhead (cpu in cores, memory in bytes)."""
    spec = pod.get("spec") or {}
    totals = {"cpu": Fraction(0), "memory": Fraction(0)}
    for container in spec.get("containers") or []:
        for name, value in _requests(container).items():
            totals[name] += value
    for container in spec.get("initContainers") or []:
        for name, value in _requests(container).items():
            totals[name] = max(totals[name], value)
    for name, raw in (spec.get("overhead") or {}).items():
        if name in totals:
            try:
                totals[name] += parse_quantity(str(raw)).value
            except QuantityError:
                continue
    return totals["cpu"], totals["memory"]


def required_affinity(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod's required (not preferred) affinity terms; pod (anti-)affinity terms keep meaning the pod's
    own namespace although the placeholder lives elsewhere."""
    affinity = (pod.get("spec") or {}).get("affinity") or {}
    namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
    out: dict[str, Any] = {}
    node_required = (affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if node_required:
        out["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": node_required}
    for kind in ("podAffinity", "podAntiAffinity"):
        terms = (affinity.get(kind) or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or []
        if terms:
            pinned = [t if t.get("namespaces") or t.get("namespaceSelector") is not None
                      else {**t, "namespaces": [namespace]} for t in terms]
            out[kind] = {"requiredDuringSchedulingIgnoredDuringExecution": pinned}
    return out


def constraints_key(pod: Mapping[str, Any], pool: str) -> str:
    """Pods with equal keys accept the same nodes (so one may ride on the other's placeholder)."""
    spec = pod.get("spec") or {}
    return json.dumps([pool, spec.get("nodeSelector") or {}, required_affinity(pod),
                       spec.get("tolerations") or []], sort_keys=True)


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _base_pod(name: str, namespace: str, image: str, priority_class: str,
              labels: Mapping[str, str], annotations: Mapping[str, str],
              resources: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {APP_MANAGED_BY: COMPONENT, **labels}, "annotations": dict(annotations)},
        "spec": {
            "priorityClassName": priority_class,
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "containers": [{"name": "pause", "image": image, "resources": dict(resources)}],
        },
    }


def placeholder_name(pod_uid: str) -> str:
    return f"tf-placeholder-{_short_hash(pod_uid)}"


def placeholder_body(pod: Mapping[str, Any], request: GPURequest, *, namespace: str, image: str,
                     scheduler_name: str, priority_class: str, template_node: str,
                     template_labels: Mapping[str, str], owner: Mapping[str, Any] | None) -> dict[str, Any]:
    """The placeholder for ``pod``: whole GPUs for its gpu-count, its cpu and memory, its constraints.

    ``owner`` (an object with apiVersion, kind, metadata.name and uid, cluster scoped or in ``namespace``)
    becomes the owner reference, so the garbage collector removes placeholders with it.
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    uid = str(meta.get("uid") or "")
    cpu, memory = pod_cpu_memory(pod)
    requests: dict[str, str] = {}
    if cpu:
        requests["cpu"] = format_quantity(cpu)
    if memory:
        requests["memory"] = format_quantity(math.ceil(memory), Format.BINARY_SI)
    gpus = str(request.gpu_count)
    node_selector = dict(spec.get("nodeSelector") or {})
    if template_labels.get(POOL_LABEL) == request.pool:
        node_selector.setdefault(POOL_LABEL, request.pool)  # nodes of another GPU pool would not help
    body = _base_pod(
        placeholder_name(uid), namespace, image, priority_class,
        {PLACEHOLDER_LABEL: "true", PLACEHOLDER_FOR_UID: uid},
        {PLACEHOLDER_FOR: f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}",
         PLACEHOLDER_TEMPLATE: template_node, SAFE_TO_EVICT: "true"},
        {"requests": {**requests, NVIDIA_GPU: gpus}, "limits": {NVIDIA_GPU: gpus}},
    )
    body["spec"].update({"schedulerName": scheduler_name, "preemptionPolicy": "Never"})
    if node_selector:
        body["spec"]["nodeSelector"] = node_selector
    if spec.get("tolerations"):
        body["spec"]["tolerations"] = list(spec["tolerations"])
    affinity = required_affinity(pod)
    if affinity:
        body["spec"]["affinity"] = affinity
    if owner is not None:
        body["metadata"]["ownerReferences"] = [owner_reference(owner)]
    return body


def owner_reference(owner: Mapping[str, Any], controller: bool = False) -> dict[str, Any]:
    meta = owner.get("metadata") or {}
    return {"apiVersion": owner.get("apiVersion") or "v1", "kind": owner.get("kind") or "",
            "name": meta.get("name") or "", "uid": meta.get("uid") or "",
            "controller": controller, "blockOwnerDeletion": False}


def reservation_name(gpu: str) -> str:
    """A stable, valid pod name per GPU (so that two extenders, or a restart, agree on it)."""
    readable = re.sub(r"[^a-z0-9-]+", "-", gpu.lower()).strip("-")[:36].strip("-") or "gpu"
    return f"tf-gpu-{readable}-{_short_hash(gpu)}"


def reservation_body(gpu: str, node: Mapping[str, Any], *, namespace: str, image: str,
                     priority_class: str) -> dict[str, Any]:
    """A pod bound to ``node`` (no scheduler involved) that holds ``nvidia.com/gpu: 1`` for ``gpu``. Owned by
    the node, so it goes with it; ``safe-to-evict: false`` keeps the Cluster Autoscaler from draining a
    node whose GPUs are shared."""
    node_name = str((node.get("metadata") or {}).get("name") or "")
    body = _base_pod(
        reservation_name(gpu), namespace, image, priority_class,
        {RESERVATION_LABEL: "true"}, {RESERVED_GPU: gpu, SAFE_TO_EVICT: "false"},
        {"requests": {NVIDIA_GPU: "1"}, "limits": {NVIDIA_GPU: "1"}},
    )
    body["metadata"]["ownerReferences"] = [owner_reference({**node, "apiVersion": "v1", "kind": "Node"})]
    body["spec"].update({
        "nodeName": node_name,
        # Whatever taints the node carries (the GPU taint, cordons): the pod is bound, not scheduled.
        "tolerations": [{"operator": "Exists"}],
    })
    return body


def advertised_gpus(node: Mapping[str, Any] | None) -> int:
    """The node's allocatable ``nvidia.com/gpu`` (0 when it advertises none)."""
    allocatable = ((node or {}).get("status") or {}).get("allocatable") or {}
    try:
        return int(parse_quantity(str(allocatable.get(NVIDIA_GPU, "0"))).value)
    except QuantityError:
        return 0


def node_cpu_memory(node: Mapping[str, Any] | None) -> tuple[Fraction | None, Fraction | None]:
    allocatable = ((node or {}).get("status") or {}).get("allocatable") or {}
    out: list[Fraction | None] = []
    for name in ("cpu", "memory"):
        try:
            out.append(parse_quantity(str(allocatable[name])).value if name in allocatable else None)
        except QuantityError:
            out.append(None)
    return out[0], out[1]


def describe_requests(body: Mapping[str, Any]) -> str:
    containers: Sequence[Mapping[str, Any]] = (body.get("spec") or {}).get("containers") or []
    requests = (containers[0].get("resources") or {}).get("requests") or {} if containers else {}
    return ", ".join(f"{k}: {v}" for k, v in sorted(requests.items()))

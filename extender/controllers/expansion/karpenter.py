"""Living with the real Karpenter (pure): its own NodeClaims as capacity in flight, the NodePools a GPU pool
grows from when it has no GPU node yet, and the NodePools whose consolidation policy is GPU-blind.

Karpenter provisions for every Unschedulable pod whatever its scheduler, GPU-blind. Where it already
launched a NodeClaim for a GPU pod (its trace: a ``Nominated`` event "Pod should schedule on:
nodeclaim/NAME"), the expander must not buy a second node for the same pod: Karpenter's claims that are not
initialized yet count as in flight, with the GPUs their node will have:

- the GPU discovery labels (``nvidia.com/gpu.count``/``.product``/``.memory``) the claim carries from its
  NodePool's template, the same labels that give the registered node its GPUs in the inventory; else
- the GPUs of a registered node of the same NodePool and instance type; else
- unknown: the claim then holds only the pods Karpenter nominated to it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extender.common.contract import POOL_LABEL_ON_GPU, GPURequest
from extender.common.labels import (
    EXPANSION_INSTANCE_TYPE,
    EXPANSION_LABEL,
    EXPANSION_NODEPOOL,
    GFD_PRODUCT,
    GPU_NODE_LABEL,
    INSTANCE_TYPE,
    NODEPOOL_LABEL,
    UNREGISTERED_TAINT,
)
from extender.controllers.expansion.fit import empty_copy_fits
from extender.controllers.expansion.nodeclaim import pod_accepts_claim
from extender.scheduling import instance_topology
from extender.scheduling.inventory import GPUDevice, gpus_from_node_labels, has_gfd_labels
from extender.scheduling.placement import is_hard

NOMINATED_REASON = "Nominated"
_NOMINATED_CLAIM = re.compile(r"nodeclaim/([a-z0-9]([-a-z0-9.]*[a-z0-9])?)")

# GPUPool annotations for growing a pool that has no GPU node yet (scale from zero).

WHEN_EMPTY_OR_UNDERUTILIZED = "WhenEmptyOrUnderutilized"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _meta(obj).get("labels") or {}


def _condition(obj: Mapping[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


def is_ours(claim: Mapping[str, Any]) -> bool:
    return EXPANSION_LABEL in _labels(claim)


def still_coming(claim: Mapping[str, Any]) -> bool:
    """A claim whose node is not initialized yet (and that is not being deleted)."""
    if _meta(claim).get("deletionTimestamp"):
        return False
    return not (_condition(claim, "Initialized") or _condition(claim, "Ready"))


def nominated_claims(events: Iterable[Mapping[str, Any]]) -> list[str]:
    """The NodeClaims Karpenter's ``Nominated`` events on a pod name, the newest first."""
    found: list[tuple[str, str]] = []
    for event in events:
        if event.get("reason") != NOMINATED_REASON:
            continue
        match = _NOMINATED_CLAIM.search(str(event.get("message") or ""))
        if match:
            stamp = str(event.get("lastTimestamp") or event.get("eventTime") or
                        _meta(event).get("creationTimestamp") or "")
            found.append((stamp, match.group(1)))
    found.sort(reverse=True)
    names: list[str] = []
    for _, name in found:
        if name not in names:
            names.append(name)
    return names


def claim_devices(claim: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]],
                  node_gpus: Any) -> list[GPUDevice]:
    """The GPUs the claim's node will have (see the module doc); [] when unknown.

    ``node_gpus(name)`` gives the inventory's devices of a registered node.
    """
    name = str(_meta(claim).get("name") or "")
    labels = {str(k): str(v) for k, v in _labels(claim).items()}
    if has_gfd_labels(labels):
        return gpus_from_node_labels(name, labels, labels.get(POOL_LABEL_ON_GPU))
    nodepool, instance_type = labels.get(NODEPOOL_LABEL), labels.get(INSTANCE_TYPE)
    if not nodepool or not instance_type:
        return []
    for node in nodes:
        node_labels = _labels(node)
        if node_labels.get(NODEPOOL_LABEL) == nodepool and node_labels.get(INSTANCE_TYPE) == instance_type:
            devices = list(node_gpus(str(_meta(node).get("name") or "")))
            if devices:
                return devices
    return []




def node_usable(node: Mapping[str, Any]) -> bool:
    """A Node the scheduler can place pods on: Ready, schedulable, and registered by Karpenter (its
    ``karpenter.sh/unregistered`` taint removed). Before that a pod may be rejected once more, and must not
    be taken for one that needs another node."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable") or any(t.get("key") == UNREGISTERED_TAINT for t in spec.get("taints") or []):
        return False
    return _condition(node, "Ready")


# -- scale from zero ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodePoolChoice:
    nodepool: Mapping[str, Any]
    instance_type: str | None
    devices: tuple[GPUDevice, ...]


def template_labels(nodepool: Mapping[str, Any]) -> dict[str, str]:
    template = ((nodepool.get("spec") or {}).get("template") or {}).get("metadata") or {}
    return {str(k): str(v) for k, v in (template.get("labels") or {}).items()}


def pool_nodepools(gpupool: Mapping[str, Any] | None, pool: str,
                   nodepools: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The NodePools a GPU pool grows from: the one its annotation names, else those whose template labels
    put nodes in the pool (``tensor-fusion.ai/gpupool: <pool>``), by name."""
    annotations = _meta(gpupool).get("annotations") or {} if gpupool else {}
    named = str(annotations.get(EXPANSION_NODEPOOL) or "")
    found = [np for np in nodepools
             if (str(_meta(np).get("name")) == named if named
                 else template_labels(np).get(POOL_LABEL_ON_GPU) == pool)]
    return sorted(found, key=lambda np: str(_meta(np).get("name")))


def nodepool_admits(pod: Mapping[str, Any], nodepool: Mapping[str, Any]) -> bool:
    """Whether the pod's node selector and required node affinity allow the NodePool's nodes."""
    template_spec = ((nodepool.get("spec") or {}).get("template") or {}).get("spec") or {}
    as_claim = {"metadata": {"labels": template_labels(nodepool)},
                "spec": {"requirements": template_spec.get("requirements") or []}}
    return pod_accepts_claim(pod, as_claim)


def _instance_types(nodepool: Mapping[str, Any]) -> list[str]:
    """The instance types the NodePool's template allows by an ``In`` requirement (none: any)."""
    template = ((nodepool.get("spec") or {}).get("template") or {}).get("spec") or {}
    for requirement in template.get("requirements") or []:
        if requirement.get("key") == INSTANCE_TYPE and requirement.get("operator") == "In":
            return [str(v) for v in requirement.get("values") or []]
    return []


def _single_instance_type(nodepool: Mapping[str, Any]) -> str | None:
    values = _instance_types(nodepool)
    return values[0] if len(values) == 1 else None


def _topology_instance_type(nodepool: Mapping[str, Any], labels: Mapping[str, str], pool: str,
                            request: GPURequest) -> str | None:
    """For a hard-topology pod, the first allowed instance type (by name) whose GPUs, by the instance-type
    table, give the pod a good enough set on an empty node."""
    for instance_type in sorted(_instance_types(nodepool)):
        devices = gpus_from_node_labels("probe", {**labels, INSTANCE_TYPE: instance_type}, pool,
                                        instance_topology.BUILT_IN)
        if devices and empty_copy_fits(devices, request):
            return instance_type
    return None


def nodepool_choice(gpupool: Mapping[str, Any] | None, pool: str, nodepool: Mapping[str, Any],
                    request: GPURequest | None = None) -> NodePoolChoice | str:
    """The NodeClaim shape a from-zero claim gets in ``nodepool``, or why it cannot have one. For a pod
    that requires GPU topology (``request``), an instance type whose table topology meets it."""
    name = str(_meta(nodepool).get("name"))
    labels = template_labels(nodepool)
    if not has_gfd_labels(labels):
        return (f"NodePool {name}: its template has no GPU discovery labels (nvidia.com/gpu.count and "
                "nvidia.com/gpu.product), so the GPUs of its nodes are unknown")
    if labels.get(POOL_LABEL_ON_GPU, pool) != pool:
        return (f"NodePool {name}: its template puts nodes in GPU pool {labels[POOL_LABEL_ON_GPU]} "
                f"({POOL_LABEL_ON_GPU}), not {pool}")
    annotations = _meta(gpupool).get("annotations") or {} if gpupool else {}
    instance_type = str(annotations.get(EXPANSION_INSTANCE_TYPE) or "") or _single_instance_type(nodepool)
    if not instance_type and request is not None and is_hard(request, None):
        instance_type = _topology_instance_type(nodepool, labels, pool, request)
    if instance_type and INSTANCE_TYPE not in labels:
        labels = {**labels, INSTANCE_TYPE: instance_type}  # so the new node's GPUs get the table's topology
    devices = gpus_from_node_labels(f"{name}-new", labels, pool, instance_topology.BUILT_IN)
    if not devices:
        return f"NodePool {name}: GPU product {labels.get(GFD_PRODUCT)!r} is not a known model"
    return NodePoolChoice(nodepool, instance_type, tuple(devices))


# -- GPU-blind consolidation ------------------------------------------------------------------------------


def consolidation_policy(nodepool: Mapping[str, Any]) -> str:
    return str(((nodepool.get("spec") or {}).get("disruption") or {}).get("consolidationPolicy")
               or WHEN_EMPTY_OR_UNDERUTILIZED)  # Karpenter's default


def is_gpu_nodepool(nodepool: Mapping[str, Any], nodepools_with_gpu_nodes: Sequence[str] | set[str]) -> bool:
    labels = template_labels(nodepool)
    return (has_gfd_labels(labels) or POOL_LABEL_ON_GPU in labels or labels.get(GPU_NODE_LABEL) == "true"
            or str(_meta(nodepool).get("name")) in nodepools_with_gpu_nodes)


def consolidation_warning(nodepool: Mapping[str, Any]) -> str | None:
    """The warning for a GPU NodePool whose consolidation may delete nodes under running GPU pods."""
    policy = consolidation_policy(nodepool)
    if policy != WHEN_EMPTY_OR_UNDERUTILIZED:
        return None
    return (f"consolidationPolicy {policy} lets Karpenter delete a node under running fractional GPU pods: "
            "it sees only CPU and memory, so an evicted pod may find no GPU share free elsewhere. Use "
            "consolidationPolicy WhenEmpty for GPU NodePools, or keep karpenter.sh/do-not-disrupt on GPU "
            "pods (tf-webhook --karpenter-do-not-disrupt, on by default where Karpenter is installed)")

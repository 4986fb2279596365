"""The GPUNodeClaim and Karpenter NodeClaim of one node launched for a Karpenter-mode pool (pure).

The GPUNodeClaim is owned by the GPUPool, labelled with the pool (``tensor-fusion.ai/managed-by``,
TensorFusion's key, and ``tensor-fusion.ai/gpupool``) and annotated with the hourly price;
the NodeClaim has the same name, is owned by the GPUNodeClaim, pins the chosen instance type, capacity
type and zone, carries the pool's gpuNodeLabels (plus the pool label and GPU Feature Discovery labels,
so the extender knows the node's GPUs the moment it registers), its gpuTaints, a ``nvidia.com/gpu``
request, and ``karpenter.sh/do-not-disrupt: "true"``: we, not Karpenter, decide when it goes.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from extender.common.contract import POOL_LABEL
from extender.common.labels import (
    CAPACITY_TYPE,
    DO_NOT_DISRUPT,
    GFD_COUNT,
    GFD_MEMORY,
    GFD_PRODUCT,
    GPU_NODE_CLAIM_LABEL,
    HOURLY_PRICING,
    INSTANCE_TYPE,
    MANAGED_BY,
    NODE_PROVISIONER,
    NVIDIA_GPU,
    REGION,
    ZONE,
)
from extender.common.quantity import Format, format_quantity
from extender.kube.resources import GPU_NODE_CLAIMS, GPU_POOLS, NODECLAIMS
from extender.planning.offerings import OFFERING_KEYS, Offering
from extender.planning.pool import PoolConfig

_MIB = 1 << 20
# The phases of a GPUNodeClaim (status.phase): created, its instance asked for, its Node registered.
PENDING, CREATING, BOUND = "Pending", "Creating", "Bound"


def label_value(text: str) -> str:
    """``A100 80GB`` -> ``A100-80GB``: a valid label value that names the same GPU model."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-_.")[:63].rstrip("-_.")


def claim_name(pool: str) -> str:
    """``<pool>-<6 hex>``, a valid DNS name of at most 63 characters."""
    return f"{pool[:56].rstrip('-.')}-{secrets.token_hex(3)}"


def _owner(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True,
            "blockOwnerDeletion": True}


def price_text(price: Fraction) -> str:
    return f"{float(price):.6f}".rstrip("0").rstrip(".") or "0"


def gpunodeclaim_body(config: PoolConfig, offer: Offering, name: str) -> dict[str, Any]:
    instance = offer.instance
    capacity = instance.capacity
    spec: dict[str, Any] = {
        "instanceType": instance.name, "capacityType": offer.capacity_type,
        "gpuDeviceOffered": instance.gpu_count,
        "tflopsOffered": format_quantity(capacity.tflops, Format.DECIMAL_SI),
        "vramOffered": format_quantity(Fraction(capacity.vram), Format.BINARY_SI),
    }
    if offer.zone:
        spec["zone"] = offer.zone
    if instance.region:
        spec["region"] = instance.region
    if config.node_class is not None:
        spec["nodeClassRef"] = {**config.node_class.as_json(), "version": config.node_class.version}
    # TensorFusion ties a claim to its pool by managed-by; the gpupool label is kept for earlier releases
    metadata: dict[str, Any] = {"name": name, "labels": {MANAGED_BY: config.name, POOL_LABEL: config.name},
                                "annotations": {HOURLY_PRICING: price_text(offer.price)}}
    if config.uid:
        metadata["ownerReferences"] = [_owner(GPU_POOLS.api_version, "GPUPool", config.name, config.uid)]
    return {"apiVersion": GPU_NODE_CLAIMS.api_version, "kind": "GPUNodeClaim", "metadata": metadata,
            "spec": spec}


def _requirements(config: PoolConfig, offer: Offering) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"key": INSTANCE_TYPE, "operator": "In", "values": [offer.instance.name]},
        {"key": CAPACITY_TYPE, "operator": "In", "values": [offer.capacity_type]},
    ]
    if offer.zone:
        out.append({"key": ZONE, "operator": "In", "values": [offer.zone]})
    if offer.instance.region:
        out.append({"key": REGION, "operator": "In", "values": [offer.instance.region]})
    for requirement in config.requirements:
        if requirement.key not in OFFERING_KEYS or (requirement.key == REGION and not offer.instance.region):
            item: dict[str, Any] = {"key": requirement.key, "operator": requirement.operator}
            if requirement.values:
                item["values"] = list(requirement.values)
            out.append(item)
    return out


def nodeclaim_body(config: PoolConfig, offer: Offering, name: str, owner_uid: str) -> dict[str, Any]:
    if config.node_class is None:
        raise ValueError(f"GPUPool {config.name} has no karpenterNodeClassRef")
    instance = offer.instance
    labels: dict[str, str] = {
        **config.labels, POOL_LABEL: config.name, GPU_NODE_CLAIM_LABEL: name,
        # TensorFusion finds a Node's GPUNodeClaim by this label (its ProvisionerLabelKey)
        NODE_PROVISIONER: name,
        GFD_COUNT: str(instance.gpu_count), GFD_MEMORY: str(instance.vram_per_gpu // _MIB),
    }
    product = label_value(instance.gpu_model)
    if product:
        labels[GFD_PRODUCT] = product
    spec: dict[str, Any] = {
        "nodeClassRef": config.node_class.as_json(),
        "requirements": _requirements(config, offer),
        "resources": {"requests": {NVIDIA_GPU: str(instance.gpu_count)}},
    }
    if config.taints:
        spec["taints"] = [dict(t) for t in config.taints]
    metadata: dict[str, Any] = {
        "name": name, "labels": labels,
        "annotations": {**config.annotations, DO_NOT_DISRUPT: "true"},
        "ownerReferences": [_owner(GPU_NODE_CLAIMS.api_version, "GPUNodeClaim", name, owner_uid)],
    }
    return {"apiVersion": NODECLAIMS.api_version, "kind": "NodeClaim", "metadata": metadata, "spec": spec}


def claim_phase(gpunodeclaim: Mapping[str, Any]) -> str:
    return str((gpunodeclaim.get("status") or {}).get("phase") or PENDING)


# The kind of nodeClassRef on the GPUNodeClaims of Provisioned-mode pools (VMs through the cloud's API).
GPU_NODE_CLASS_KIND = "GPUNodeClass"


def is_provisioned_claim(claim: Mapping[str, Any]) -> bool:
    return str(((claim.get("spec") or {}).get("nodeClassRef") or {}).get("kind") or "") == GPU_NODE_CLASS_KIND

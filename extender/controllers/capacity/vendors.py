"""Which ``computingVendor`` a Provisioned pool's VMs, and a GPUNodeClaim's VM, go through (pure).

A pool that a TensorFusionCluster owns (its ownerReference, else its ``tensor-fusion.ai/managed-by`` label,
both written when the cluster derives the pool) uses that cluster's ``spec.computingVendor``, as in
TensorFusion. A pool no cluster owns, or whose cluster has no ``computingVendor``, uses the file of
``--computing-vendor`` (the fallback). A claim uses its pool's vendor while it is at the place the claim's VM
was bought (same type, region and endpoint, recorded on the claim at creation), else the recorded one: a
claim whose pool and cluster are gone (a deleted cluster takes its pools, they their claims) still
terminates its VM.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extender.cloud.vendor import Endpoint, VendorConfig, confined, parse_vendor
from extender.common.labels import COMPUTING_VENDOR, MANAGED_BY
from extender.kube.resources import TENSOR_FUSION_CLUSTERS

VendorKey = tuple[str, ...]


@dataclass(frozen=True)
class VendorChoice:
    config: VendorConfig
    source: str  # where it came from, for messages: "TensorFusionCluster x spec.computingVendor", ...

    @property
    def key(self) -> VendorKey:
        return vendor_key(self.config)


def vendor_key(config: VendorConfig) -> VendorKey:
    """One provider per distinct key: what the provider is made from (VendorConfig holds a dict)."""
    extra = json.dumps(dict(config.extra), sort_keys=True)
    return (config.type, config.auth_type, config.region, config.access_key_path, config.secret_key_path,
            extra, "; ".join(config.problems))


def same_place(a: VendorConfig, b: VendorConfig) -> bool:
    """Whether a VM bought through ``a`` is found through ``b`` (the credentials may differ)."""
    return (a.type, a.region, a.endpoint) == (b.type, b.region, b.endpoint)


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    meta = (obj or {}).get("metadata") or {}
    return meta if isinstance(meta, Mapping) else {}


def owner_cluster(pool: Mapping[str, Any]) -> str:
    """The TensorFusionCluster that owns the pool: its ownerReference, else its managed-by label."""
    for ref in _meta(pool).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("kind") == TENSOR_FUSION_CLUSTERS.kind and ref.get("name"):
            return str(ref["name"])
    return str((_meta(pool).get("labels") or {}).get(MANAGED_BY) or "")


def _problem(source: str, message: str) -> VendorChoice:
    return VendorChoice(VendorConfig("", problems=(message,)), source)


def pool_vendor(pool: Mapping[str, Any], clusters: Mapping[str, Mapping[str, Any]],
                fallback: VendorChoice | None, key_dir: str = "",
                endpoints: Sequence[Endpoint] | None = None) -> VendorChoice:
    """The vendor a pool's VMs are bought through (a choice with ``config.problems`` when there is none).
    A cluster's vendor may name key files only under ``key_dir`` ("": anywhere, for tools that read none)
    and endpoints only in ``endpoints`` (``--cloud-endpoint-allow``; None: unchecked, for tools that call no
    cloud)."""
    name = str(_meta(pool).get("name") or "")
    cluster_name = owner_cluster(pool)
    if not cluster_name:
        return fallback or _problem(
            "--computing-vendor",
            f"no computingVendor: GPUPool {name} is owned by no TensorFusionCluster and the extender runs "
            "without --computing-vendor")
    cluster = clusters.get(cluster_name)
    if cluster is None:
        return fallback or _problem(
            f"TensorFusionCluster {cluster_name}",
            f"GPUPool {name} belongs to TensorFusionCluster {cluster_name}, which does not exist, and the "
            "extender runs without --computing-vendor")
    spec = cluster.get("spec") or {}
    raw = spec.get("computingVendor") if isinstance(spec, Mapping) else None
    where = f"TensorFusionCluster {cluster_name} spec.computingVendor"
    if raw is None:
        return fallback or _problem(
            where, f"{where}: missing (and the extender runs without --computing-vendor)")
    return VendorChoice(confined(parse_vendor(raw, where), key_dir, where, endpoints), where)


def recorded_text(config: VendorConfig) -> str:
    """The annotation a claim records its vendor in: the computingVendor's own fields, no secret."""
    params: dict[str, Any] = {"defaultRegion": config.region}
    if config.access_key_path:
        params["accessKeyPath"] = config.access_key_path
    if config.secret_key_path:
        params["secretKeyPath"] = config.secret_key_path
    if config.extra:
        params["extraParams"] = dict(config.extra)
    raw: dict[str, Any] = {"type": config.type, "params": params}
    if config.auth_type:
        raw["authType"] = config.auth_type
    return json.dumps(raw, sort_keys=True, separators=(",", ":"))


def recorded_vendor(claim: Mapping[str, Any], key_dir: str = "",
                    endpoints: Sequence[Endpoint] | None = None) -> VendorChoice | None:
    """The vendor the claim's VM was bought through, when the claim records one that parses."""
    annotations = _meta(claim).get("annotations")
    text = annotations.get(COMPUTING_VENDOR) if isinstance(annotations, Mapping) else None
    if not text or not isinstance(text, str):
        return None
    where = f"GPUNodeClaim {_meta(claim).get('name')} annotation {COMPUTING_VENDOR}"
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        return None
    config = parse_vendor(raw, where)
    if config.problems:
        return None
    # an edited annotation names no other file and no other endpoint than a cluster's could
    return VendorChoice(confined(config, key_dir, where, endpoints), where)


def claim_vendor(claim: Mapping[str, Any], pool: Mapping[str, Any] | None,
                 clusters: Mapping[str, Mapping[str, Any]], fallback: VendorChoice | None,
                 key_dir: str = "", endpoints: Sequence[Endpoint] | None = None) -> VendorChoice:
    """The vendor through which the claim's VM is described and terminated: never launched (a launch goes
    through the pool's vendor, so a patched annotation cannot redirect one)."""
    recorded = recorded_vendor(claim, key_dir, endpoints)
    if pool is not None:
        current = pool_vendor(pool, clusters, fallback, key_dir, endpoints)
        if recorded is None or (not current.config.problems and same_place(current.config, recorded.config)):
            return current
        return recorded
    if recorded is not None:
        return recorded
    name = _meta(claim).get("name")
    return fallback or _problem(
        f"GPUNodeClaim {name}",
        f"GPUNodeClaim {name}: its GPUPool is gone, it records no {COMPUTING_VENDOR} and the extender runs "
        "without --computing-vendor; its VM (if any) cannot be terminated")

"""The picture of the cluster the planners read, and the per-pool figures derived from it (pure)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from extender.common.contract import POOL_LABEL
from extender.common.labels import HOURLY_PRICING, MANAGED_BY, SCHEDULING_DO_NOT_DISRUPT
from extender.common.timefmt import parse_time
from extender.planning.amounts import ZERO, Amount, CapacityError, parse_quantity_field
from extender.planning.catalog import DEFAULT_CATALOG, Catalog
from extender.planning.gaps import PoolCapacity
from extender.planning.pool import PoolConfig, pool_config
from extender.planning.removal import DEFAULT_PROTECTION_SECONDS, PoolNode
from extender.scheduling.inventory import object_name
from extender.scheduling.state import ClusterState

BOUND = "Bound"


GPUNODE_RUNNING = "Running"  # TensorFusion: TensorFusionGPUNodePhaseRunning


def _always(config: PoolConfig) -> bool:
    return True


@dataclass
class Inputs:
    now: dt.datetime
    state: ClusterState  # the live state, read only: trial placements go through state.what_if()
    pools: Sequence[Mapping[str, Any]] = ()
    nodes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # Node objects by name
    gpunodeclaims: Sequence[Mapping[str, Any]] = ()
    # GPUNode objects by name (= their node's); compaction reads a node's age and phase from its GPUNode
    gpunodes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    nodeclaims: Sequence[Mapping[str, Any]] = ()
    nodepools: Sequence[Mapping[str, Any]] = ()
    pdbs: Sequence[Mapping[str, Any]] = ()
    pods: Sequence[Mapping[str, Any]] = ()  # GPU pods, bound or pending
    node_classes: frozenset[tuple[str, str, str]] | None = None  # (group, kind, name); None: not known
    catalog: Catalog = DEFAULT_CATALOG
    protection_seconds: float = DEFAULT_PROTECTION_SECONDS
    compaction_due: Callable[[PoolConfig], bool] = _always
    leaving: frozenset[str] = frozenset()  # nodes already released, whatever the caches say yet
    # offerings (instance type, capacity type, zone) the cloud just refused for lack of capacity
    unavailable: frozenset[tuple[str, str, str]] = frozenset()

    def configs(self) -> list[PoolConfig]:
        return sorted((pool_config(p) for p in self.pools), key=lambda c: c.name)

    def pool_object(self, name: str) -> Mapping[str, Any] | None:
        return next((p for p in self.pools if object_name(p) == name), None)

    def claims_of(self, pool: str) -> list[Mapping[str, Any]]:
        """The pool's GPUNodeClaims that are not being deleted."""
        return [c for c in self.gpunodeclaims
                if claim_pool(c) == pool and not (c.get("metadata") or {}).get("deletionTimestamp")]

    def nodeclaim_of_node(self) -> dict[str, str]:
        """Node name -> the NodeClaim that launched it."""
        return {node: object_name(claim) for node, claim in self._claims_by_node().items()}

    def _claims_by_node(self) -> dict[str, Mapping[str, Any]]:
        out: dict[str, Mapping[str, Any]] = {}
        for claim in self.nodeclaims:
            node = str((claim.get("status") or {}).get("nodeName") or "")
            if node:
                out[node] = claim
        return out

    def is_leaving(self, name: str, claims_by_node: Mapping[str, Mapping[str, Any]]) -> bool:
        """Released already, being deleted, or its NodeClaim is: its capacity no longer counts."""
        node_meta = (self.nodes.get(name) or {}).get("metadata") or {}
        claim_meta = (claims_by_node.get(name) or {}).get("metadata") or {}
        return name in self.leaving or bool(node_meta.get("deletionTimestamp")) or \
            bool(claim_meta.get("deletionTimestamp"))

    def pool_nodes(self, pool: str) -> list[PoolNode]:
        """The pool's nodes: each node with GPUs of the pool, their capacity and allocation."""
        prices = {object_name(c): claim_price(c) for c in self.gpunodeclaims}
        claims_by_node = self._claims_by_node()
        claim_by_node = {node: object_name(claim) for node, claim in claims_by_node.items()}
        out = []
        for name in self.state.nodes():
            gpus = [g for g in self.state.node_gpus(name) if g.pool == pool]
            if not gpus or self.is_leaving(name, claims_by_node):
                continue
            capacity = Amount(sum((g.capacity_tflops for g in gpus), Fraction(0)),
                              sum(g.capacity_vram for g in gpus))
            used = Amount(sum((g.used_tflops for g in gpus), Fraction(0)), sum(g.used_vram for g in gpus))
            node = self.nodes.get(name) or {}
            meta = node.get("metadata") or {}
            labels = meta.get("labels") or {}
            out.append(PoolNode(
                name=name, capacity=capacity, used=used, created=self.node_age_origin(name, meta),
                pinned=str(labels.get(SCHEDULING_DO_NOT_DISRUPT, "")).lower() == "true",
                price=prices.get(claim_by_node.get(name, "")),
            ))
        return out

    def node_age_origin(self, name: str, node_meta: Mapping[str, Any]) -> dt.datetime | None:
        """When a node's protection time starts (TensorFusion: "its GPUNode is Running and older than 5
        minutes"): its GPUNode's creation, or None (never old enough) while that GPUNode is not Running.
        A node without a GPUNode (none are kept, e.g. --no-gpu-nodes) counts from the Node's creation."""
        gpunode = self.gpunodes.get(name)
        if gpunode is None:
            return parse_time(node_meta.get("creationTimestamp"))
        if (gpunode.get("status") or {}).get("phase") != GPUNODE_RUNNING:
            return None
        return parse_time((gpunode.get("metadata") or {}).get("creationTimestamp"))

    def capacity(self, pool: str, nodes: Sequence[PoolNode] | None = None) -> PoolCapacity:
        nodes = self.pool_nodes(pool) if nodes is None else nodes
        total = sum((n.capacity for n in nodes), ZERO)
        available = sum((n.capacity - n.used for n in nodes), ZERO)
        pending = sum((claim_offer(c) for c in self.claims_of(pool)
                       if (c.get("status") or {}).get("phase") != BOUND), ZERO)
        return PoolCapacity(total, available, pending)


def claim_pool(claim: Mapping[str, Any]) -> str:
    """The GPUPool a GPUNodeClaim belongs to: TensorFusion's ``tensor-fusion.ai/managed-by``, else this
    project's earlier ``tensor-fusion.ai/gpupool`` (claims made by either side count)."""
    labels = (claim.get("metadata") or {}).get("labels") or {}
    return str(labels.get(MANAGED_BY) or labels.get(POOL_LABEL) or "")


def claim_offer(claim: Mapping[str, Any]) -> Amount:
    """What a GPUNodeClaim's node will bring (``spec.tflopsOffered``, ``spec.vramOffered``)."""
    spec = claim.get("spec") or {}
    try:
        tflops = parse_quantity_field(spec.get("tflopsOffered", 0), "tflopsOffered")
        vram = parse_quantity_field(spec.get("vramOffered", 0), "vramOffered")
    except CapacityError:
        return ZERO
    return Amount(tflops, int(vram))


def claim_price(claim: Mapping[str, Any]) -> Fraction | None:
    raw = ((claim.get("metadata") or {}).get("annotations") or {}).get(HOURLY_PRICING)
    try:
        return Fraction(str(raw)) if raw is not None else None
    except (ValueError, ZeroDivisionError):
        return None

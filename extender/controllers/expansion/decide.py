"""What the expander does for one queued pod, from a snapshot of the cluster (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from extender.common.contract import POOL_LABEL_ON_GPU, GPURequest
from extender.common.labels import EXPANSION_NODEPOOL, NODEPOOL_LABEL
from extender.controllers.expansion.fit import empty_copy_fits
from extender.controllers.expansion.inflight import InFlight
from extender.controllers.expansion.karpenter import nodepool_choice, pool_nodepools
from extender.controllers.expansion.nodeclaim import (
    ClaimError,
    build_nodeclaim,
    build_nodeclaim_from_nodepool,
    pod_accepts_claim,
)
from extender.scheduling.inventory import GPUDevice

MAX_REASONS = 5


class ClusterView(Protocol):
    """The cached objects a decision reads (plain API JSON)."""

    def node(self, name: str) -> Mapping[str, Any] | None: ...

    def node_gpus(self, name: str) -> Sequence[GPUDevice]: ...

    def nodeclaims(self) -> Sequence[Mapping[str, Any]]: ...

    def nodepool(self, name: str) -> Mapping[str, Any] | None: ...

    def all_nodepools(self) -> Sequence[Mapping[str, Any]]: ...

    def gpupool(self, name: str) -> Mapping[str, Any] | None: ...


@dataclass(frozen=True)
class Skip:
    """The pod no longer needs a node."""

    reason: str


@dataclass(frozen=True)
class WaitForClaim:
    """A claim already in flight has room for the pod (``karpenter``: one Karpenter made itself)."""

    claim: str
    karpenter: bool = False


@dataclass(frozen=True)
class LeaveToKarpenter:
    message: str


@dataclass(frozen=True)
class NoTemplate:
    message: str


@dataclass(frozen=True)
class WaitForSlot:
    """A new claim is needed but ``max_in_flight`` claims are already in flight."""

    in_flight: int


@dataclass(frozen=True)
class Create:
    body: dict[str, Any]
    nodepool: str
    template_node: str  # "" for a claim made from the NodePool alone (scale from zero)
    devices: tuple[GPUDevice, ...]


Decision = Skip | WaitForClaim | LeaveToKarpenter | NoTemplate | WaitForSlot | Create


def skip_reason(pod: Mapping[str, Any] | None, uid: str) -> str | None:
    """Why a queued pod needs nothing any more, or None when it still waits for a node."""
    if pod is None:
        return "deleted"
    meta = pod.get("metadata") or {}
    if uid and meta.get("uid") != uid:
        return "deleted (a new pod has its name)"
    if meta.get("deletionTimestamp"):
        return "being deleted"
    if (pod.get("spec") or {}).get("nodeName"):
        return "bound"
    status = pod.get("status") or {}
    if status.get("nominatedNodeName"):
        return f"nominated to node {status['nominatedNodeName']}"
    if status.get("phase") in ("Succeeded", "Failed"):
        return f"finished ({status['phase']})"
    return None


def owning_claim(node: Mapping[str, Any], claims: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The Karpenter NodeClaim whose node this is (by status.nodeName or status.providerID)."""
    name = (node.get("metadata") or {}).get("name")
    provider_id = (node.get("spec") or {}).get("providerID")
    for claim in claims:
        status = claim.get("status") or {}
        if name and status.get("nodeName") == name:
            return claim
        if provider_id and status.get("providerID") == provider_id:
            return claim
    return None


def _template_problem(name: str, request: GPURequest, view: ClusterView,
                      devices: Sequence[GPUDevice]) -> str | tuple[Mapping[str, Any], Mapping[str, Any],
                                                                   Mapping[str, Any]]:
    """Why node ``name`` cannot be a template, or its (node, nodepool, owning claim)."""
    if not empty_copy_fits(devices, request):
        return f"{name}: even an empty copy would not fit {request.describe()} of pool {request.pool}"
    node = view.node(name)
    if node is None:
        return f"{name}: node not found"
    pool_name = ((node.get("metadata") or {}).get("labels") or {}).get(NODEPOOL_LABEL)
    if not pool_name:
        return f"{name}: not owned by a Karpenter NodePool (no {NODEPOOL_LABEL} label)"
    nodepool = view.nodepool(str(pool_name))
    if nodepool is None:
        return f"{name}: its NodePool {pool_name} was not found"
    claim = owning_claim(node, view.nodeclaims())
    if claim is None:
        return f"{name}: no Karpenter NodeClaim owns it"
    return node, nodepool, claim


def decide(pod: Mapping[str, Any] | None, uid: str, request: GPURequest, candidates: Sequence[str],
           view: ClusterView, inflight: InFlight, expansion_id: str,
           nominated: Sequence[str] = ()) -> Decision:
    """``nominated``: the NodeClaims Karpenter's Nominated events on the pod name, newest first."""
    reason = skip_reason(pod, uid)
    if reason is not None or pod is None:
        return Skip(reason or "deleted")
    waiting_on = inflight.waiting_on(uid)
    if waiting_on is not None:
        return WaitForClaim(waiting_on, _is_external(inflight, waiting_on))
    for name in nominated:
        claim = inflight.get(name)
        if claim is not None and claim.external and (not claim.gpus_known
                                                     or claim.fits(pod, request) is not None):
            return WaitForClaim(name, karpenter=True)
    found = inflight.fits_in_flight(pod, request)
    if found is not None:
        return WaitForClaim(found, _is_external(inflight, found))

    gpu_nodes = [(name, view.node_gpus(name)) for name in sorted(set(candidates))]
    gpu_nodes = [(name, devices) for name, devices in gpu_nodes
                 if any(d.pool == request.pool for d in devices)]
    if not gpu_nodes:
        return _from_nodepool(pod, request, candidates, view, inflight, expansion_id)
    problems: list[str] = []
    for name, devices in gpu_nodes:
        found_template = _template_problem(name, request, view, devices)
        if isinstance(found_template, str):
            problems.append(found_template)
            continue
        node, nodepool, template_claim = found_template
        try:
            body = build_nodeclaim(nodepool, template_claim, node, pod, expansion_id)
        except ClaimError as exc:
            problems.append(f"{name}: {exc}")
            continue
        if inflight.full:
            return WaitForSlot(inflight.own)
        pool_name = str((nodepool.get("metadata") or {}).get("name"))
        return Create(body, pool_name, name, tuple(devices))
    # static nodes (or another provisioner's) with a NodePool for bursts: grow from the pool's NodePool
    return _from_nodepool(pod, request, candidates, view, inflight, expansion_id, not_copied=problems)


def _is_external(inflight: InFlight, name: str) -> bool:
    claim = inflight.get(name)
    return claim is not None and claim.external


def _shown(problems: Sequence[str]) -> str:
    shown = "; ".join(problems[:MAX_REASONS])
    more = f"; and {len(problems) - MAX_REASONS} more" if len(problems) > MAX_REASONS else ""
    return shown + more


def _from_nodepool(pod: Mapping[str, Any], request: GPURequest, candidates: Sequence[str],
                   view: ClusterView, inflight: InFlight, expansion_id: str,
                   not_copied: Sequence[str] = ()) -> Decision:
    """The claim comes from the pool's NodePool (GPUPool annotation, else template label
    ``tensor-fusion.ai/gpupool``): scale from zero, when no candidate has GPUs of the pod's pool, or when
    none of those that do can be copied (``not_copied``: why), e.g. nodes not made by Karpenter."""
    gpupool = view.gpupool(request.pool)
    nodepools = pool_nodepools(gpupool, request.pool, view.all_nodepools())
    copied = f"no candidate GPU node can be copied for a new NodeClaim: {_shown(not_copied)}"
    if not nodepools and not_copied:
        return NoTemplate(copied)
    if not nodepools:
        return LeaveToKarpenter(
            f"none of the {len(candidates)} candidate nodes has GPUs of pool {request.pool} and no NodePool "
            f"is configured for it (GPUPool annotation {EXPANSION_NODEPOOL}, or a NodePool whose template "
            f"labels carry {POOL_LABEL_ON_GPU}: {request.pool}), so the expander cannot grow it from zero")
    problems: list[str] = []
    for nodepool in nodepools:
        choice = nodepool_choice(gpupool, request.pool, nodepool, request)
        if isinstance(choice, str):
            problems.append(choice)
            continue
        name = str((nodepool.get("metadata") or {}).get("name"))
        if not empty_copy_fits(choice.devices, request):
            problems.append(f"NodePool {name}: even an empty node would not fit {request.describe()}")
            continue
        try:
            body = build_nodeclaim_from_nodepool(nodepool, pod, choice.instance_type, expansion_id)
        except ClaimError as exc:
            problems.append(f"NodePool {name}: {exc}")
            continue
        if not pod_accepts_claim(pod, body):
            problems.append(f"NodePool {name}: the pod's node selector or affinity excludes its nodes")
            continue
        if inflight.full:
            return WaitForSlot(inflight.own)
        return Create(body, name, "", choice.devices)
    if not_copied:
        return NoTemplate(f"{copied}; and none of pool {request.pool}'s NodePools can make one: "
                          f"{_shown(problems)}")
    return NoTemplate(f"pool {request.pool} has no GPU node yet and none of its NodePools can make one: "
                      f"{_shown(problems)}")

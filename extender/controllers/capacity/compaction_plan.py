"""The compaction planner: which empty nodes to release, and which to shield from Karpenter.

Both provisioning modes share the removal rules of ``extender.planning.removal``; what *release*
means differs:

- Karpenter mode: delete the node's NodeClaim and its GPUNodeClaim (our claims carry
  ``karpenter.sh/do-not-disrupt``, so only we remove them).
- Provisioned mode with a GPUNodeClass: delete the node's GPUNodeClaim; its finalizer terminates the VM,
  waits for it to be gone and deletes the Node.
- AutoSelect mode: label the node ``tensor-fusion.ai/should-delete=true`` (as TensorFusion does) and take
  away our ``karpenter.sh/do-not-disrupt``, so Karpenter's own consolidation removes it. Because
  Karpenter consolidates every empty node by itself, the empty nodes kept for warm or minimum capacity
  get ``karpenter.sh/do-not-disrupt: "true"`` (``protect``) while they are needed and lose it
  (``unprotect``) once they are surplus; a node labelled should-delete that is needed again or holds
  GPU pods loses the label (``unmark``).

Releases happen only when the pool's compaction is due (``nodeCompaction.period``, or the
``tensor-fusion.ai/manual-compaction`` annotation); protect, unprotect and unmark on every pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from extender.common.labels import DO_NOT_DISRUPT, NODE_PROVISIONER, PROTECTED_BY, SHOULD_DELETE
from extender.planning.action import Action
from extender.planning.inputs import Inputs
from extender.planning.pool import PoolConfig, ProvisioningMode
from extender.planning.removal import Decision, NodeVerdict, removal_decisions


@dataclass(frozen=True)
class NodePayload:
    config: PoolConfig
    nodeclaim: str | None = None  # Karpenter mode: the claim to delete
    gpunodeclaim: str | None = None  # Provisioned mode: the claim to delete (its finalizer ends the VM)


def _meta(node: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    meta = node.get("metadata") or {}
    return meta.get("labels") or {}, meta.get("annotations") or {}


def _autoselect(inputs: Inputs, config: PoolConfig, decisions: list[Decision], due: bool) -> Iterable[Action]:
    for decision in decisions:
        name = decision.node.name
        labels, annotations = _meta(inputs.nodes.get(name) or {})
        marked = str(labels.get(SHOULD_DELETE, "")).lower() == "true"
        ours = PROTECTED_BY in annotations
        payload = NodePayload(config)
        if decision.needed:
            if marked:
                yield Action("unmark", config.name, decision.reason, node=name, payload=payload)
            if not ours and str(annotations.get(DO_NOT_DISRUPT, "")).lower() != "true":
                yield Action("protect", config.name, decision.reason, node=name, payload=payload)
        elif decision.verdict in (NodeVerdict.YOUNG, NodeVerdict.RELEASE):
            if ours:
                yield Action("unprotect", config.name, f"surplus: {decision.reason}", node=name,
                             payload=payload)
            if decision.verdict is NodeVerdict.RELEASE and due and not marked:
                yield Action("release", config.name, f"{decision.reason}; labelled {SHOULD_DELETE}=true",
                             node=name, payload=payload)
        elif decision.verdict is NodeVerdict.BUSY and marked:
            yield Action("unmark", config.name, decision.reason, node=name, payload=payload)


def _karpenter(inputs: Inputs, config: PoolConfig, decisions: list[Decision], due: bool) -> Iterable[Action]:
    if not due:
        return
    claims = inputs.nodeclaim_of_node()
    ours = {str((c.get("metadata") or {}).get("name")) for c in inputs.claims_of(config.name)}
    for decision in decisions:
        claim = claims.get(decision.node.name)
        if decision.verdict is NodeVerdict.RELEASE and claim in ours:
            yield Action("release", config.name, f"{decision.reason}; deleting NodeClaim {claim}",
                         node=decision.node.name, details={"nodeClaim": claim},
                         payload=NodePayload(config, claim))


def _provisioned(inputs: Inputs, config: PoolConfig, decisions: list[Decision],
                 due: bool) -> Iterable[Action]:
    if not due:
        return
    ours = {str((c.get("metadata") or {}).get("name")) for c in inputs.claims_of(config.name)}
    for decision in decisions:
        labels, _ = _meta(inputs.nodes.get(decision.node.name) or {})
        claim = str(labels.get(NODE_PROVISIONER) or "")
        if decision.verdict is NodeVerdict.RELEASE and claim in ours:
            yield Action("release", config.name,
                         f"{decision.reason}; deleting GPUNodeClaim {claim} (its VM is terminated)",
                         node=decision.node.name, details={"gpuNodeClaim": claim},
                         payload=NodePayload(config, gpunodeclaim=claim))


def plan_compaction(inputs: Inputs) -> Iterable[Action]:
    for config in inputs.configs():
        if (config.mode is ProvisioningMode.PROVISIONED and not config.launches_vms) or config.problems:
            continue
        nodes = inputs.pool_nodes(config.name)
        if not nodes:
            continue
        decisions = removal_decisions(config, nodes, inputs.now, inputs.protection_seconds)
        due = inputs.compaction_due(config)
        if config.mode is ProvisioningMode.KARPENTER:
            yield from _karpenter(inputs, config, decisions, due)
        elif config.launches_vms:
            yield from _provisioned(inputs, config, decisions, due)
        else:
            yield from _autoselect(inputs, config, decisions, due)


__all__ = ["DO_NOT_DISRUPT", "PROTECTED_BY", "SHOULD_DELETE", "NodePayload", "plan_compaction"]

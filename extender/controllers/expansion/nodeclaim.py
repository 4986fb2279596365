"""The Karpenter NodeClaim that copies a template node for one pod (pure)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extender.common.labels import (
    DO_NOT_DISRUPT,
    EXPANSION_LABEL,
    EXPANSION_POD_ANNOTATION,
    EXPANSION_POD_UID_LABEL,
    EXPANSION_TEMPLATE_NODE,
    INSTANCE_TYPE,
    NODEPOOL_HASH,
    NODEPOOL_HASH_VERSION,
    NODEPOOL_LABEL,
    REGION,
    ZONE,
)
from extender.kube.resources import NODECLAIMS, NODEPOOLS

# Karpenter compares these with the NodePool's to detect drift; copy them as Karpenter's own claims have them.
NODEPOOL_HASH_ANNOTATIONS = (NODEPOOL_HASH, NODEPOOL_HASH_VERSION)
NARROWED_KEYS = (ZONE, REGION)


_FROM_TEMPLATE_CLAIM = ("nodeClassRef", "taints", "startupTaints", "expireAfter", "terminationGracePeriod",
                        "resources")


class ClaimError(ValueError):
    """No valid NodeClaim can be built; the message says why."""


@dataclass(frozen=True)
class ValueSet:
    """A set of label values: ``values`` itself, or (``complement``) every value except those."""

    values: frozenset[str]
    complement: bool = False

    @staticmethod
    def anything() -> ValueSet:
        return ValueSet(frozenset(), complement=True)

    @property
    def unconstrained(self) -> bool:
        return self.complement and not self.values

    def intersect(self, other: ValueSet) -> ValueSet:
        if not self.complement and not other.complement:
            return ValueSet(self.values & other.values)
        if not self.complement:
            return ValueSet(self.values - other.values)
        if not other.complement:
            return ValueSet(other.values - self.values)
        return ValueSet(self.values | other.values, complement=True)

    def union(self, other: ValueSet) -> ValueSet:
        if not self.complement and not other.complement:
            return ValueSet(self.values | other.values)
        if not self.complement:
            return ValueSet(other.values - self.values, complement=True)
        if not other.complement:
            return ValueSet(self.values - other.values, complement=True)
        return ValueSet(self.values & other.values, complement=True)


def _expression_set(expression: Mapping[str, Any]) -> ValueSet | None:
    """The values an In/NotIn/Exists expression admits; None for operators that do not narrow a set."""
    operator = expression.get("operator")
    values = frozenset(str(v) for v in expression.get("values") or ())
    if operator == "In":
        return ValueSet(values)
    if operator == "NotIn":
        return ValueSet(values, complement=True)
    if operator == "Exists":
        return ValueSet.anything()
    return None


def _term_set(expressions: Iterable[Mapping[str, Any]], key: str) -> ValueSet:
    result = ValueSet.anything()
    for expression in expressions:
        if expression.get("key") != key:
            continue
        admitted = _expression_set(expression)
        if admitted is not None:
            result = result.intersect(admitted)
    return result


def pod_value_set(pod: Mapping[str, Any], key: str) -> ValueSet:
    """The values of node label ``key`` the pod accepts: its nodeSelector AND its required node affinity
    (whose terms are ORed, each term's expressions ANDed)."""
    spec = pod.get("spec") or {}
    result = ValueSet.anything()
    selector = spec.get("nodeSelector") or {}
    if key in selector:
        result = ValueSet(frozenset({str(selector[key])}))
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    if terms:
        admitted: ValueSet | None = None
        for term in terms:
            term_set = _term_set(term.get("matchExpressions") or [], key)
            admitted = term_set if admitted is None else admitted.union(term_set)
        if admitted is not None:
            result = result.intersect(admitted)
    return result


def _requirement(key: str, admitted: ValueSet) -> dict[str, Any] | None:
    if admitted.unconstrained:
        return None
    operator = "NotIn" if admitted.complement else "In"
    return {"key": key, "operator": operator, "values": sorted(admitted.values)}


def narrow_requirements(requirements: Sequence[Mapping[str, Any]], pod: Mapping[str, Any],
                        instance_type: str | None, nodepool: str) -> list[dict[str, Any]]:
    """The NodePool's requirements with the instance type pinned (None: the NodePool's own instance-type
    requirement stays) and zone/region narrowed by the pod.

    A key the pod does not constrain keeps the NodePool's requirements as they are.
    """
    out: list[dict[str, Any]] = []
    narrowed: dict[str, ValueSet] = {}
    for key in NARROWED_KEYS:
        wanted = pod_value_set(pod, key)
        if not wanted.unconstrained:
            narrowed[key] = wanted
    for requirement in requirements:
        current = str(requirement.get("key"))
        if current == NODEPOOL_LABEL or (current == INSTANCE_TYPE and instance_type is not None):
            continue
        if current in narrowed:
            admitted = _expression_set(requirement)
            if admitted is not None:
                narrowed[current] = narrowed[current].intersect(admitted)
                continue
        out.append(copy.deepcopy(dict(requirement)))
    for key, admitted in narrowed.items():
        if not admitted.complement and not admitted.values:
            raise ClaimError(f"the pod's {key} constraints leave no value the NodePool {nodepool} allows")
        rendered = _requirement(key, admitted)
        if rendered is not None:
            out.append(rendered)
    if instance_type is not None:
        out.append({"key": INSTANCE_TYPE, "operator": "In", "values": [instance_type]})
    out.append({"key": NODEPOOL_LABEL, "operator": "In", "values": [nodepool]})
    return out


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def build_nodeclaim(nodepool: Mapping[str, Any], template_claim: Mapping[str, Any],
                    template_node: Mapping[str, Any], pod: Mapping[str, Any],
                    expansion_id: str) -> dict[str, Any]:
    """A new ``karpenter.sh/v1`` NodeClaim in ``nodepool`` shaped like ``template_node`` for ``pod``."""
    node_name = str(_metadata(template_node).get("name") or "")
    instance_type = (_metadata(template_node).get("labels") or {}).get(INSTANCE_TYPE)
    if not instance_type:
        raise ClaimError(f"template node {node_name} has no {INSTANCE_TYPE} label")
    return _claim(nodepool, template_claim.get("spec") or {}, str(_metadata(template_claim).get("name")),
                  pod, str(instance_type), expansion_id, {EXPANSION_TEMPLATE_NODE: node_name})


def build_nodeclaim_from_nodepool(nodepool: Mapping[str, Any], pod: Mapping[str, Any],
                                  instance_type: str | None, expansion_id: str) -> dict[str, Any]:
    """A new NodeClaim made from the NodePool's template alone (no node of the pool exists yet), with the
    instance type pinned when one is given."""
    return _claim(nodepool, {}, "", pod, instance_type, expansion_id, {})


def _claim(nodepool: Mapping[str, Any], claim_spec: Mapping[str, Any], claim_name: str,
           pod: Mapping[str, Any], instance_type: str | None, expansion_id: str,
           extra_annotations: Mapping[str, str]) -> dict[str, Any]:
    pool_name = str(_metadata(nodepool).get("name") or "")
    if not pool_name:
        raise ClaimError("the NodePool has no name")
    template = (nodepool.get("spec") or {}).get("template") or {}
    template_meta = template.get("metadata") or {}
    template_spec = template.get("spec") or {}

    spec: dict[str, Any] = {}
    for field in _FROM_TEMPLATE_CLAIM:
        value = claim_spec.get(field)
        if value is None:
            value = template_spec.get(field)
        if value is not None:
            spec[field] = copy.deepcopy(value)
    if not spec.get("nodeClassRef"):
        source = f"neither NodeClaim {claim_name} nor NodePool" if claim_name else "NodePool"
        raise ClaimError(f"{source} {pool_name} names a nodeClassRef")
    spec["requirements"] = narrow_requirements(
        template_spec.get("requirements") or [], pod, instance_type, pool_name)

    pod_meta = _metadata(pod)
    labels = {str(k): str(v) for k, v in (template_meta.get("labels") or {}).items()}
    labels[NODEPOOL_LABEL] = pool_name
    labels[EXPANSION_LABEL] = expansion_id
    if pod_meta.get("uid"):
        labels[EXPANSION_POD_UID_LABEL] = str(pod_meta["uid"])
    annotations = {str(k): str(v) for k, v in (template_meta.get("annotations") or {}).items()}
    pool_annotations = _metadata(nodepool).get("annotations") or {}
    annotations.update({k: str(pool_annotations[k])
                        for k in NODEPOOL_HASH_ANNOTATIONS if k in pool_annotations})
    annotations[EXPANSION_POD_ANNOTATION] = f"{pod_meta.get('namespace', '')}/{pod_meta.get('name', '')}"
    annotations.update(extra_annotations)
    annotations.pop(DO_NOT_DISRUPT, None)

    metadata: dict[str, Any] = {"generateName": f"{pool_name}-tf-", "labels": labels,
                                "annotations": annotations}
    if _metadata(nodepool).get("uid"):
        # Like Karpenter's own claims: deleting the NodePool deletes the claim.
        metadata["ownerReferences"] = [{"apiVersion": NODEPOOLS.api_version, "kind": "NodePool",
                                        "name": pool_name, "uid": str(_metadata(nodepool)["uid"])}]
    return {"apiVersion": NODECLAIMS.api_version, "kind": "NodeClaim", "metadata": metadata, "spec": spec}


def pod_constraint_keys(pod: Mapping[str, Any]) -> set[str]:
    """Node label keys the pod's nodeSelector or required node affinity mention."""
    spec = pod.get("spec") or {}
    keys = {str(k) for k in (spec.get("nodeSelector") or {})}
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    for term in required.get("nodeSelectorTerms") or []:
        keys.update(str(e.get("key")) for e in term.get("matchExpressions") or [] if e.get("key"))
    return keys


def claim_value_set(claim: Mapping[str, Any], key: str) -> ValueSet:
    """The values of node label ``key`` a node launched for ``claim`` may have."""
    labels = _metadata(claim).get("labels") or {}
    if key in labels:
        return ValueSet(frozenset({str(labels[key])}))
    return _term_set((claim.get("spec") or {}).get("requirements") or [], key)


def pod_accepts_claim(pod: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    """False when the pod's node constraints exclude every node the claim may launch.

    Keys the claim says nothing about count as acceptable: the NodePool decides them.
    """
    nothing = ValueSet(frozenset())
    return all(
        claim_value_set(claim, key).intersect(pod_value_set(pod, key)) != nothing
        for key in pod_constraint_keys(pod)
    )

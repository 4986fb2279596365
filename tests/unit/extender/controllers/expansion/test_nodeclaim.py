"""The NodeClaim the expander creates: what Karpenter will launch, validated against Karpenter's schema."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from extender.common.labels import (
    DO_NOT_DISRUPT,
    EXPANSION_LABEL,
    INSTANCE_TYPE,
    NODEPOOL_LABEL,
    REGION,
    ZONE,
)
from extender.controllers.expansion.nodeclaim import ClaimError, ValueSet, build_nodeclaim, pod_accepts_claim
from tests.upstream import karpenter_crd


def nodepool(requirements: list[dict[str, Any]] | None = None, labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
        "metadata": {"name": "gpu", "uid": "pool-uid",
                     "annotations": {"karpenter.sh/nodepool-hash": "123", "other": "x"}},
        "spec": {"template": {
            "metadata": {"labels": labels or {"team": "ml"}, "annotations": annotations or {}},
            "spec": {
                "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "pool-class"},
                "requirements": requirements if requirements is not None else [
                    {"key": INSTANCE_TYPE, "operator": "In", "values": ["g5.xlarge", "p4d.24xlarge"],
                     "minValues": 2},
                    {"key": ZONE, "operator": "In", "values": ["z-a", "z-b", "z-c"]},
                    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                ],
            },
        }},
    }


def template_claim() -> dict[str, Any]:
    return {
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
        "metadata": {"name": "gpu-abcde", "labels": {NODEPOOL_LABEL: "gpu"},
                     "annotations": {DO_NOT_DISRUPT: "true"}},
        "spec": {
            "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "claim-class"},
            "requirements": [{"key": INSTANCE_TYPE, "operator": "In", "values": ["g5.xlarge"]}],
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
            "startupTaints": [{"key": "node.example.com/init", "effect": "NoSchedule"}],
            "expireAfter": "720h",
            "resources": {"requests": {"cpu": "2", "memory": "8Gi"}},
        },
        "status": {"nodeName": "gpu-node-1", "providerID": "kwok://gpu-node-1"},
    }


def template_node(zone: str = "z-b") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-1", "labels": {
        INSTANCE_TYPE: "p4d.24xlarge", ZONE: zone, REGION: "r-1", NODEPOOL_LABEL: "gpu"}}}


def pod(node_selector: dict[str, str] | None = None, terms: list[list[dict[str, Any]]] | None = None,
        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    if terms is not None:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid", "annotations": annotations or {}},
            "spec": spec}


def build(p: dict[str, Any] | None = None, pool: dict[str, Any] | None = None,
          claim: dict[str, Any] | None = None, node: dict[str, Any] | None = None) -> dict[str, Any]:
    return build_nodeclaim(pool or nodepool(), claim or template_claim(), node or template_node(),
                           p or pod(), "exp123")


def requirement(body: dict[str, Any], key: str) -> dict[str, Any] | None:
    found = [r for r in body["spec"]["requirements"] if r["key"] == key]
    assert len(found) <= 1, found
    return found[0] if found else None


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


# --- a minimal OpenAPI v3 validator: types, required, enums, patterns, lengths, items, maps -----------


def _schema() -> dict[str, Any]:
    crd = yaml.safe_load(karpenter_crd("nodeclaims").read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return version["schema"]["openAPIV3Schema"]


def schema_errors(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    errors: list[str] = []
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, int | str):
            errors.append(f"{path}: not int-or-string")
    elif "type" in schema:
        types = {"object": dict, "array": list, "string": str, "integer": int, "boolean": bool}
        if not isinstance(value, types[schema["type"]]):
            return [f"{path}: expected {schema['type']}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: {value!r} does not match {schema['pattern']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: longer than {schema['maxLength']}")
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(f"{path}: shorter than {schema['minLength']}")
    if isinstance(value, dict):
        errors += [f"{path}.{k}: required" for k in schema.get("required", []) if k not in value]
        props = schema.get("properties")
        for k, v in value.items():
            if props is not None and k in props:
                errors += schema_errors(v, props[k], f"{path}.{k}")
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += schema_errors(v, schema["additionalProperties"], f"{path}.{k}")
            elif props is not None and path != "":  # metadata is free-form
                errors.append(f"{path}.{k}: unknown field")
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{path}: more than {schema['maxItems']} items")
        for i, item in enumerate(value):
            item_schema = dict(schema.get("items", {}))
            # the API server applies these to every value of the array
            if path.endswith(".values"):
                item_schema.update({k: schema[k] for k in ("pattern", "maxLength") if k in schema})
            errors += schema_errors(item, item_schema, f"{path}[{i}]")
    return errors


def karpenter_rule_errors(body: dict[str, Any]) -> list[str]:
    """The CEL rules of the CRD that the structural checks above cannot express."""
    errors = []
    for r in body["spec"]["requirements"]:
        if r["operator"] == "In" and not r.get("values"):
            errors.append(f"{r['key']}: In without values")
        if r["operator"] == "In" and "minValues" in r and len(r["values"]) < r["minValues"]:
            errors.append(f"{r['key']}: fewer values than minValues")
        domain = r["key"].split("/")[0] if "/" in r["key"] else ""
        allowed = r["key"] in ("karpenter.sh/capacity-type", "karpenter.sh/nodepool")
        if domain.endswith("karpenter.sh") and not allowed:
            errors.append(f"{r['key']}: restricted domain")
        if r["key"] == "kubernetes.io/hostname":
            errors.append("hostname is restricted")
    ref = body["spec"]["nodeClassRef"]
    errors += [f"nodeClassRef.{k} empty" for k in ("group", "kind", "name") if not ref.get(k)]
    return errors


def assert_valid(body: dict[str, Any]) -> None:
    assert schema_errors(body, _schema()) + karpenter_rule_errors(body) == []


def test_validator_catches_what_karpenter_rejects() -> None:
    body = build()
    body["spec"]["requirements"].append({"key": "x", "operator": "Maybe"})
    body["spec"]["taints"] = [{"key": "k"}]
    errors = schema_errors(body, _schema())
    assert any("Maybe" in e for e in errors) and any("effect: required" in e for e in errors)


# --- the claim ------------------------------------------------------------------------------------


def test_claim_is_a_valid_karpenter_nodeclaim_in_the_nodepool() -> None:
    body = build()
    assert_valid(body)
    assert body["apiVersion"] == "karpenter.sh/v1" and body["kind"] == "NodeClaim"
    assert body["metadata"]["generateName"] == "gpu-tf-"
    labels = body["metadata"]["labels"]
    assert labels[NODEPOOL_LABEL] == "gpu" and labels["team"] == "ml" and labels[EXPANSION_LABEL] == "exp123"
    assert labels["tensor-fusion.ai/expansion-pod-uid"] == "pod-uid"
    assert body["metadata"]["annotations"]["tensor-fusion.ai/expansion-pod"] == "ns/p"
    assert body["metadata"]["annotations"]["karpenter.sh/nodepool-hash"] == "123"
    assert "other" not in body["metadata"]["annotations"]  # only the NodePool's template annotations
    assert body["metadata"]["ownerReferences"][0]["uid"] == "pool-uid"


def test_template_claim_supplies_class_taints_expiry_and_resources() -> None:
    spec = build()["spec"]
    source = template_claim()["spec"]
    for field in ("nodeClassRef", "taints", "startupTaints", "expireAfter", "resources"):
        assert spec[field] == source[field], field


def test_nodepool_class_is_used_when_the_template_claim_has_none() -> None:
    claim = template_claim()
    del claim["spec"]["nodeClassRef"]
    assert build(claim=claim)["spec"]["nodeClassRef"]["name"] == "pool-class"


def test_instance_type_is_pinned_to_the_template_node() -> None:
    body = build()
    assert requirement(body, INSTANCE_TYPE) == {"key": INSTANCE_TYPE, "operator": "In",
                                                 "values": ["p4d.24xlarge"]}
    assert requirement(body, "karpenter.sh/capacity-type") == expr("karpenter.sh/capacity-type", "In",
                                                                   "on-demand")
    assert requirement(body, NODEPOOL_LABEL) == expr(NODEPOOL_LABEL, "In", "gpu")


@pytest.mark.parametrize(("case", "the_pod", "zone", "region"), [
    ("pod pins nothing: the NodePool's zones, not the template's", pod(),
     expr(ZONE, "In", "z-a", "z-b", "z-c"), None),
    ("nodeSelector zone", pod({ZONE: "z-c"}), expr(ZONE, "In", "z-c"), None),
    ("nodeSelector region, zone kept", pod({REGION: "r-2"}),
     expr(ZONE, "In", "z-a", "z-b", "z-c"), expr(REGION, "In", "r-2")),
    ("affinity In intersects the NodePool's", pod(terms=[[expr(ZONE, "In", "z-a", "z-b", "z-x")]]),
     expr(ZONE, "In", "z-a", "z-b"), None),
    ("affinity NotIn excludes", pod(terms=[[expr(ZONE, "NotIn", "z-a")]]),
     expr(ZONE, "In", "z-b", "z-c"), None),
    ("In and NotIn in one term", pod(terms=[[expr(ZONE, "In", "z-a", "z-b"), expr(ZONE, "NotIn", "z-b")]]),
     expr(ZONE, "In", "z-a"), None),
    ("terms are ORed", pod(terms=[[expr(ZONE, "In", "z-a")], [expr(ZONE, "In", "z-c")]]),
     expr(ZONE, "In", "z-a", "z-c"), None),
    ("a term without zone leaves zone open", pod(terms=[[expr(ZONE, "In", "z-a")], [expr("gpu", "Exists")]]),
     expr(ZONE, "In", "z-a", "z-b", "z-c"), None),
    ("nodeSelector and affinity both hold", pod({ZONE: "z-b"}, [[expr(ZONE, "In", "z-a", "z-b")]]),
     expr(ZONE, "In", "z-b"), None),
    ("other affinity keys are not copied", pod(terms=[[expr("gpu", "In", "a100")]]),
     expr(ZONE, "In", "z-a", "z-b", "z-c"), None),
])
def test_zone_and_region_are_narrowed_by_the_pod(case: str, the_pod: dict[str, Any],
                                                 zone: dict[str, Any], region: dict[str, Any] | None) -> None:
    body = build(the_pod)
    assert requirement(body, ZONE) == zone, case
    assert requirement(body, REGION) == region, case
    assert_valid(body)


def test_narrowing_without_a_nodepool_zone_requirement() -> None:
    pool = nodepool(requirements=[{"key": ZONE, "operator": "NotIn", "values": ["z-bad"]}])
    assert requirement(build(pod(), pool=pool), ZONE) == expr(ZONE, "NotIn", "z-bad")
    assert requirement(build(pod(terms=[[expr(ZONE, "NotIn", "z-a")]]), pool=pool), ZONE) == expr(
        ZONE, "NotIn", "z-a", "z-bad")
    no_zones = nodepool(requirements=[])
    assert requirement(build(pod({ZONE: "z-a"}), pool=no_zones), ZONE) == expr(ZONE, "In", "z-a")


def test_pod_zone_outside_the_nodepool_is_an_error() -> None:
    with pytest.raises(ClaimError, match="zone"):
        build(pod({ZONE: "z-elsewhere"}))


def test_template_node_without_instance_type_is_an_error() -> None:
    node = template_node()
    del node["metadata"]["labels"][INSTANCE_TYPE]
    with pytest.raises(ClaimError, match="instance-type"):
        build(node=node)


_label = st.from_regex(r"[a-z][a-z0-9.-]{0,20}/[a-z][a-z0-9-]{0,20}", fullmatch=True)


@given(template_annotations=st.dictionaries(_label, st.text(max_size=20), max_size=5),
       pool_annotations=st.dictionaries(_label, st.text(max_size=20), max_size=5),
       value=st.sampled_from(["true", "false", ""]))
def test_do_not_disrupt_is_never_copied(template_annotations: dict[str, str],
                                        pool_annotations: dict[str, str], value: str) -> None:
    pool = nodepool(annotations={**template_annotations, DO_NOT_DISRUPT: value})
    pool["metadata"]["annotations"] = {**pool_annotations, DO_NOT_DISRUPT: value}
    claim = template_claim()
    claim["metadata"]["annotations"] = {DO_NOT_DISRUPT: "true"}
    annotations = build(pool=pool, claim=claim)["metadata"]["annotations"]
    assert DO_NOT_DISRUPT not in annotations
    for k, v in template_annotations.items():
        if k != DO_NOT_DISRUPT:
            assert annotations[k] == v


_zones = st.sets(st.sampled_from(["a", "b", "c", "d"]))
_value_sets = st.builds(ValueSet, _zones.map(frozenset), st.booleans())


@given(_value_sets, _value_sets, st.sampled_from(["a", "b", "c", "d", "e"]))
def test_value_set_algebra_matches_membership(x: ValueSet, y: ValueSet, v: str) -> None:
    def member(s: ValueSet) -> bool:
        return (v in s.values) != s.complement

    assert member(x.intersect(y)) == (member(x) and member(y))
    assert member(x.union(y)) == (member(x) or member(y))


@pytest.mark.parametrize(("the_pod", "accepted"), [
    (pod(), True),
    (pod({ZONE: "z-a"}), True),
    (pod({ZONE: "z-q"}), False),
    (pod({"team": "ml"}), True),
    (pod({"team": "web"}), False),
    (pod({"unknown": "x"}), True),
    (pod(terms=[[expr(INSTANCE_TYPE, "In", "g5.xlarge")]]), False),
])
def test_pod_accepts_claim(the_pod: dict[str, Any], accepted: bool) -> None:
    assert pod_accepts_claim(the_pod, build()) is accepted

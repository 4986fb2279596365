"""What a TensorFusionCluster's GPUPools should be, and what to do to get there (pure).

TensorFusion's rule (``internal/controller/tensorfusioncluster_controller.go``): each ``spec.gpuPools[]``
entry becomes a GPUPool named ``<cluster>-<entry name>``, labelled ``tensor-fusion.ai/managed-by: <cluster>``
(plus the cluster's own labels, when created), annotated ``tensor-fusion.ai/is-default-pool`` with the
entry's ``isDefault``, owned by the cluster, its spec replaced by ``specTemplate`` whenever the two differ,
and deleted when the entry goes. This module adds what TensorFusion does not say: a pool whose spec differs
while the template did not change (``tensor-fusion.ai/template-hash``) was edited by hand and is
*overwritten* (the same write, a louder event); an entry that cannot become a pool (no name, a name used
twice, a name that is no valid object name, a same-named pool the cluster does not own) is reported and
left alone, never a crash.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from extender.common.contract import DEFAULT_POOL_ANNOTATION
from extender.common.labels import MANAGED_BY, TEMPLATE_HASH
from extender.kube.resources import GPU_POOLS, TENSOR_FUSION_CLUSTERS

CLUSTER_API_VERSION = TENSOR_FUSION_CLUSTERS.api_version
CLUSTER_KIND = TENSOR_FUSION_CLUSTERS.kind
POOL_API_VERSION = GPU_POOLS.api_version
POOL_KIND = GPU_POOLS.kind
# a DNS subdomain (RFC 1123), the rule for a GPUPool's name
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
MAX_NAME = 253


class Verb(StrEnum):
    CREATE = "create"
    UPDATE = "update"  # the template (or isDefault) changed
    OVERWRITE = "overwrite"  # the pool was edited by hand: its spec is put back
    DELETE = "delete"


@dataclass(frozen=True)
class PoolAction:
    verb: Verb
    name: str
    body: dict[str, Any]  # the object to create, the pool as it will be after an update, or the one deleted
    reason: str

    def json_patch(self) -> list[dict[str, Any]]:
        """An update as a JSON patch: spec, labels and annotations replaced whole, and only if the pool is
        still the version planned from (``test`` on resourceVersion; a concurrent edit makes it fail)."""
        meta = self.body["metadata"]
        ops: list[dict[str, Any]] = []
        if meta.get("resourceVersion"):
            ops.append({"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]})
        ops += [{"op": "add", "path": "/spec", "value": self.body["spec"]},
                {"op": "add", "path": "/metadata/labels", "value": meta["labels"]},
                {"op": "add", "path": "/metadata/annotations", "value": meta["annotations"]}]
        return ops

    @property
    def event_reason(self) -> str:
        return {Verb.CREATE: "GPUPoolCreated", Verb.UPDATE: "GPUPoolUpdated",
                Verb.OVERWRITE: "GPUPoolOverwritten", Verb.DELETE: "GPUPoolDeleted"}[self.verb]


@dataclass(frozen=True)
class Plan:
    actions: list[PoolAction] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # entries that cannot become pools, one line each
    in_step: list[str] = field(default_factory=list)  # derived pools that already say what they should


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return meta if isinstance(meta, Mapping) else {}


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def template_hash(template: Any) -> str:
    """A short, stable hash of a specTemplate (key order does not matter)."""
    text = json.dumps(template, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def pool_name(cluster: str, entry: str) -> str:
    return f"{cluster}-{entry}"


def owned_by(pool: Mapping[str, Any], cluster: Mapping[str, Any]) -> bool:
    """Whether one of the pool's ownerReferences is this TensorFusionCluster (by uid when both have one,
    else by kind and name, as TensorFusion matches)."""
    meta = _meta(cluster)
    for ref in _meta(pool).get("ownerReferences") or []:
        if not isinstance(ref, Mapping) or ref.get("kind") != CLUSTER_KIND:
            continue
        if ref.get("name") != meta.get("name"):
            continue
        if ref.get("uid") and meta.get("uid") and ref.get("uid") != meta.get("uid"):
            continue  # a cluster of the same name that was deleted and created again
        return True
    return False


def _owner_ref(cluster: Mapping[str, Any]) -> dict[str, Any]:
    meta = _meta(cluster)
    return {"apiVersion": CLUSTER_API_VERSION, "kind": CLUSTER_KIND, "name": str(meta.get("name", "")),
            "uid": str(meta.get("uid", "")), "controller": True}


def default_text(is_default: object) -> str:
    return "true" if is_default is True else "false"


def entries(cluster: Mapping[str, Any]) -> tuple[list[tuple[str, bool, dict[str, Any]]], list[str]]:
    """The valid ``spec.gpuPools`` entries as (pool name, isDefault, specTemplate), and a line for each
    entry that is not valid."""
    name = str(_meta(cluster).get("name", ""))
    spec = cluster.get("spec")
    if spec is not None and not isinstance(spec, Mapping):
        return [], [f"spec: expected an object, got {_shown(spec)}"]
    raw = (spec or {}).get("gpuPools")
    raw = [] if raw is None else raw
    out: list[tuple[str, bool, dict[str, Any]]] = []
    problems: list[str] = []
    seen: set[str] = set()
    if not isinstance(raw, list):
        return [], [f"spec.gpuPools: expected a list, got {_shown(raw)}"]
    for i, entry in enumerate(raw):
        where = f"spec.gpuPools[{i}]"
        if not isinstance(entry, Mapping):
            problems.append(f"{where}: expected an object, got {_shown(entry)}")
            continue
        entry_name = entry.get("name")
        if not isinstance(entry_name, str) or not entry_name:
            problems.append(f"{where}.name: missing; every pool needs a name")
            continue
        full = pool_name(name, entry_name)
        if len(full) > MAX_NAME or not _NAME.match(full):
            problems.append(f"{where}.name {_shown(entry_name)}: the GPUPool name {_shown(full)} is not a "
                            "valid object name (lower-case letters, digits, '-' and '.', at most 253 "
                            "characters)")
            continue
        if full in seen:
            problems.append(f"{where}.name {_shown(entry_name)}: used by an earlier entry; this one is "
                            "ignored")
            continue
        template = entry.get("specTemplate")
        if template is None:
            template = {}
        if not isinstance(template, Mapping):
            problems.append(f"{where}.specTemplate: expected an object, got {_shown(template)}")
            continue
        seen.add(full)
        out.append((full, entry.get("isDefault") is True, copy.deepcopy(dict(template))))
    return out, problems


def plan(cluster: Mapping[str, Any], pools: Iterable[Mapping[str, Any]]) -> Plan:
    """The pool actions for ``cluster`` given every GPUPool in the cluster (``pools``)."""
    cluster_name = str(_meta(cluster).get("name", ""))
    by_name = {str(_meta(p).get("name")): p for p in pools}
    wanted, problems = entries(cluster)
    actions: list[PoolAction] = []
    in_step: list[str] = []
    for full, is_default, template in wanted:
        digest = template_hash(template)
        existing = by_name.get(full)
        if existing is None:
            labels = {k: str(v) for k, v in (_meta(cluster).get("labels") or {}).items()}
            labels[MANAGED_BY] = cluster_name
            body = {"apiVersion": POOL_API_VERSION, "kind": POOL_KIND,
                    "metadata": {"name": full, "labels": labels,
                                 "annotations": {DEFAULT_POOL_ANNOTATION: default_text(is_default),
                                                 TEMPLATE_HASH: digest},
                                 "ownerReferences": [_owner_ref(cluster)]},
                    "spec": template}
            entry = full[len(cluster_name) + 1:]
            actions.append(PoolAction(Verb.CREATE, full, body, f"from spec.gpuPools entry {entry}"))
            continue
        if not owned_by(existing, cluster):
            problems.append(f"GPUPool {full} exists and is not owned by TensorFusionCluster {cluster_name}; "
                            "it is left alone (delete it, or rename the entry)")
            continue
        meta = _meta(existing)
        annotations = dict(meta.get("annotations") or {})
        labels = dict(meta.get("labels") or {})
        spec_differs = (existing.get("spec") or {}) != template
        default_differs = annotations.get(DEFAULT_POOL_ANNOTATION) != default_text(is_default)
        label_differs = labels.get(MANAGED_BY) != cluster_name
        if not (spec_differs or default_differs or label_differs):
            in_step.append(full)
            continue
        hand_edited = spec_differs and annotations.get(TEMPLATE_HASH) == digest
        annotations[DEFAULT_POOL_ANNOTATION] = default_text(is_default)
        annotations[TEMPLATE_HASH] = digest
        labels[MANAGED_BY] = cluster_name
        body = copy.deepcopy(dict(existing))
        body.pop("status", None)
        body["metadata"] = {**copy.deepcopy(dict(meta)), "annotations": annotations, "labels": labels}
        body["spec"] = template
        what = []
        if spec_differs:
            what.append("spec from specTemplate")
        if default_differs:
            what.append(f"{DEFAULT_POOL_ANNOTATION}={default_text(is_default)}")
        if label_differs:
            what.append(f"{MANAGED_BY}={cluster_name}")
        if hand_edited:
            actions.append(PoolAction(Verb.OVERWRITE, full, body,
                                      "its spec was edited by hand; put back from the TensorFusionCluster's "
                                      "specTemplate (edit the template instead)"))
        else:
            actions.append(PoolAction(Verb.UPDATE, full, body, "set " + ", ".join(what)))
    keep = {full for full, _, _ in wanted}
    for name, pool in sorted(by_name.items()):
        labels = _meta(pool).get("labels") or {}
        if name in keep or labels.get(MANAGED_BY) != cluster_name or not owned_by(pool, cluster):
            continue
        if _meta(pool).get("deletionTimestamp"):
            continue
        actions.append(PoolAction(Verb.DELETE, name, dict(pool), "its spec.gpuPools entry is gone"))
    return Plan(actions, problems, in_step)


# --- status -------------------------------------------------------------------------------------------


def set_condition(conditions: list[dict[str, Any]], condition: Mapping[str, Any],
                  now: str) -> list[dict[str, Any]]:
    """``meta.SetStatusCondition``: replace the condition of the same type, keeping its
    lastTransitionTime unless the status changed."""
    out = [dict(c) for c in conditions if isinstance(c, Mapping)]
    for i, old in enumerate(out):
        if old.get("type") == condition.get("type"):
            new = {**old, **condition}
            if old.get("status") != condition.get("status") or not old.get("lastTransitionTime"):
                new["lastTransitionTime"] = now
            out[i] = new
            return out
    out.append({**condition, "lastTransitionTime": now})
    return out

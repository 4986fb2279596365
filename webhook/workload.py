"""The workload a pod belongs to, for the ``tensor-fusion.ai/workload`` label.

Deployment name for ReplicaSet-owned pods, CronJob name for Job-owned pods, else the owner, else the pod.
"""

from __future__ import annotations

import re
from typing import Any

from webhook.view import ClusterView, KubeObject

_OWNER_PARENTS = {("apps", "ReplicaSet"): "Deployment", ("batch", "Job"): "CronJob"}
_LABEL_VALUE_MAX = 63
_LABEL_INVALID = re.compile(r"[^A-Za-z0-9_.-]")


def controller_ref(obj: KubeObject) -> dict[str, Any] | None:
    """The controlling owner reference, else the first one."""
    refs = [r for r in (obj.get("metadata") or {}).get("ownerReferences") or [] if isinstance(r, dict)]
    for ref in refs:
        if ref.get("controller") is True:
            return ref
    return refs[0] if refs else None


def owner_to_fetch(pod: KubeObject) -> tuple[str, str] | None:
    """``(kind, name)`` of the pod's owner when its own owner decides the workload (ReplicaSet, Job)."""
    ref = controller_ref(pod)
    if ref is None:
        return None
    key = (_group(ref), str(ref.get("kind") or ""))
    return (key[1], str(ref.get("name") or "")) if key in _OWNER_PARENTS and ref.get("name") else None


def workload_name(pod: KubeObject, namespace: str, view: ClusterView) -> str:
    ref = controller_ref(pod)
    if ref is None or not ref.get("name"):
        return _pod_name(pod)
    name = str(ref["name"])
    parent_kind = _OWNER_PARENTS.get((_group(ref), str(ref.get("kind") or "")))
    if parent_kind is None:
        return name
    owner = view.owner(namespace, str(ref["kind"]), name)
    if owner is not None:
        parent = controller_ref(owner)
        if parent is not None and parent.get("kind") == parent_kind and parent.get("name"):
            return str(parent["name"])
        return name
    return _deployment_from_hash(pod, name) if parent_kind == "Deployment" else name


def label_value(text: str) -> str:
    """``text`` made a valid label value: allowed characters, at most 63, alphanumeric at both ends."""
    cleaned = _LABEL_INVALID.sub("-", text)[:_LABEL_VALUE_MAX]
    return cleaned.strip("-_.")


def _deployment_from_hash(pod: KubeObject, replicaset: str) -> str:
    # Without the ReplicaSet object, a Deployment's ReplicaSet is "<deployment>-<pod-template-hash>".
    labels = (pod.get("metadata") or {}).get("labels") or {}
    template_hash = labels.get("pod-template-hash")
    suffix = f"-{template_hash}"
    if template_hash and replicaset.endswith(suffix) and len(replicaset) > len(suffix):
        return replicaset[: -len(suffix)]
    return replicaset


def _pod_name(pod: KubeObject) -> str:
    metadata = pod.get("metadata") or {}
    # Pods created with generateName have no name yet at admission.
    return str(metadata.get("name") or str(metadata.get("generateName") or "").rstrip("-") or "pod")


def _group(ref: dict[str, Any]) -> str:
    api_version = str(ref.get("apiVersion") or "")
    return api_version.split("/", 1)[0] if "/" in api_version else ""

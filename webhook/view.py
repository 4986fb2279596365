"""What the mutation may look up in the cluster, and an in-memory implementation of it.

The mutation is pure: everything it needs besides the pod comes through a ``ClusterView``. The offline
``tf-webhook mutate`` and the unit tests use ``StaticClusterView`` over a list of objects; the server uses a
view backed by watch caches and the owner cache (``webhook.caches``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from extender.common.contract import DEFAULT_POOL_ANNOTATION
from extender.common.yamlio import YAMLFileError, iter_documents

KubeObject = dict[str, Any]

# Kinds whose objects the view resolves as owners of a pod (ReplicaSet -> Deployment, Job -> CronJob).
OWNER_KINDS = ("ReplicaSet", "Job")
_NAMESPACED_KINDS = frozenset({"WorkloadProfile", "ReplicaSet", "Job", "Deployment", "CronJob", "Pod",
                               "GPUResourceQuota"})


class ClusterView(Protocol):
    def pool(self, name: str) -> KubeObject | None:
        """The GPUPool of that name."""

    def default_pool(self) -> KubeObject | None:
        """The GPUPool annotated ``tensor-fusion.ai/is-default-pool: "true"``."""

    def profile(self, namespace: str, name: str) -> KubeObject | None:
        """The WorkloadProfile ``namespace/name``."""

    def template(self, name: str) -> KubeObject | None:
        """The SchedulingConfigTemplate of that name."""

    def quotas(self, namespace: str) -> list[KubeObject]:
        """The GPUResourceQuotas of the namespace."""

    def owner(self, namespace: str, kind: str, name: str) -> KubeObject | None:
        """A pod's owner object (``ReplicaSet`` or ``Job``), to follow the owner chain one step up."""


def name_of(obj: KubeObject) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def namespace_of(obj: KubeObject) -> str | None:
    namespace = (obj.get("metadata") or {}).get("namespace")
    return str(namespace) if namespace else None


def is_default_pool(pool: KubeObject) -> bool:
    annotations = (pool.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(DEFAULT_POOL_ANNOTATION, "")).lower() == "true"


def pick_default_pool(pools: Iterable[KubeObject]) -> KubeObject | None:
    """The default pool; with several marked default, the first by name, so the choice is stable."""
    candidates = sorted((p for p in pools if is_default_pool(p)), key=name_of)
    return candidates[0] if candidates else None


class StaticClusterView:
    """A ``ClusterView`` over a fixed list of objects."""

    def __init__(self, objects: Iterable[KubeObject] = (), default_namespace: str = "default") -> None:
        self._objects: dict[tuple[str, str | None, str], KubeObject] = {}
        for obj in objects:
            kind = str(obj.get("kind") or "")
            namespace = (namespace_of(obj) or default_namespace) if kind in _NAMESPACED_KINDS else None
            self._objects[(kind, namespace, name_of(obj))] = obj

    def pool(self, name: str) -> KubeObject | None:
        return self._objects.get(("GPUPool", None, name))

    def default_pool(self) -> KubeObject | None:
        return pick_default_pool(obj for (kind, _, _), obj in self._objects.items() if kind == "GPUPool")

    def profile(self, namespace: str, name: str) -> KubeObject | None:
        return self._objects.get(("WorkloadProfile", namespace, name))

    def template(self, name: str) -> KubeObject | None:
        return self._objects.get(("SchedulingConfigTemplate", None, name))

    def quotas(self, namespace: str) -> list[KubeObject]:
        return [o for (kind, ns, _), o in self._objects.items()
                if kind == "GPUResourceQuota" and ns == namespace]

    def owner(self, namespace: str, kind: str, name: str) -> KubeObject | None:
        return self._objects.get((kind, namespace, name))


class ObjectsError(ValueError):
    """The objects document is not a YAML stream or List of Kubernetes objects."""


def load_objects(text: str, source: str = "objects") -> list[KubeObject]:
    """Objects from a YAML (or JSON) stream; ``kind: List`` (or ``*List``) documents are flattened. Bad
    YAML names ``source`` and the line."""
    try:
        documents = [doc for doc in iter_documents(text, source) if doc is not None]
    except YAMLFileError as exc:
        raise ObjectsError(str(exc)) from exc
    objects: list[KubeObject] = []
    pending = list(documents)
    while pending:
        doc = pending.pop(0)
        if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
            raise ObjectsError(f"not a Kubernetes object (a map with a kind): {str(doc)[:80]}")
        if doc["kind"].endswith("List") and isinstance(doc.get("items"), list):
            # Raw API lists (GPUPoolList ...) leave the kind off their items.
            item_kind = doc["kind"][: -len("List")]
            items = doc["items"]
            if item_kind:
                items = [{"kind": item_kind, **i} if isinstance(i, dict) and "kind" not in i else i
                         for i in items]
            pending[:0] = items
            continue
        objects.append(doc)
    return objects

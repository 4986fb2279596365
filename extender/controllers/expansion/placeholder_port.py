"""The placeholder pods' I/O: the cache of the placeholders, the GPU pods they stand for (the
extender's own pod cache), pod create and delete, and the PriorityClass that owns them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client

from extender.common.labels import PLACEHOLDER_LABEL
from extender.controllers.expansion.placeholders import Placeholders
from extender.controllers.expansion.port import KubeExpansionPort
from extender.controllers.expansion.provisioner import AutoscalerConfig
from extender.controllers.expansion.worker import Expander
from extender.kube.client import api_call, not_found, request_json
from extender.kube.informer import WatchCache
from extender.kube.resources import PODS, PRIORITY_CLASSES, collection_path, object_path
from extender.scheduling.inventory import GPUDevice

PLACEHOLDER_SELECTOR = f"{PLACEHOLDER_LABEL}=true"


class KubePodWriter:
    """Create and delete pods of one namespace (a 404 on delete means done)."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client

    async def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = await api_call(request_json, self.api_client, "POST",
                                                 collection_path(PODS, namespace), body=body)
        return created

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                "preconditions": {"uid": uid} if uid else None}
        try:
            await api_call(request_json, self.api_client, "DELETE", object_path(PODS, name, namespace),
                           body={k: v for k, v in body.items() if v is not None})
        except Exception as exc:
            if not not_found(exc):
                raise


class KubePlaceholderPort(KubePodWriter):
    """The placeholders' I/O; ``cache`` holds the placeholder pods (``PLACEHOLDER_SELECTOR`` in the
    placeholders' namespace)."""

    def __init__(self, api_client: client.ApiClient, expansion: KubeExpansionPort, gpu_pods: WatchCache,
                 config: AutoscalerConfig, cache: WatchCache) -> None:
        super().__init__(api_client)
        self._expansion = expansion
        self._gpu_pods = gpu_pods
        self._priority_class = config.placeholder_priority_class
        self._owner: dict[str, Any] | None = None
        self.cache = cache

    def node(self, name: str) -> Mapping[str, Any] | None:
        return self._expansion.node(name)

    def node_gpus(self, name: str) -> Sequence[GPUDevice]:
        return self._expansion.node_gpus(name)

    def record(self, obj: Mapping[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        self._expansion.record(obj, reason, message, type_)

    def gpu_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self._gpu_pods.get(name, namespace)

    def placeholder_pods(self) -> Sequence[Mapping[str, Any]]:
        return self.cache.list() if self.cache.synced.is_set() else []

    async def placeholder_owner(self) -> Mapping[str, Any] | None:
        """The placeholders' PriorityClass: cluster scoped, installed with the project, so deleting the
        installation garbage-collects every placeholder. Raises when it is missing (no pod could use it)."""
        if self._owner is None:
            try:
                found: dict[str, Any] = await api_call(request_json, self.api_client, "GET",
                                                       object_path(PRIORITY_CLASSES, self._priority_class))
            except Exception as exc:
                if not_found(exc):
                    raise LookupError(f"PriorityClass {self._priority_class} is not installed "
                                      "(manifests/priorityclasses.yaml)") from exc
                raise
            self._owner = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                           "metadata": {"name": self._priority_class,
                                        "uid": (found.get("metadata") or {}).get("uid")}}
        return self._owner


def attach_placeholders(expander: Expander, config: AutoscalerConfig, api_client: client.ApiClient,
                        gpu_pods: WatchCache, cache: WatchCache) -> Placeholders:
    """Give the expander its Cluster Autoscaler side (it decides per pool whether to use it); ``cache``:
    the placeholder pods."""
    if not isinstance(expander.port, KubeExpansionPort):
        raise TypeError("placeholders need the API server's expansion port")
    port = KubePlaceholderPort(api_client, expander.port, gpu_pods, config, cache)
    placeholders = Placeholders(config, port, forget=expander.flagged.forget,
                                registry=expander.metrics.registry)
    expander.use_placeholders(placeholders, cache)
    return placeholders

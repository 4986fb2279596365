"""The defragmenter wired to the API server: the service's caches, pod and PDB lists, the Eviction API."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry

from extender.controllers.defrag.controller import Defragmenter, Eviction, Recorder
from extender.controllers.defrag.metrics import DefragMetrics
from extender.controllers.wiring import CoreCaches
from extender.kube.client import api_call, error_message, error_status, request_json
from extender.kube.resources import PDBS, PODS, collection_path, object_path
from extender.scheduling.state import ClusterState


class KubeDefragPort:
    """Pods and PDBs listed from the API server, evictions through it; nodes, workers and pools from the
    service's core caches."""

    def __init__(self, api_client: client.ApiClient, core: CoreCaches) -> None:
        self.api_client = api_client
        self.core = core

    async def pods_on(self, node: str) -> list[dict[str, Any]]:
        answer = await api_call(request_json, self.api_client, "GET", collection_path(PODS),
                                query={"fieldSelector": f"spec.nodeName={node}"})
        return [{"kind": "Pod", **item} for item in (answer or {}).get("items") or []]

    async def all_pods(self) -> list[dict[str, Any]]:
        answer = await api_call(request_json, self.api_client, "GET", collection_path(PODS),
                                query={"fieldSelector": "spec.nodeName!="})
        return [{"kind": "Pod", **item} for item in (answer or {}).get("items") or []]

    async def pdbs(self) -> list[dict[str, Any]]:
        answer = await api_call(request_json, self.api_client, "GET", collection_path(PDBS))
        return [{"kind": "PodDisruptionBudget", **item} for item in (answer or {}).get("items") or []]

    async def evict(self, namespace: str, name: str, uid: str) -> tuple[Eviction, str]:
        body = {
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            # the uid keeps a new pod of the same name from being evicted in its place
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        try:
            await api_call(request_json, self.api_client, "POST",
                           object_path(PODS, name, namespace, "eviction"), body=body)
        except Exception as exc:
            status = error_status(exc)
            if status == 429:
                return Eviction.BLOCKED, error_message(exc)
            if status in (404, 409):
                return Eviction.GONE, error_message(exc)
            return Eviction.FAILED, error_message(exc)
        return Eviction.EVICTED, ""

    def node(self, name: str) -> dict[str, Any] | None:
        return self.core.nodes.get(name)

    def worker_pods(self) -> list[dict[str, Any]]:
        return self.core.pods.list()

    def pools(self) -> list[dict[str, Any]]:
        return self.core.gpupools.list()


def kube_defragmenter(api_client: client.ApiClient, core: CoreCaches, state: ClusterState,
                      recorder: Recorder, registry: CollectorRegistry, *, replacement_timeout: float,
                      tick_seconds: float) -> Defragmenter:
    """The defragmenter on the service's core caches (its controllers wait for all of them)."""
    return Defragmenter(state, KubeDefragPort(api_client, core), recorder, DefragMetrics(registry),
                        replacement_timeout=replacement_timeout, tick_seconds=tick_seconds, caches=core.all)

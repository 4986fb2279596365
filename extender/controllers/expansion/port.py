"""The expander's view of the cluster through the API server: the caches of NodeClaims, NodePools, Nodes,
GPUPools and GPU pods (all from the process's one cache factory), the pod re-read, the NodeClaim create, and
events."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry

from extender.controllers.expansion.config import ExpansionConfig
from extender.controllers.expansion.fit import device_of
from extender.controllers.expansion.karpenter import node_usable
from extender.controllers.expansion.metrics import ExpansionMetrics
from extender.controllers.expansion.worker import Expander
from extender.kube.client import api_call, get_or_none, not_found, request_json
from extender.kube.events import EventRecorder
from extender.kube.informer import ADDED, DELETED, WatchCache
from extender.kube.resources import EVENTS, NODECLAIMS, PODS, collection_path, object_path
from extender.scheduling.inventory import GPUDevice
from extender.scheduling.state import ClusterState, GPUView

# ``ClusterState.node_gpus``: what the extender's inventory knows of a node's GPUs.
NodeGPUs = Callable[[str], Sequence[GPUView | GPUDevice]]


@dataclass(frozen=True)
class ExpansionCaches:
    """The caches the expander reads: ``gpu_pods`` holds the pods labelled as GPU workers; ``nodeclaims`` is
    the process's one NodeClaim cache (the capacity controllers read it too)."""

    nodes: WatchCache
    gpupools: WatchCache
    gpu_pods: WatchCache
    nodeclaims: WatchCache
    nodepools: WatchCache

    @property
    def all(self) -> tuple[WatchCache, ...]:
        return self.nodes, self.gpupools, self.gpu_pods, self.nodeclaims, self.nodepools


class KubeExpansionPort:
    """The expander's view of the API server, through caches the process shares."""

    def __init__(self, api_client: client.ApiClient, node_gpus: NodeGPUs, recorder: EventRecorder,
                 caches: ExpansionCaches, on_change: Callable[[], None] | None = None) -> None:
        self.api_client = api_client
        self._node_gpus = node_gpus
        self._recorder = recorder
        self._on_change = on_change
        self._by_provider: dict[str, str] = {}
        self.claims = caches.nodeclaims
        self.claims.subscribe(self._changed)
        self.nodepools = caches.nodepools
        self.nodepools.subscribe(self._changed)
        self.nodes = caches.nodes
        self.gpupools = caches.gpupools
        self.gpupools.subscribe(self._changed)
        self.gpu_pods = caches.gpu_pods
        self._node_added_at: float | None = None
        self.nodes.subscribe(self._node_changed)
        # Pending GPU pods the scheduler never sent to the extender (Expander.pod_changed picks them out).
        self.gpu_pods.subscribe(self._pod_changed)
        self._on_pod: Callable[[dict[str, Any]], None] | None = None

    def set_on_change(self, on_change: Callable[[], None]) -> None:
        self._on_change = on_change

    def set_on_pod(self, on_pod: Callable[[dict[str, Any]], None]) -> None:
        self._on_pod = on_pod

    # -- cached reads -----------------------------------------------------------------------------

    def node(self, name: str) -> Mapping[str, Any] | None:
        return self.nodes.get(name)

    def node_gpus(self, name: str) -> Sequence[GPUDevice]:
        return [device_of(gpu) for gpu in self._node_gpus(name)]

    def nodeclaims(self) -> Sequence[Mapping[str, Any]]:
        return self.claims.list()

    def nodeclaim(self, name: str) -> Mapping[str, Any] | None:
        return self.claims.get(name)

    def nodepool(self, name: str) -> Mapping[str, Any] | None:
        return self.nodepools.get(name)

    def all_nodepools(self) -> Sequence[Mapping[str, Any]]:
        return self.nodepools.list()

    def all_nodes(self) -> Sequence[Mapping[str, Any]]:
        return self.nodes.list()

    def gpupool(self, name: str) -> Mapping[str, Any] | None:
        return self.gpupools.get(name)

    def cached_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.gpu_pods.get(name, namespace)

    def node_added_at(self) -> float | None:
        return self._node_added_at

    def node_arrived(self, node_name: str, provider_id: str) -> bool:
        """The claim's Node exists, is usable (``karpenter.node_usable``) and its GPUs are in the inventory,
        so the scheduler can use it."""
        name = node_name if node_name and self.nodes.get(node_name) else ""
        name = name or self._by_provider.get(provider_id, "")
        node = self.nodes.get(name) if name else None
        return node is not None and node_usable(node) and bool(self._node_gpus(name))

    # -- writes and events ---------------------------------------------------------------------------

    def record(self, obj: Mapping[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        self._recorder.record(dict(obj), reason, message, type_)

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await get_or_none(self.api_client, object_path(PODS, name, namespace))

    async def pod_events(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        """The events on one pod (core/v1), e.g. Karpenter's Nominated."""
        answer = await api_call(request_json, self.api_client, "GET", collection_path(EVENTS, namespace),
                                query={"fieldSelector": f"involvedObject.uid={uid}"})
        return list((answer or {}).get("items") or [])

    async def create_nodeclaim(self, body: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = await api_call(request_json, self.api_client, "POST",
                                                 collection_path(NODECLAIMS), body=body)
        return created

    async def delete_nodeclaim(self, name: str) -> None:
        try:
            await api_call(request_json, self.api_client, "DELETE", object_path(NODECLAIMS, name))
        except Exception as exc:
            if not not_found(exc):
                raise

    # -- watch callbacks ----------------------------------------------------------------------------

    def _changed(self, event_type: str, obj: dict[str, Any]) -> None:
        if self._on_change is not None:
            self._on_change()

    def _pod_changed(self, event_type: str, obj: dict[str, Any]) -> None:
        if event_type != DELETED and self._on_pod is not None:
            self._on_pod(obj)

    def _node_changed(self, event_type: str, obj: dict[str, Any]) -> None:
        if event_type == ADDED and self.nodes.synced.is_set():
            self._node_added_at = time.monotonic()
        provider_id = str((obj.get("spec") or {}).get("providerID") or "")
        if provider_id:
            if event_type == DELETED:
                self._by_provider.pop(provider_id, None)
            else:
                self._by_provider[provider_id] = str((obj.get("metadata") or {}).get("name") or "")
        self._changed(event_type, obj)


def kube_expander(config: ExpansionConfig, api_client: client.ApiClient, state: ClusterState,
                  recorder: EventRecorder, caches: ExpansionCaches, registry: CollectorRegistry | None = None,
                  *, wait_for: Sequence[WatchCache] = ()) -> Expander:
    """The expander wired to the API server: the caches, inventory and recorder; its reconciles wait for
    ``caches`` and ``wait_for`` (the caches that feed ``state``) to sync."""
    port = KubeExpansionPort(api_client, state.node_gpus, recorder, caches)
    waited = tuple(dict.fromkeys((*wait_for, *caches.all)))
    expander = Expander(config, port, request_of=state.request_of, metrics=ExpansionMetrics(registry),
                        refilter=state.filter_with_quota, caches=waited)
    port.set_on_change(expander.wake)
    port.set_on_pod(expander.pod_changed)
    return expander

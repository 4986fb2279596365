"""The capacity controllers' view of the cluster through the API server, and their writes.

``LiveView`` reads the caches of GPUNodeClaims and NodeClaims beside the extender's own caches (Nodes,
GPUPools, GPU pods, the inventory) and builds the planners' ``Inputs`` from them, so that the live
controllers run exactly the code ``tf-extender plan`` runs. ``KubePort`` does the writes and events.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from kubernetes import client

from extender.common.conditions import with_condition
from extender.controllers.capacity.config import CapacityConfig
from extender.controllers.isolation import Isolation
from extender.controllers.runner import Synced
from extender.kube.client import api_call, error_message, get_or_none, not_found, request_json
from extender.kube.events import EventRecorder
from extender.kube.resources import GPU_POOLS, Resource, collection_path, object_path
from extender.planning.amounts import CapacityError
from extender.planning.catalog import CONFIGMAP_KEY, DEFAULT_CATALOG, Catalog, parse_catalog
from extender.planning.inputs import Inputs
from extender.planning.pool import PoolConfig, pool_config
from extender.scheduling.inventory import object_name
from extender.scheduling.state import ClusterState

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
CREATED_GRACE_SECONDS = 60.0
RELEASED_MEMORY_SECONDS = 600.0
CONFIG_VALID = "ConfigValid"  # a GPUPool condition: whether the extender can read the pool's settings


class ObjectStore(Protocol):
    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None: ...

    def list(self) -> list[dict[str, Any]]: ...


class WatchedStore(ObjectStore, Synced, Protocol):
    """A watch cache: read, synced once its first list is in (the runner waits for that before a
    controller's first pass), and telling ``subscribe``'s listeners of every change."""

    def subscribe(self, listener: Callable[[str, dict[str, Any]], None]) -> None: ...


class KubePort:
    """Writes, reads and events of the capacity controllers."""

    def __init__(self, api_client: client.ApiClient, recorder: EventRecorder) -> None:
        self.api_client = api_client
        self.recorder = recorder

    async def get(self, path: str) -> dict[str, Any] | None:
        return await get_or_none(self.api_client, path)

    async def create(self, resource: Resource, body: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = await api_call(request_json, self.api_client, "POST",
                                                 collection_path(resource), body=body)
        return created

    async def patch(self, resource: Resource, name: str, body: dict[str, Any],
                    subresource: str | None = None) -> None:
        path = object_path(resource, name, subresource=subresource)
        await api_call(request_json, self.api_client, "PATCH", path, body=body, content_type=MERGE_PATCH)

    async def delete(self, resource: Resource, name: str) -> bool:
        """Delete; False when it was already gone."""
        try:
            await api_call(request_json, self.api_client, "DELETE", object_path(resource, name))
        except Exception as exc:
            if not_found(exc):
                return False
            raise
        return True

    def record(self, obj: Mapping[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        self.recorder.record(dict(obj), reason, message, type_)


def node_ref(name: str, node: Mapping[str, Any] | None) -> dict[str, Any]:
    """An object an Event can be about, for a Node known by name (and uid when cached)."""
    meta = (node or {}).get("metadata") or {}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": meta.get("uid", "")}}


class LiveView:
    """What the planners read: the extender's caches (Nodes, GPUPools, GPU pods, the inventory) and the
    capacity package's (GPUNodeClaims, NodeClaims, GPUNodes), plus what the controllers remember between
    passes (nodes released, claims created but not cached yet)."""

    def __init__(self, config: CapacityConfig, state: ClusterState, *, nodes: ObjectStore, pools: ObjectStore,
                 pods: ObjectStore, gpunodeclaims: WatchedStore, nodeclaims: WatchedStore, port: KubePort,
                 gpunodes: ObjectStore | None = None) -> None:
        self.config = config
        self.gpunodes = gpunodes  # the process's GPUNode cache, when GPUNodes are watched
        self.state = state
        self.nodes = nodes
        self.pools = pools
        self.pods = pods
        self.port = port
        self.gpunodeclaims = gpunodeclaims
        self.nodeclaims = nodeclaims  # the process's one NodeClaim cache (node expansion reads it too)
        self._file_catalog: Catalog | None = None
        self._catalog = DEFAULT_CATALOG
        self._catalog_error = ""
        # Nodes compaction released, until they are gone: their capacity no longer counts, for any loop.
        self.released: dict[str, float] = {}
        # Claims created but not seen in the cache yet: counted as pending so a reconcile never buys twice.
        # An entry the cache never shows (the claim was deleted at once) is dropped after a minute.
        self.created: dict[str, dict[str, Any]] = {}
        self._created_at: dict[str, float] = {}
        # one pool at a time: a pool whose settings are not readable is named (event, condition), not fatal
        self.pool_isolation = Isolation("capacity", "GPUPool", self, condition=self._valid_condition)

    def record(self, obj: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        """An event on ``obj`` through the current port."""
        self.port.record(obj, reason, message, type_)

    async def pool_configs(self) -> list[PoolConfig]:
        """Every pool's settings, parsed one pool at a time. A pool with problems keeps them (the planners
        leave it alone) and is reported once per change: event ``InvalidGPUPool`` naming the field and the
        value, condition ``ConfigValid=False``; every other pool is planned as if it were absent."""
        configs = []
        for pool, config in self.pool_isolation.each(self.pools.list(), pool_config):
            if config.problems:
                self.pool_isolation.report(pool, "; ".join(config.problems))
            else:
                self.pool_isolation.ok(pool)
            configs.append(config)
        await self.pool_isolation.flush()
        return configs

    async def _valid_condition(self, pool: Mapping[str, Any], message: str | None) -> None:
        name = object_name(pool)
        fresh = self.pools.get(name) or pool
        wanted = {"type": CONFIG_VALID, "status": "True", "reason": "CheckPassed", "message": ""}
        if message is not None:
            wanted = {"type": CONFIG_VALID, "status": "False", "reason": "InvalidGPUPool",
                      "message": message[:1000]}
        await write_condition(self.port, fresh, name, wanted)

    async def catalog(self) -> Catalog:
        """The built-in catalog, extended by the file (read once) and the ConfigMap (read each time).
        A broken ConfigMap keeps the last good catalog and is logged once per change of the error."""
        if self.config.catalog_file and self._file_catalog is None:
            with open(self.config.catalog_file, encoding="utf-8") as handle:
                self._file_catalog = parse_catalog(handle.read())
        base = self._file_catalog or DEFAULT_CATALOG
        if not self.config.catalog_configmap:
            return base
        namespace, name = self.config.catalog_configmap.split("/", 1)
        error = ""
        try:
            configmap = await self.port.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
            if configmap is None:
                error = f"ConfigMap {namespace}/{name} not found; using the built-in catalog"
                self._catalog = base
            else:
                self._catalog = parse_catalog(str((configmap.get("data") or {}).get(CONFIGMAP_KEY, "")), base)
        except CapacityError as exc:
            error = f"catalog ConfigMap {namespace}/{name}: {exc}; keeping the last good catalog"
        except Exception as exc:
            error = (f"catalog ConfigMap {namespace}/{name}: {error_message(exc)}; "
                     "keeping the last good catalog")
        if error and error != self._catalog_error:
            log.warning("catalog", extra={"error": error})
        self._catalog_error = error
        return self._catalog

    async def node_classes(self, configs: Sequence[PoolConfig]) -> frozenset[tuple[str, str, str]]:
        """The NodeClasses the Karpenter-mode pools refer to that exist. One that cannot be checked (an
        error other than 404) counts as existing: Karpenter then reports the problem on the NodeClaim."""
        found = set()
        for config in configs:
            ref = config.node_class
            if ref is None:
                continue
            path = f"/apis/{ref.group}/{ref.version}/{ref.plural}/{ref.name}"
            try:
                exists = await self.port.get(path) is not None
            except Exception as exc:
                log.warning("NodeClass not checked", extra={"path": path, "error": error_message(exc)})
                exists = True
            if exists:
                found.add((ref.group, ref.kind, ref.name))
        return frozenset(found)

    def leaving(self) -> frozenset[str]:
        horizon = time.monotonic() - RELEASED_MEMORY_SECONDS
        for name in [n for n, at in self.released.items() if at < horizon or self.nodes.get(n) is None]:
            del self.released[name]
        return frozenset(self.released)

    def remember(self, name: str, claim: dict[str, Any]) -> None:
        self.created[name] = claim
        self._created_at.setdefault(name, time.monotonic())

    def gpunodeclaim_list(self) -> list[dict[str, Any]]:
        cached = self.gpunodeclaims.list()
        seen = {object_name(c) for c in cached}
        horizon = time.monotonic() - CREATED_GRACE_SECONDS
        for name in [n for n in self.created if n in seen or self._created_at.get(n, 0.0) < horizon]:
            del self.created[name]
            self._created_at.pop(name, None)
        return cached + list(self.created.values())

    def inputs(self, now: dt.datetime, catalog: Catalog,
               node_classes: frozenset[tuple[str, str, str]] | None,
               due: Callable[[PoolConfig], bool] | None = None,
               leaving: frozenset[str] = frozenset()) -> Inputs:
        inputs = Inputs(
            now=now, state=self.state, pools=self.pools.list(),
            nodes={object_name(n): n for n in self.nodes.list()}, gpunodeclaims=self.gpunodeclaim_list(),
            gpunodes={object_name(g): g for g in self.gpunodes.list()} if self.gpunodes is not None else {},
            nodeclaims=self.nodeclaims.list(), pods=self.pods.list(), node_classes=node_classes,
            catalog=catalog, protection_seconds=self.config.protection_seconds, leaving=leaving,
        )
        if due is not None:
            inputs.compaction_due = due
        return inputs


async def write_condition(port: KubePort, pool: Mapping[str, Any], name: str,
                          wanted: Mapping[str, str]) -> None:
    """Set one condition of a GPUPool's status (type, status, reason, message), keeping the others; nothing
    is written when it already reads so, and the transition time changes only with the status."""
    conditions = list((pool.get("status") or {}).get("conditions") or [])
    merged = with_condition(conditions, wanted)
    if merged == conditions:
        return
    try:
        await port.patch(GPU_POOLS, name, {"status": {"conditions": merged}}, subresource="status")
    except Exception as exc:
        log.warning("pool condition not written", extra={"pool": name, "error": error_message(exc)})

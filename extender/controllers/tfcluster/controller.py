"""The TensorFusionCluster controller (``tensorfusioncluster``): one reconciler, on the leader only.

Each pass plans every cluster (``derive.plan``) against the GPUPool cache the extender already keeps,
writes the pool actions (create; replace spec, labels and annotations as TensorFusion's Update does, as
a JSON patch guarded by the resourceVersion planned from; delete), checks
``spec.computingVendor`` (``vendor``; again when it changes, else at most once a minute) and merge-patches
the cluster's status only when it would say something new. Every derived change is an event on the cluster
(an overwritten hand edit on the pool too). A write that fails (a conflict with a concurrent edit, an API
error) changes nothing and is retried on the next pass; a cluster or pool change wakes the reconciler.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any, Protocol

from kubernetes import client

from extender.common.quantity import Format, QuantityError, format_quantity, parse_quantity
from extender.controllers.isolation import Isolation
from extender.controllers.tfcluster import derive, vendor
from extender.controllers.tfcluster.config import TFClusterConfig
from extender.kube.client import api_call, error_message, error_status, request_json
from extender.kube.events import EventRecorder
from extender.kube.informer import WatchCache
from extender.kube.resources import GPU_POOLS, TENSOR_FUSION_CLUSTERS, collection_path, object_path

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
VENDOR_RECHECK_SECONDS = 60.0
STATUS_KEYS = ("phase", "conditions", "totalPools", "totalNodes", "totalGPUs", "totalTFlops", "totalVRAM",
               "availableTFlops", "availableVRAM", "readyGPUPools", "notReadyGPUPools")
READY = "Ready"  # TensorFusion: ConditionStatusTypeReady
POOLS_READY = "GPUPoolReady"  # TensorFusion: ConditionStatusTypeGPUPool


class Store(Protocol):
    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None: ...

    def list(self) -> list[dict[str, Any]]: ...


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("metadata") or {}


def _sum(pools: Iterable[Mapping[str, Any]], key: str) -> Fraction:
    total = Fraction(0)
    for pool in pools:
        raw = (pool.get("status") or {}).get(key)
        if raw is None:
            continue
        try:
            total += parse_quantity(str(raw)).value
        except QuantityError:
            continue
    return total


def _count(pools: Iterable[Mapping[str, Any]], key: str) -> int:
    out = 0
    for pool in pools:
        raw = (pool.get("status") or {}).get(key)
        if isinstance(raw, int) and not isinstance(raw, bool):
            out += raw
    return out


def cluster_status(cluster: Mapping[str, Any], plan: derive.Plan, owned: Sequence[Mapping[str, Any]],
                   connection: vendor.Connection | None, now: str) -> dict[str, Any]:
    """The status the cluster should carry after this pass (pure)."""
    stored = cluster.get("status") or {}
    conditions = [dict(c) for c in (stored.get("conditions") or []) if isinstance(c, Mapping)]
    if plan.problems:
        pools_condition = {"type": POOLS_READY, "status": "False", "reason": "InvalidGPUPools",
                           "message": "; ".join(plan.problems)}
    elif plan.actions:
        pools_condition = {"type": POOLS_READY, "status": "False", "reason": "ResourcesUpdated",
                           "message": ", ".join(f"{a.verb.value} {a.name}" for a in plan.actions)}
    else:
        pools_condition = {"type": POOLS_READY, "status": "True", "reason": "CheckPassed",
                           "message": f"{len(plan.in_step)} GPUPools in step with spec.gpuPools"}
    conditions = derive.set_condition(conditions, pools_condition, now)
    if connection is not None:
        conditions = derive.set_condition(conditions, connection.condition(), now)
    else:
        conditions = [c for c in conditions if c.get("type") != vendor.CONDITION]
    ready = pools_condition["status"] == "True" and (connection is None or connection.ok)
    if ready:
        ready_condition = {"type": READY, "status": "True", "reason": "CheckPassed", "message": ""}
    else:
        failing = pools_condition if pools_condition["status"] != "True" else (
            connection.condition() if connection is not None else pools_condition)
        ready_condition = {"type": READY, "status": "False", "reason": str(failing["reason"]),
                           "message": str(failing.get("message", ""))}
    conditions = derive.set_condition(conditions, ready_condition, now)
    deleting = bool(_meta(cluster).get("deletionTimestamp"))
    total_t, total_v = _sum(owned, "totalTFlops"), _sum(owned, "totalVRAM")
    in_step = set(plan.in_step)
    return {
        "phase": "Destroying" if deleting else ("Running" if ready else "Updating"),
        "conditions": conditions,
        "totalPools": len(derive.entries(cluster)[0]),
        "totalNodes": _count(owned, "totalNodes"),
        "totalGPUs": _count(owned, "totalGPUs"),
        "totalTFlops": format_quantity(total_t),
        "totalVRAM": format_quantity(int(total_v), Format.BINARY_SI),
        "availableTFlops": format_quantity(_sum(owned, "availableTFlops")),
        "availableVRAM": format_quantity(int(_sum(owned, "availableVRAM")), Format.BINARY_SI),
        "readyGPUPools": sorted(str(_meta(p).get("name")) for p in owned if _meta(p).get("name") in in_step),
        "notReadyGPUPools": sorted(str(_meta(p).get("name")) for p in owned
                                   if _meta(p).get("name") not in in_step),
    }


def _without_times(status: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: status.get(k) for k in STATUS_KEYS}
    out["conditions"] = sorted(
        ({k: v for k, v in c.items() if k != "lastTransitionTime"} for c in (status.get("conditions") or [])
         if isinstance(c, Mapping)), key=lambda c: str(c.get("type")))
    return out


class _Reader:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client

    async def list_one(self, path: str) -> Any:
        return await api_call(request_json, self.api_client, "GET", path, query={"limit": 1})


class TFClusterController:
    """Every TensorFusionCluster's GPUPools and status, one pass over all clusters per ``reconcile``."""

    def __init__(self, config: TFClusterConfig, api_client: client.ApiClient, *, pools: WatchCache,
                 clusters: WatchCache, recorder: EventRecorder) -> None:
        self.config = config
        self.api_client = api_client
        self.pools = pools
        self.clusters = clusters  # the process's one cache (the capacity controllers read it too)
        self.recorder = recorder
        self._reader = _Reader(api_client)
        self._connections: dict[str, tuple[str, float, vendor.Connection]] = {}
        self._reported: dict[str, tuple[str, ...]] = {}
        self.isolation = Isolation("tensorfusion-clusters", "TensorFusionCluster", recorder)

    async def reconcile(self, now: dt.datetime) -> None:
        pools = self.pools.list()
        # one cluster at a time: one that fails is logged and evented once per change; the others go on
        await self.isolation.each_async(sorted(self.clusters.list(), key=lambda c: str(_meta(c).get("name"))),
                                        lambda cluster: self._one(cluster, pools, now))

    async def _one(self, cluster: dict[str, Any], pools: list[dict[str, Any]], now: dt.datetime) -> None:
        await self.reconcile_one(cluster, pools, now)
        self.isolation.ok(cluster)

    async def reconcile_one(self, cluster: dict[str, Any], pools: list[dict[str, Any]],
                            now: dt.datetime) -> None:
        name = str(_meta(cluster).get("name"))
        plan = derive.plan(cluster, pools)
        if _meta(cluster).get("deletionTimestamp"):
            plan = derive.Plan([], plan.problems, plan.in_step)  # the garbage collector takes the pools
        for action in plan.actions:
            await self._apply(cluster, action)
        problems = tuple(plan.problems)
        if problems and self._reported.get(name) != problems:
            for problem in problems:
                self.recorder.record(cluster, "InvalidGPUPool", problem, "Warning")
            log.warning("TensorFusionCluster entries not derived",
                        extra={"cluster": name, "problems": problems})
        self._reported[name] = problems
        connection = await self._connection(cluster)
        owned = [p for p in self.pools.list() if derive.owned_by(p, cluster)]
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        wanted = cluster_status(cluster, plan, owned, connection, stamp)
        stored = cluster.get("status") or {}
        if _without_times(wanted) == _without_times(stored):
            return
        before = {c.get("type"): c.get("status") for c in stored.get("conditions") or []
                  if isinstance(c, Mapping)}
        if connection is not None and before.get(vendor.CONDITION) != ("True" if connection.ok else "False"):
            self.recorder.record(cluster, vendor.CONDITION if connection.ok else connection.reason,
                                 connection.message, "Normal" if connection.ok else "Warning")
        path = object_path(TENSOR_FUSION_CLUSTERS, name, subresource="status")
        await api_call(request_json, self.api_client, "PATCH", path, body={"status": wanted},
                       content_type=MERGE_PATCH)
        if stored.get("phase") != wanted["phase"]:
            log.info("TensorFusionCluster phase", extra={"cluster": name, "phase": wanted["phase"]})

    async def _connection(self, cluster: Mapping[str, Any]) -> vendor.Connection | None:
        name = str(_meta(cluster).get("name"))
        config = (cluster.get("spec") or {}).get("computingVendor")
        if not isinstance(config, Mapping) or not config.get("type"):
            self._connections.pop(name, None)
            return None
        # the key files' stamps are part of what was checked: a rotated Secret is checked again at once
        digest = derive.template_hash({"computingVendor": config, "keyFiles": vendor.key_files_stamp(config)})
        cached = self._connections.get(name)
        fresh = cached is not None and time.monotonic() - cached[1] < VENDOR_RECHECK_SECONDS
        if cached is not None and fresh and cached[0] == digest:
            return cached[2]
        check = vendor.connection_check(str(config.get("type")), self.config.cloud_key_dir,
                                        self.config.cloud_endpoints)
        connection = await check(config, self._reader)
        self._connections[name] = (digest, time.monotonic(), connection)
        return connection

    async def _apply(self, cluster: dict[str, Any], action: derive.PoolAction) -> None:
        cluster_name = str(_meta(cluster).get("name"))
        try:
            if action.verb is derive.Verb.CREATE:
                await api_call(request_json, self.api_client, "POST", collection_path(GPU_POOLS),
                               body=action.body)
            elif action.verb is derive.Verb.DELETE:
                await api_call(request_json, self.api_client, "DELETE", object_path(GPU_POOLS, action.name))
            else:
                await api_call(request_json, self.api_client, "PATCH", object_path(GPU_POOLS, action.name),
                               body=action.json_patch(), content_type=JSON_PATCH)
        except Exception as exc:
            status = error_status(exc)
            if status in (404, 409):  # the cache is behind our own or someone's write: the next pass sees it
                log.info("GPUPool write deferred", extra={
                    "cluster": cluster_name, "pool": action.name, "verb": action.verb.value,
                    "error": error_message(exc)})
                return
            log.warning("GPUPool write failed", extra={
                "cluster": cluster_name, "pool": action.name, "verb": action.verb.value,
                "error": error_message(exc)})
            self.recorder.record(cluster, "GPUPoolWriteFailed",
                                 f"{action.verb.value} GPUPool {action.name}: {error_message(exc)}",
                                 "Warning")
            return
        message = f"GPUPool {action.name}: {action.reason}"
        log.info("GPUPool derived", extra={"cluster": cluster_name, "pool": action.name,
                                           "verb": action.verb.value, "reason": action.reason})
        warning = action.verb is derive.Verb.OVERWRITE
        self.recorder.record(cluster, action.event_reason, message, "Warning" if warning else "Normal")
        if warning:
            self.recorder.record(action.body, action.event_reason,
                                 f"overwritten from TensorFusionCluster {cluster_name}: {action.reason}",
                                 "Warning")

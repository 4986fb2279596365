"""Defragmentation on a cluster snapshot, offline: the evictions a run would make now, and the nodes it
would leave as they are. The same planner as the live loop (``plan.plan_pool``) on a state built from the
snapshot's objects (Nodes, GPUs, GPUPools, SchedulingConfigTemplates, Pods, PodDisruptionBudgets)."""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Iterable
from typing import Any

from extender.defrag.config import DefragConfigError, parse_config
from extender.defrag.plan import Snapshot, actions, plan_pool
from extender.inventory import object_name
from extender.simulate import load_cluster
from extender.state import ClusterState, pod_key


def snapshot_of(objects: Iterable[dict[str, Any]]) -> Snapshot:
    nodes: dict[str, dict[str, Any]] = {}
    pods_by_node: dict[str, list[dict[str, Any]]] = {}
    pdbs: list[dict[str, Any]] = []
    for obj in objects:
        kind = obj.get("kind")
        if kind == "Node":
            nodes[object_name(obj)] = obj
        elif kind == "Pod":
            node = (obj.get("spec") or {}).get("nodeName")
            if node:
                pods_by_node.setdefault(str(node), []).append(obj)
        elif kind == "PodDisruptionBudget":
            pdbs.append(obj)
    return Snapshot(nodes, pods_by_node, pdbs)


def with_uids(objects: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of the objects; a pod without a uid gets one from its name, so the state and the snapshot
    agree on who is who."""
    out = []
    for obj in objects:
        obj = copy.deepcopy(obj)
        if obj.get("kind") == "Pod":
            meta = obj.setdefault("metadata", {})
            meta.setdefault("namespace", "default")
            if not meta.get("uid"):
                meta["uid"] = f"snapshot/{pod_key(obj)}"
        out.append(obj)
    return out


def defrag_actions(objects: Iterable[dict[str, Any]], now: dt.datetime,
                   state: ClusterState | None = None) -> list[dict[str, Any]]:
    """For every pool with defragmentation enabled, the plan's "evict" and "skip" lines; a pool whose
    settings cannot be used gets one "skip" line (no node) saying why."""
    objects = with_uids(objects)
    if state is None:
        state = ClusterState()
        load_cluster(state, objects)
    snapshot = snapshot_of(objects)
    out: list[dict[str, Any]] = []
    for pool in sorted((o for o in objects if o.get("kind") == "GPUPool"), key=object_name):
        name = object_name(pool)
        try:
            config = parse_config(pool)
        except DefragConfigError as exc:
            out.append({"action": "skip", "pool": name, "node": None, "reason": str(exc)})
            continue
        if config.enabled:
            out.extend(actions(plan_pool(state, name, config, snapshot, now)))
    return out

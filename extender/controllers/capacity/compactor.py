"""Compaction of empty nodes, for AutoSelect and Karpenter-mode pools (leader only).

A pool's compaction is due every ``nodeManagerConfig.nodeCompaction.period`` (default 5m; the first
pass right after start) and at once when the pool carries ``tensor-fusion.ai/manual-compaction`` with a
timestamp younger than a minute that was not handled yet. Each reconcile runs the compaction planner and
carries out its actions, with an event on the node and a metric for every one:

- ``release``: AutoSelect: label ``tensor-fusion.ai/should-delete=true`` and remove our
  ``karpenter.sh/do-not-disrupt`` (Karpenter's consolidation then removes the empty node); Karpenter
  mode: delete the NodeClaim (Karpenter drains and terminates the node) and the GPUNodeClaim;
- ``protect`` / ``unprotect``: add / remove ``karpenter.sh/do-not-disrupt: "true"`` (with our marker
  annotation, so a user's own annotation is never removed) on empty nodes kept for warm or min capacity;
- ``unmark``: remove ``tensor-fusion.ai/should-delete`` from a node that is needed again or busy.
"""

from __future__ import annotations

import datetime as dt
import logging
import time

from prometheus_client import CollectorRegistry, Counter

from extender.common.labels import DO_NOT_DISRUPT, PROTECTED_BY, SHOULD_DELETE
from extender.controllers.capacity.compaction_plan import NodePayload, plan_compaction
from extender.controllers.capacity.port import KubePort, LiveView, node_ref
from extender.kube.client import error_message
from extender.kube.resources import GPU_NODE_CLAIMS, NODECLAIMS, NODES
from extender.planning.action import Action
from extender.planning.pool import PoolConfig

log = logging.getLogger(__name__)

EVENT_REASONS = {"release": "CompactionRelease", "protect": "CompactionKeep",
                 "unprotect": "CompactionSurplus", "unmark": "CompactionUnmark"}


class CompactorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.actions = Counter("tf_extender_compaction_actions_total",
                               "Compaction decisions carried out, by pool and action "
                               "(release, protect, unprotect, unmark)", ["pool", "action"], registry=registry)
        self.runs = Counter("tf_extender_compaction_runs_total", "Compaction passes that could release nodes",
                            ["pool", "trigger"], registry=registry)


class Compactor:
    def __init__(self, view: LiveView, port: KubePort, metrics: CompactorMetrics,
                 manual_window_seconds: float) -> None:
        self.view = view
        self.port = port
        self.metrics = metrics
        self.manual_window = manual_window_seconds
        self.last_run: dict[str, dt.datetime] = {}
        self.manual_done: dict[str, dt.datetime] = {}

    def trigger(self, config: PoolConfig, now: dt.datetime) -> str | None:
        """Why the pool's compaction is due now ("manual", "period"), or None."""
        manual = config.manual_compaction
        if manual is not None and manual != self.manual_done.get(config.name) \
                and abs((now - manual).total_seconds()) <= self.manual_window:
            return "manual"
        last = self.last_run.get(config.name)
        if last is None or (now - last).total_seconds() >= config.compaction_period:
            return "period"
        return None

    async def reconcile(self, now: dt.datetime) -> list[Action]:
        configs = await self.view.pool_configs()
        triggers = {c.name: t for c in configs if (t := self.trigger(c, now)) is not None}
        inputs = self.view.inputs(now, await self.view.catalog(), None, due=lambda c: c.name in triggers,
                                  leaving=self.view.leaving())
        actions = list(plan_compaction(inputs))
        for action in actions:
            log.info("plan", extra={"plan": action.as_json()})
            await self.execute(action)
        for config in configs:
            trigger = triggers.get(config.name)
            if trigger is None:
                continue
            self.metrics.runs.labels(config.name, trigger).inc()
            self.last_run[config.name] = now
            if trigger == "manual" and config.manual_compaction is not None:
                self.manual_done[config.name] = config.manual_compaction
        return actions

    async def execute(self, action: Action) -> None:
        payload: NodePayload = action.payload
        node = str(action.node)
        try:
            if action.action == "release" and payload.gpunodeclaim:
                self.view.released[node] = time.monotonic()
                await self.port.delete(GPU_NODE_CLAIMS, payload.gpunodeclaim)
            elif action.action == "release" and payload.nodeclaim:
                self.view.released[node] = time.monotonic()
                await self.port.delete(NODECLAIMS, payload.nodeclaim)
                await self.port.delete(GPU_NODE_CLAIMS, payload.nodeclaim)
            elif action.action == "release":
                await self.port.patch(NODES, node, {"metadata": {
                    "labels": {SHOULD_DELETE: "true"}, "annotations": self._unprotect(node)}})
            elif action.action == "protect":
                await self.port.patch(NODES, node, {"metadata": {"annotations": {
                    DO_NOT_DISRUPT: "true", PROTECTED_BY: "warm-or-min-capacity"}}})
            elif action.action == "unprotect":
                await self.port.patch(NODES, node, {"metadata": {"annotations": self._unprotect(node)}})
            elif action.action == "unmark":
                await self.port.patch(NODES, node, {"metadata": {"labels": {SHOULD_DELETE: None}}})
        except Exception as exc:
            log.warning("compaction action failed",
                        extra={"plan": action.as_json(), "error": error_message(exc)})
            return
        self.metrics.actions.labels(action.pool, action.action).inc()
        reason = EVENT_REASONS.get(action.action, "Compaction")
        message = f"pool {action.pool}: {action.reason}"
        self.port.record(node_ref(node, self.view.nodes.get(node)), reason, message)

    def _unprotect(self, node: str) -> dict[str, None]:
        annotations = ((self.view.nodes.get(node) or {}).get("metadata") or {}).get("annotations") or {}
        return {DO_NOT_DISRUPT: None, PROTECTED_BY: None} if PROTECTED_BY in annotations else {}

"""The Karpenter-mode provisioner: launches from the plan, GPUNodeClaim phases, the pool condition.

Each reconcile (leader only):

1. moves every GPUNodeClaim along Pending -> Creating (its NodeClaim exists) -> Bound (the node
   registered and its GPUs are in the inventory); a claim whose NodeClaim vanished after Creating is
   deleted (Karpenter gave up on the launch or the node is gone), one whose NodeClaim was never created
   gets it again;
2. runs the launch planner and carries out each ``launch`` (a GPUNodeClaim, its status, then the
   NodeClaim owned by it) and turns each ``skip`` into a Warning event on the pool;
3. keeps the pool condition ``NodeClaimsListable`` in step with whether NodeClaims can be listed.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from extender.controllers.capacity.gpunodeclaim import (
    BOUND,
    CREATING,
    PENDING,
    claim_name,
    claim_phase,
    gpunodeclaim_body,
    is_provisioned_claim,
    nodeclaim_body,
)
from extender.controllers.capacity.launch_plan import LaunchPayload, plan_launches
from extender.controllers.capacity.port import KubePort, LiveView, write_condition
from extender.kube.client import error_message, error_status, not_found
from extender.kube.resources import GPU_NODE_CLAIMS, NODECLAIMS, collection_path
from extender.planning.action import Action
from extender.planning.inputs import claim_pool, claim_price
from extender.planning.offerings import Offering
from extender.planning.pool import PoolConfig, ProvisioningMode
from extender.scheduling.inventory import object_name

log = logging.getLogger(__name__)

# After a failed create, a pool's launches wait this long, so a rejected NodeClaim is not retried in a loop.
FAILURE_BACKOFF_SECONDS = 60.0
SKIP_LOG_SECONDS = 60.0
CONDITION = "NodeClaimsListable"


class LauncherMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.created = Counter("tf_extender_gpunodeclaims_created_total",
                               "GPUNodeClaims (with their NodeClaims) created for Karpenter-mode pools",
                               ["pool", "instance_type", "capacity_type"], registry=registry)
        self.skipped = Counter("tf_extender_capacity_skips_total",
                               "Reconciles in which a Karpenter-mode pool could not be served, by reason",
                               ["pool", "reason"], registry=registry)
        self.phases = Counter("tf_extender_gpunodeclaim_transitions_total",
                              "GPUNodeClaim phase changes", ["phase"], registry=registry)


class Launcher:
    def __init__(self, view: LiveView, port: KubePort, metrics: LauncherMetrics) -> None:
        self.view = view
        self.port = port
        self.metrics = metrics
        self._listable: bool | None = None
        self._held: dict[str, float] = {}  # pool -> monotonic time its launches may resume
        self._skips_logged: dict[str, tuple[str, float]] = {}
        self._list_error = ""

    async def reconcile(self, now: dt.datetime) -> list[Action]:
        karpenter_pools = [c for c in await self.view.pool_configs() if c.mode is ProvisioningMode.KARPENTER]
        if not karpenter_pools:
            return []
        await self._check_listable()
        await self.sync_claims()
        catalog = await self.view.catalog()
        inputs = self.view.inputs(now, catalog, await self.view.node_classes(karpenter_pools),
                                  leaving=self.view.leaving())
        actions = list(plan_launches(inputs))
        for action in actions:
            self._log(action)
            pool = self.view.pools.get(action.pool) or {"kind": "GPUPool", "metadata": {"name": action.pool}}
            if action.action == "launch":
                if self._held.get(action.pool, 0.0) > time.monotonic():
                    log.info("launch held after a failed create", extra={"pool": action.pool})
                    continue
                if not await self.launch(action, pool):
                    self._held[action.pool] = time.monotonic() + FAILURE_BACKOFF_SECONDS
            elif action.action == "skip":
                event = str(action.details.get("event") or "Skipped")
                self.metrics.skipped.labels(action.pool, event).inc()
                self.port.record(pool, event, action.reason, "Warning")
        await self._conditions([c.name for c in karpenter_pools])
        return actions

    def _log(self, action: Action) -> None:
        """Every launch; a skip only when it changed or a minute passed (a blocked pool repeats each
        reconcile)."""
        line = action.as_json()
        if action.action == "skip":
            key = repr(sorted(line.items()))
            if self._skips_logged.get(action.pool, ("", 0.0))[0] == key and \
                    time.monotonic() - self._skips_logged[action.pool][1] < SKIP_LOG_SECONDS:
                return
            self._skips_logged[action.pool] = (key, time.monotonic())
        log.info("plan", extra={"plan": line})

    # -- launches ---------------------------------------------------------------------------------------

    async def launch(self, action: Action, pool: Mapping[str, Any]) -> bool:
        """Create the action's claims; False when a create failed (the rest of the action is dropped)."""
        payload: LaunchPayload = action.payload
        offer = payload.launch.offering
        for _ in range(payload.launch.count):
            name = claim_name(payload.config.name)
            try:
                body = gpunodeclaim_body(payload.config, offer, name)
                claim = await self.port.create(GPU_NODE_CLAIMS, body)
            except Exception as exc:
                message = f"{name}: {error_message(exc)}"
                log.warning("GPUNodeClaim not created", extra={"pool": action.pool, "error": message})
                self.port.record(pool, "GPUNodeClaimCreationFailed", message, "Warning")
                return False
            self.view.remember(name, {**claim, "status": {"phase": PENDING}})
            await self._set_phase(claim, PENDING)
            try:
                await self.port.create(NODECLAIMS, nodeclaim_body(
                    payload.config, offer, name, str(claim["metadata"]["uid"])))
            except Exception as exc:
                message = (f"NodeClaim {name}: {error_message(exc)}; its GPUNodeClaim is deleted again and "
                           f"the pool's launches wait {FAILURE_BACKOFF_SECONDS:.0f}s")
                log.warning("NodeClaim not created", extra={"pool": action.pool, "error": message})
                self.port.record(pool, "NodeClaimCreationFailed", message, "Warning")
                self.view.created.pop(name, None)
                await self.port.delete(GPU_NODE_CLAIMS, name)
                return False
            await self._set_phase(claim, CREATING)
            self.view.remember(name, {**claim, "status": {"phase": CREATING}})
            self.metrics.created.labels(payload.config.name, offer.instance.name, offer.capacity_type).inc()
            zone = f" in {offer.zone}" if offer.zone else ""
            self.port.record(pool, "GPUNodeClaimCreated", (
                f"{name}: {offer.instance.name} ({offer.capacity_type}{zone}, "
                f"{float(offer.price):.4f} USD/h); {action.reason}"))
        return True

    # -- phases -----------------------------------------------------------------------------------------

    async def _set_phase(self, claim: Mapping[str, Any], phase: str, node: str = "") -> None:
        name = object_name(claim)
        try:
            if node:
                await self.port.patch(GPU_NODE_CLAIMS, name, {"spec": {"nodeName": node}})
            await self.port.patch(GPU_NODE_CLAIMS, name, {"status": {"phase": phase}}, subresource="status")
        except Exception as exc:
            if not not_found(exc):
                log.warning("GPUNodeClaim phase not written",
                            extra={"claim": name, "phase": phase, "error": error_message(exc)})
            return
        self.metrics.phases.labels(phase).inc()
        log.info("GPUNodeClaim phase", extra={"claim": name, "phase": phase, "node": node or None})
        where = f" on node {node}" if node else ""
        self.port.record(dict(claim), phase, f"GPUNodeClaim {name} is {phase}{where}")

    async def sync_claims(self) -> None:
        """The claims of Karpenter-mode pools only: a Provisioned pool's claims have no NodeClaim (their VM
        is the provisioned controller's)."""
        configs = {c.name: c for c in await self.view.pool_configs() if c.mode is ProvisioningMode.KARPENTER}
        for claim in self.view.gpunodeclaims.list():
            meta = claim.get("metadata") or {}
            pool = claim_pool(claim)
            if meta.get("deletionTimestamp") or pool not in configs or is_provisioned_claim(claim):
                continue
            name, phase = object_name(claim), claim_phase(claim)
            nodeclaim = self.view.nodeclaims.get(name)
            if nodeclaim is None:
                if name in self.view.created:
                    continue
                if phase == PENDING:
                    await self._recreate(claim, configs[pool])
                else:
                    message = (f"NodeClaim {name} no longer exists (phase was {phase}); "
                               "the GPUNodeClaim is deleted")
                    log.info(message, extra={"claim": name, "phase": phase})
                    self.port.record(claim, "NodeClaimGone", message, "Warning")
                    await self.port.delete(GPU_NODE_CLAIMS, name)
                continue
            node = str((nodeclaim.get("status") or {}).get("nodeName") or "")
            if node and self.view.state.node_gpus(node):
                if phase != BOUND:
                    await self._set_phase(claim, BOUND, node)
            elif phase == PENDING:
                await self._set_phase(claim, CREATING)

    async def _recreate(self, claim: Mapping[str, Any], config: PoolConfig) -> None:
        """The NodeClaim of a Pending GPUNodeClaim, again (the extender stopped between the two creates)."""
        spec = claim.get("spec") or {}
        instance = (await self.view.catalog()).get(str(spec.get("instanceType") or ""))
        if instance is None:
            return
        offer = Offering(instance, str(spec.get("capacityType") or "on-demand"), str(spec.get("zone") or ""),
                         claim_price(claim) or Fraction(0))
        try:
            await self.port.create(NODECLAIMS, nodeclaim_body(config, offer, object_name(claim),
                                                              str((claim.get("metadata") or {}).get("uid"))))
        except Exception as exc:
            if error_status(exc) != 409:
                log.warning("NodeClaim not recreated", extra={"claim": object_name(claim),
                                                              "error": error_message(exc)})
            return
        await self._set_phase(claim, CREATING)

    # -- pool condition ---------------------------------------------------------------------------------

    async def _check_listable(self) -> None:
        try:
            await self.port.get(collection_path(NODECLAIMS) + "?limit=1")
            self._listable, self._list_error = True, ""
        except Exception as exc:
            self._listable, self._list_error = False, error_message(exc)

    async def _conditions(self, pools: list[str]) -> None:
        if self._listable is None:
            return
        status = "True" if self._listable else "False"
        wanted = {
            "type": CONDITION, "status": status,
            "reason": "Listed" if self._listable else "ListFailed",
            "message": "Karpenter NodeClaims can be listed" if self._listable else (
                f"cannot list Karpenter NodeClaims: {self._list_error}"),
        }
        for name in pools:
            await write_condition(self.port, self.view.pools.get(name) or {}, name, wanted)

"""Registration: each GPUNodeClaim of a Provisioned pool moves along Pending (created, carrying our
finalizer) -> Creating (``status.instanceID``) -> Bound (a Node labelled
``tensor-fusion.ai/node-provisioner=<claim>`` registered and its GPUs are in the inventory). A Pending claim's
instance is created again, which finds the instance already tagged with the claim (an extender killed
between create and status write buys nothing twice). A claim whose Node has not joined within the join
timeout, or whose VM is gone, is deleted (Warning ``NodeNotJoined`` / ``InstanceGone``)."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Mapping
from typing import Any

from extender.cloud.nodeclass import parse_node_class
from extender.cloud.provider import CloudError, Provider
from extender.common.contract import POOL_LABEL
from extender.common.labels import GFD_COUNT, GFD_MEMORY, GFD_PRODUCT, NODE_PROVISIONER
from extender.controllers.capacity.gpunodeclaim import BOUND, claim_phase, label_value
from extender.controllers.capacity.provisioned.cloud import Cloud, Picture, created_at
from extender.controllers.capacity.provisioned.launch import create_instance
from extender.controllers.capacity.vendors import VendorChoice
from extender.kube.client import error_message
from extender.kube.resources import NODES
from extender.planning.inputs import claim_pool
from extender.planning.pool import PoolConfig
from extender.scheduling.inventory import object_name

log = logging.getLogger(__name__)

BOUND_CHECK_SECONDS = 60.0  # a Bound claim's VM is described this often
_MIB = 1 << 20


class Registration:
    """The claims of Provisioned pools that work, not being deleted: their phase, their Node's labels, and
    the join timeout."""

    def __init__(self, cloud: Cloud) -> None:
        self.cloud = cloud

    async def reconcile(self, now: dt.datetime) -> None:
        await self.cloud.turn(lambda picture: self._pass(picture, now))

    async def _pass(self, picture: Picture, now: dt.datetime) -> None:
        problems = picture.vendor_problems(self.cloud)
        by_pool = {c.name: c for c in picture.configs if c.name not in problems}

        async def step(claim: dict[str, Any]) -> None:
            owner = by_pool.get(claim_pool(claim))
            choice = picture.claim_choice[object_name(claim)]
            if owner is not None and not (claim.get("status") or {}).get("instanceID"):
                # a VM still to make goes through the pool's vendor: the vendor a claim records (an
                # annotation whoever may patch the claim can edit) only describes and terminates its own VM
                choice = picture.pool_choice[owner.name]
            provider = picture.providers[choice.key]
            if owner is not None and provider is not None and \
                    not (claim.get("metadata") or {}).get("deletionTimestamp"):
                await self._sync(claim, owner, choice, provider, now)

        await self.cloud.claim_isolation.each_async(picture.claims, step)  # one claim never stops the others

    async def _sync(
        self, claim: dict[str, Any], config: PoolConfig, choice: VendorChoice, provider: Provider,
        now: dt.datetime,
    ) -> None:
        cloud = self.cloud
        name, phase = object_name(claim), claim_phase(claim)
        instance_id = str((claim.get("status") or {}).get("instanceID") or "")
        pool = cloud.view.pools.get(config.name) or {}
        if not instance_id:
            if name in cloud.view.created:
                return
            obj = cloud.node_classes.get(config.gpu_node_class)
            node_class = parse_node_class(obj) if obj is not None else None
            if node_class is None or node_class.problems:
                return
            await create_instance(cloud, claim, config, node_class, choice, provider, pool, {})
            return
        node = cloud.node_of(name)
        if node is not None:
            await self._label(node, config, claim)
            node_name = object_name(node)
            if phase != BOUND and cloud.view.state.node_gpus(node_name):
                await cloud.set_status(claim, {"phase": BOUND, "instanceID": instance_id}, node_name)
                return
        moment = time.monotonic()
        if phase == BOUND and moment - cloud.checked.get(name, 0.0) < BOUND_CHECK_SECONDS:
            return
        cloud.checked[name] = moment
        try:
            instance = await provider.describe(instance_id)
        except CloudError as exc:
            cloud.failed(exc, cloud.vendors.get(choice.key))
            log.warning("VM not described", extra={"claim": name, "error": str(exc)})
            return
        if instance is None or instance.gone:
            state = instance.state if instance else "unknown to the cloud"
            message = f"{name}: VM {instance_id} is {state}; the GPUNodeClaim is deleted"
            cloud.port.record(claim, "InstanceGone", message, "Warning")
            await cloud.delete(name)
            return
        created = created_at(claim)
        if (
            phase != BOUND
            and node is None
            and created is not None
            and (now - created).total_seconds() > cloud.config.join_timeout_seconds
        ):
            message = (
                f"{name}: no Node labelled {NODE_PROVISIONER}={name} joined within "
                f"{cloud.config.join_timeout_seconds:.0f}s; VM {instance_id} is terminated (check the "
                "GPUNodeClass userData)"
            )
            log.warning("node not joined", extra={"claim": name, "instance": instance_id})
            cloud.port.record(claim, "NodeNotJoined", message, "Warning")
            cloud.port.record(pool, "NodeNotJoined", message, "Warning")
            cloud.metrics.terminated.labels("not_joined").inc()
            await cloud.delete(name)

    async def _label(self, node: Mapping[str, Any], config: PoolConfig, claim: Mapping[str, Any]) -> None:
        """The pool label, the pool's gpuNodeLabels and the GPU discovery labels of the instance type, where
        the Node does not carry them yet (GPU Feature Discovery, when it runs, writes the same)."""
        labels = (node.get("metadata") or {}).get("labels") or {}
        wanted: dict[str, str] = {**config.labels, POOL_LABEL: config.name}
        spec = claim.get("spec") or {}
        instance = (await self.cloud.view.catalog()).get(str(spec.get("instanceType") or ""))
        if instance is not None:
            wanted.setdefault(GFD_COUNT, str(instance.gpu_count))
            wanted.setdefault(GFD_MEMORY, str(instance.vram_per_gpu // _MIB))
            if label_value(instance.gpu_model):
                wanted.setdefault(GFD_PRODUCT, label_value(instance.gpu_model))
        missing = {k: v for k, v in wanted.items() if k not in labels}
        if missing:
            try:
                await self.cloud.port.patch(NODES, object_name(node), {"metadata": {"labels": missing}})
            except Exception as exc:
                log.warning(
                    "node not labelled", extra={"node": object_name(node), "error": error_message(exc)}
                )

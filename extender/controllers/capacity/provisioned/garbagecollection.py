"""Garbage collection: once per distinct provider (at most every half grace period, between the capacity
interval and a minute), the VMs tagged for this cluster (``--cluster-name``) that no GPUNodeClaim owns are
terminated once older than ``--orphan-grace`` (Warning ``OrphanTerminated`` on their pool)."""

from __future__ import annotations

import datetime as dt
import logging
import time

from extender.cloud.provider import CloudError, Provider
from extender.common.contract import POOL_LABEL
from extender.controllers.capacity.provisioned.cloud import Cloud, Picture
from extender.controllers.capacity.vendors import VendorKey
from extender.scheduling.inventory import object_name

log = logging.getLogger(__name__)


class GarbageCollection:
    """The orphan sweep."""

    def __init__(self, cloud: Cloud) -> None:
        self.cloud = cloud

    async def reconcile(self, now: dt.datetime) -> None:
        await self.cloud.turn(lambda picture: self._pass(picture, now))

    async def _pass(self, picture: Picture, now: dt.datetime) -> None:
        for key, provider in picture.providers.items():
            if provider is not None:
                await self._sweep(key, provider, now)

    async def _sweep(self, key: VendorKey, provider: Provider, now: dt.datetime) -> None:
        """Once per distinct provider: the VMs tagged for this cluster that no GPUNodeClaim owns."""
        cloud = self.cloud
        grace = cloud.config.orphan_grace_seconds
        moment = time.monotonic()
        if moment - cloud.swept.get(key, 0.0) < min(max(grace / 2, cloud.config.interval_seconds), 60.0):
            return
        cloud.swept[key] = moment
        try:
            instances = await provider.list_managed(cloud.config.cluster_name)
        except CloudError as exc:
            cloud.failed(exc, cloud.vendors.get(key))
            return
        owned = {object_name(c) for c in cloud.view.gpunodeclaim_list()}
        for instance in instances:
            if instance.claim in owned or instance.gone:
                continue
            if instance.launched is None or (now - instance.launched).total_seconds() < grace:
                continue
            try:
                await provider.terminate(instance.id)
            except CloudError as exc:
                cloud.failed(exc, cloud.vendors.get(key))
                continue
            cloud.metrics.terminated.labels("orphan").inc()
            pool_name = str(instance.tags.get(POOL_LABEL) or "")
            message = (
                f"VM {instance.id} (claim {instance.claim or '?'}) is tagged for cluster "
                f"{cloud.config.cluster_name} but no GPUNodeClaim owns it: terminated"
            )
            log.warning("orphan VM terminated", extra={"instance": instance.id, "claim": instance.claim})
            pool = cloud.view.pools.get(pool_name) if pool_name else None
            if pool is not None:
                cloud.port.record(pool, "OrphanTerminated", message, "Warning")

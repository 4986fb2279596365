"""Termination: a GPUNodeClaim being deleted that carries our finalizer has its VM terminated; the claim
waits until the cloud says the VM is gone, then its Node is deleted and the finalizer removed. Without a
working provider the finalizer stays, and a Warning ``InstanceNotTerminated`` says why (once per reason)."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Mapping
from typing import Any

from extender.cloud.provider import CloudError, Instance, Provider
from extender.common.labels import PROVISIONED_FINALIZER
from extender.controllers.capacity.provisioned.cloud import Cloud, Picture
from extender.controllers.capacity.vendors import VendorChoice
from extender.kube.client import error_message
from extender.kube.resources import GPU_NODE_CLAIMS, NODES
from extender.scheduling.inventory import object_name

log = logging.getLogger(__name__)


class Termination:
    """The claim finalizer: the VM of a deleted claim goes before the claim does."""

    def __init__(self, cloud: Cloud) -> None:
        self.cloud = cloud

    async def reconcile(self, now: dt.datetime) -> None:
        await self.cloud.turn(lambda picture: self._pass(picture, now))

    async def _pass(self, picture: Picture, now: dt.datetime) -> None:
        cloud = self.cloud
        # a claim that went without us (its finalizer removed by hand) takes its reported reason with it
        cloud.unfinalized = {k: v for k, v in cloud.unfinalized.items() if k in picture.claim_choice}

        async def step(claim: dict[str, Any]) -> None:
            meta = claim.get("metadata") or {}
            if meta.get("deletionTimestamp") and PROVISIONED_FINALIZER in (meta.get("finalizers") or []):
                choice = picture.claim_choice[object_name(claim)]
                await self._finalize(claim, choice, picture.providers[choice.key])

        await cloud.claim_isolation.each_async(picture.claims, step)  # one claim never stops the others

    async def _finalize(
        self, claim: Mapping[str, Any], choice: VendorChoice, provider: Provider | None
    ) -> None:
        cloud = self.cloud
        name = object_name(claim)
        if provider is None:
            vendor = cloud.vendors.get(choice.key)
            why = (vendor.error if vendor is not None and vendor.error else "no cloud connection")
            message = (f"{name}: its VM is not terminated yet and the finalizer {PROVISIONED_FINALIZER} "
                       f"stays: {choice.source}: {why}")
            log.warning("VM of a deleted claim not terminated", extra={"claim": name, "error": message})
            if cloud.unfinalized.get(name) != message:
                cloud.unfinalized[name] = message
                cloud.port.record(dict(claim), "InstanceNotTerminated", message, "Warning")
            return
        cloud.unfinalized.pop(name, None)
        instance_id = str((claim.get("status") or {}).get("instanceID") or "")
        try:
            live: list[Instance] = []
            if instance_id:
                found = await provider.describe(instance_id)
                if found is not None and not found.gone:
                    live.append(found)
            tagged = await provider.find(name)
            if tagged is not None and all(i.id != tagged.id for i in live):
                live.append(tagged)
            for instance in live:
                await provider.terminate(instance.id)
                cloud.metrics.terminated.labels("deleted").inc()
                log.info("VM terminated", extra={"claim": name, "instance": instance.id})
        except CloudError as exc:
            cloud.failed(exc, cloud.vendors.get(choice.key))
            log.warning("VM not terminated", extra={"claim": name, "error": str(exc)})
            return
        if live:
            return  # the next reconcile sees it gone
        node = cloud.node_of(name)
        if node is not None:
            cloud.view.released[object_name(node)] = time.monotonic()
            try:
                await cloud.port.delete(NODES, object_name(node))
            except Exception as exc:
                log.warning(
                    "node not deleted", extra={"node": object_name(node), "error": error_message(exc)}
                )
                return
        finalizers = [
            f for f in (claim.get("metadata") or {}).get("finalizers") or [] if f != PROVISIONED_FINALIZER
        ]
        try:
            await cloud.port.patch(GPU_NODE_CLAIMS, name, {"metadata": {"finalizers": finalizers or None}})
        except Exception as exc:
            log.warning("finalizer not removed", extra={"claim": name, "error": error_message(exc)})
            return
        cloud.checked.pop(name, None)
        log.info("GPUNodeClaim released", extra={"claim": name, "instance": instance_id or None})

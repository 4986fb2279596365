"""What the Provisioned-mode reconcilers share: the providers (one per distinct ``computingVendor``, each with
its connection test), the metrics, the offerings and pools put aside, and the claim writes more than one of
them makes. The reconcilers take turns on it (``lock``): one pass at a time, as one reconcile did."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import yaml
from prometheus_client import CollectorRegistry, Counter

from extender.cloud.factory import make_provider
from extender.cloud.provider import AuthFailure, CapacityUnavailable, CloudError, InvalidRequest, Provider
from extender.cloud.vendor import VendorConfig, read_vendor_file
from extender.common.labels import NODE_PROVISIONER
from extender.common.timefmt import parse_time
from extender.controllers.capacity.config import CapacityConfig
from extender.controllers.capacity.gpunodeclaim import BOUND, is_provisioned_claim
from extender.controllers.capacity.port import KubePort, LiveView, ObjectStore
from extender.controllers.capacity.vendors import VendorChoice, VendorKey, claim_vendor, pool_vendor
from extender.controllers.isolation import Isolation
from extender.kube.client import error_message
from extender.kube.resources import GPU_NODE_CLAIMS
from extender.planning.inputs import claim_pool
from extender.planning.pool import PoolConfig
from extender.scheduling.inventory import object_name

log = logging.getLogger(__name__)

T = TypeVar("T")

RETEST_SECONDS = 30.0  # a failed connection test is tried again this often


class ProvisionedMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.launched = Counter(
            "tf_extender_cloud_instances_launched_total",
            "VMs launched for Provisioned-mode pools",
            ["pool", "instance_type", "capacity_type"],
            registry=registry,
        )
        self.terminated = Counter(
            "tf_extender_cloud_instances_terminated_total",
            "VMs terminated, by reason (deleted, not_joined, orphan)",
            ["reason"],
            registry=registry,
        )
        self.errors = Counter(
            "tf_extender_cloud_api_errors_total",
            "Errors the cloud's compute API answered, by kind (capacity, invalid, auth, other)",
            ["vendor", "kind"],
            registry=registry,
        )


@dataclass
class Vendor:
    """One distinct ``computingVendor``: its provider, and why it does not work when it does not."""

    config: VendorConfig
    provider: Provider | None = None
    error: str = ""
    reason: str = ""
    tested_at: float = 0.0


def _kind(exc: CloudError) -> str:
    return (
        "capacity"
        if isinstance(exc, CapacityUnavailable)
        else "invalid"
        if isinstance(exc, InvalidRequest)
        else "auth"
        if isinstance(exc, AuthFailure)
        else "other"
    )


@dataclass
class Picture:
    """One pass's Provisioned pools and claims, the vendor each uses and that vendor's working provider
    (None: see its ``Vendor.error``)."""

    pools: dict[str, dict[str, Any]]
    configs: list[PoolConfig]
    claims: list[dict[str, Any]]
    pool_choice: dict[str, VendorChoice]
    claim_choice: dict[str, VendorChoice]
    providers: dict[VendorKey, Provider | None] = field(default_factory=dict)

    def vendor_problems(self, cloud: Cloud) -> dict[str, tuple[str, str]]:
        """The pools whose vendor has no working provider, with their condition's reason and message."""
        return {c.name: cloud.problem(self.pool_choice[c.name]) for c in self.configs
                if self.providers[self.pool_choice[c.name].key] is None}


class Cloud:
    """The shared state of the Provisioned-mode reconcilers."""

    def __init__(
        self,
        config: CapacityConfig,
        view: LiveView,
        port: KubePort,
        node_classes: ObjectStore,
        metrics: ProvisionedMetrics,
        clusters: ObjectStore | None = None,
    ) -> None:
        self.config = config
        self.view = view
        self.port = port
        self.node_classes = node_classes
        self.clusters = clusters  # TensorFusionClusters: where a derived pool's computingVendor comes from
        self.metrics = metrics
        self.lock = asyncio.Lock()
        self.vendors: dict[VendorKey, Vendor] = {}  # one provider per distinct computingVendor
        self.unavailable: dict[tuple[str, str, str], float] = {}  # offering -> monotonic end of back-off
        self.unavailable_why: dict[tuple[str, str, str], str] = {}  # offering -> the cloud's error
        self.held: dict[str, tuple[float, str]] = {}  # pool -> (end of hold, why)
        self.checked: dict[str, float] = {}  # claim -> monotonic time its VM was last described
        self.swept: dict[VendorKey, float] = {}
        self.unfinalized: dict[str, str] = {}  # claim -> why its VM could not be terminated (reported)
        self.claim_isolation = Isolation("provisioned", "GPUNodeClaim", view)

    # -- the providers ----------------------------------------------------------------------------------

    def fallback(self) -> VendorChoice | None:
        """The ``--computing-vendor`` file: for pools no TensorFusionCluster owns (None without the flag)."""
        path = self.config.computing_vendor_file
        if not path:
            return None
        source = f"--computing-vendor {path}"
        try:
            return VendorChoice(read_vendor_file(path), source)
        except (OSError, ValueError, yaml.YAMLError) as exc:  # ValueError: YAMLFileError
            return VendorChoice(VendorConfig("", problems=(f"{source}: {exc}",)), source)

    async def turn(self, step: Callable[[Picture], Awaitable[T]]) -> T | None:
        """One sub-reconciler's pass: ``step`` on the current picture, one pass at a time (two never build one
        provider, nor act on one claim, at once); None, without ``step``, when there is nothing to do."""
        async with self.lock:
            picture = await self.picture()
            return None if picture is None else await step(picture)

    async def picture(self) -> Picture | None:
        """The Provisioned pools and claims and their providers (the providers no one uses any more are
        closed); None when there is no Provisioned pool, no such claim and no ``--computing-vendor``."""
        pools = {object_name(p): p for p in self.view.pools.list()}
        configs = [c for c in await self.view.pool_configs() if c.launches_vms and c.name in pools]
        claims = [c for c in self.view.gpunodeclaims.list() if is_provisioned_claim(c)]
        if not configs and not claims and not self.config.computing_vendor_file:
            await self.close_unused(set())
            return None  # no Provisioned pool, no cloud: nothing to do (with a cloud, the orphan sweep runs)
        clusters = {object_name(c): c for c in (self.clusters.list() if self.clusters is not None else [])}
        fallback = self.fallback()
        key_dir = self.config.cloud_key_dir
        # one object at a time: a pool or claim whose vendor cannot be worked out is named, not fatal
        pool_choice = {object_name(p): choice for p, choice in self.view.pool_isolation.each(
            [pools[c.name] for c in configs],
            lambda p: pool_vendor(p, clusters, fallback, key_dir, self.config.cloud_endpoints))}
        configs = [c for c in configs if c.name in pool_choice]
        claim_choice = {object_name(c): choice for c, choice in self.claim_isolation.each(
            claims, lambda c: claim_vendor(c, pools.get(claim_pool(c)), clusters, fallback, key_dir,
                                           self.config.cloud_endpoints))}
        claims = [c for c in claims if object_name(c) in claim_choice]
        wanted: dict[VendorKey, VendorChoice] = {}
        for choice in [*pool_choice.values(), *claim_choice.values(), *([fallback] if fallback else [])]:
            wanted.setdefault(choice.key, choice)
        picture = Picture(pools, configs, claims, pool_choice, claim_choice)
        picture.providers = {key: await self.provider(choice) for key, choice in wanted.items()}
        await self.close_unused(set(wanted))
        return picture

    async def provider(self, choice: VendorChoice) -> Provider | None:
        """The working provider of a vendor, or None with its ``Vendor.error`` saying why."""
        config = choice.config
        vendor = self.vendors.get(choice.key)
        if vendor is None:
            vendor = self.vendors[choice.key] = Vendor(config)
        if config.problems:
            vendor.error, vendor.reason = "; ".join(config.problems), "InvalidVendorConfig"
            return None
        if vendor.provider is not None and not vendor.error:
            return vendor.provider
        if time.monotonic() - vendor.tested_at < RETEST_SECONDS and vendor.tested_at:
            return None
        vendor.tested_at = time.monotonic()
        try:
            if vendor.provider is None:
                vendor.provider = make_provider(config)
            await vendor.provider.test_connection()
        except CloudError as exc:
            self.failed(exc, vendor)
            vendor.error, vendor.reason = f"{config.type}: {exc}", "ConnectionFailed"
            log.warning("cloud connection test failed",
                        extra={"vendor": config.type, "source": choice.source, "error": str(exc)})
            return None
        vendor.error, vendor.reason = "", ""
        log.info("cloud connection ready",
                 extra={"vendor": config.type, "region": config.region, "source": choice.source})
        return vendor.provider

    async def close_unused(self, used: set[VendorKey]) -> None:
        for key in [k for k in self.vendors if k not in used]:
            vendor = self.vendors.pop(key)
            self.swept.pop(key, None)
            if vendor.provider is not None:
                try:
                    await vendor.provider.close()
                except Exception as exc:
                    log.warning("cloud client not closed", extra={"vendor": vendor.config.type,
                                                                   "error": str(exc)})

    def failed(self, exc: CloudError, vendor: Vendor | None) -> None:
        """Count the error; a credentials error stops launches until the next connection test passes."""
        if vendor is None:
            return
        self.metrics.errors.labels(vendor.config.type, _kind(exc)).inc()
        if isinstance(exc, AuthFailure):
            vendor.error, vendor.reason = f"{vendor.config.type}: {exc}", "ConnectionFailed"
            vendor.tested_at = time.monotonic()

    def problem(self, choice: VendorChoice) -> tuple[str, str]:
        """A pool's condition when its vendor has no working provider: the reason, and a message naming
        where the vendor came from (the TensorFusionCluster and field, or the file)."""
        vendor = self.vendors[choice.key]
        if vendor.reason == "InvalidVendorConfig":
            return vendor.reason, vendor.error  # parse_vendor's problems name the cluster and the field
        return vendor.reason or "ConnectionFailed", f"{choice.source}: {vendor.error}"

    # -- claims and their Nodes -------------------------------------------------------------------------

    def node_of(self, claim: str) -> dict[str, Any] | None:
        for node in self.view.nodes.list():
            if ((node.get("metadata") or {}).get("labels") or {}).get(NODE_PROVISIONER) == claim:
                return node
        return None

    async def set_status(self, claim: Mapping[str, Any], status: dict[str, Any], node: str = "") -> None:
        name = object_name(claim)
        try:
            if node:
                await self.port.patch(GPU_NODE_CLAIMS, name, {"spec": {"nodeName": node}})
            await self.port.patch(GPU_NODE_CLAIMS, name, {"status": status}, subresource="status")
        except Exception as exc:
            log.warning("GPUNodeClaim status not written", extra={"claim": name, "error": error_message(exc)})
            return
        log.info(
            "GPUNodeClaim phase", extra={"claim": name, "phase": status.get("phase"), "node": node or None}
        )
        if status.get("phase") == BOUND:
            self.port.record(dict(claim), BOUND, f"GPUNodeClaim {name} is Bound on node {node}")

    async def drop_claim(self, name: str) -> None:
        """A claim whose VM was never made: no finalizer work, it just goes."""
        self.view.created.pop(name, None)
        try:
            await self.port.patch(GPU_NODE_CLAIMS, name, {"metadata": {"finalizers": None}})
            await self.port.delete(GPU_NODE_CLAIMS, name)
        except Exception as exc:
            log.warning("GPUNodeClaim not removed", extra={"claim": name, "error": error_message(exc)})

    async def delete(self, name: str) -> None:
        try:
            await self.port.delete(GPU_NODE_CLAIMS, name)
        except Exception as exc:
            log.warning("GPUNodeClaim not deleted", extra={"claim": name, "error": error_message(exc)})


def created_at(claim: Mapping[str, Any]) -> dt.datetime | None:
    return parse_time((claim.get("metadata") or {}).get("creationTimestamp"))

"""Provisioned mode: the extender launches the VMs of pools that name a GPUNodeClass through the cloud's
compute API (leader only). Targets, the launch planner and compaction are Karpenter mode's; what differs is
who buys the instance.

Every reconcile:

1. the providers: each Provisioned pool's ``computingVendor`` (its TensorFusionCluster's, else the
   ``--computing-vendor`` file; see vendors.py), one provider per distinct vendor, each with its connection
   test; a pool whose vendor fails has its condition ``NodeProvisionerReady`` False with the cloud's own
   message (naming the cluster or file it came from) and gets nothing launched (claims being deleted still
   wait for their VMs); providers no pool or claim uses any more are closed;
2. each GPUNodeClaim of a Provisioned pool moves along Pending (created, carrying our finalizer) ->
   Creating (``status.instanceID``) -> Bound (a Node labelled ``tensor-fusion.ai/node-provisioner=<claim>``
   registered and its GPUs are in the inventory). A Pending claim's instance is created again, which finds
   the instance already tagged with the claim (an extender killed between create and status write buys
   nothing twice). A claim whose Node has not joined within the join timeout, or whose VM is gone, is
   deleted (Warning ``NodeNotJoined`` / ``InstanceGone``);
3. a claim being deleted: its VM is terminated, the claim waits until the cloud says it is gone, then the
   Node is deleted and the finalizer removed;
4. the launch planner's launches: a GPUNodeClaim first (so pending capacity survives a restart), then the
   VM. A capacity error (insufficient capacity, no spot, a quota) puts that offering aside for a back-off,
   with a Warning ``InsufficientCapacity`` event on the pool, and the pool is planned again: the next
   offering or zone;
5. the orphan sweep, once per distinct provider: VMs tagged for this cluster that no GPUNodeClaim owns are
   terminated once older than the grace period (Warning ``OrphanTerminated``).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, Counter

from extender.cloud.factory import make_provider
from extender.cloud.nodeclass import NodeClass, parse_node_class
from extender.cloud.provider import (
    AuthFailure,
    CapacityUnavailable,
    CloudError,
    Instance,
    InvalidRequest,
    LaunchRequest,
    Provider,
)
from extender.cloud.vendor import VendorConfig, read_vendor_file
from extender.common.contract import POOL_LABEL
from extender.common.labels import (
    COMPUTING_VENDOR,
    GFD_COUNT,
    GFD_MEMORY,
    GFD_PRODUCT,
    NODE_PROVISIONER,
    PROVISIONED_FINALIZER,
)
from extender.common.timefmt import parse_time
from extender.controllers.capacity.config import CapacityConfig
from extender.controllers.capacity.gpunodeclaim import (
    GPU_NODE_CLASS_KIND,
    claim_name,
    claim_phase,
    gpunodeclaim_body,
    is_provisioned_claim,
    label_value,
)
from extender.controllers.capacity.launch_plan import LaunchPayload, plan_launches
from extender.controllers.capacity.port import KubePort, LiveView, ObjectStore, write_condition
from extender.controllers.capacity.vendors import (
    VendorChoice,
    VendorKey,
    claim_vendor,
    pool_vendor,
    recorded_text,
)
from extender.kube.client import error_message
from extender.kube.informer import WatchCache
from extender.kube.resources import GPU_NODE_CLAIMS, GPU_NODE_CLASSES, NODES
from extender.planning.action import Action
from extender.planning.inputs import claim_pool
from extender.planning.pool import PoolConfig, pool_config
from extender.scheduling.inventory import object_name

log = logging.getLogger(__name__)

PENDING, CREATING, BOUND = "Pending", "Creating", "Bound"
CONDITION = "NodeProvisionerReady"
RETEST_SECONDS = 30.0  # a failed connection test is tried again this often
BOUND_CHECK_SECONDS = 60.0  # a Bound claim's VM is described this often
MAX_REPLANS = 8
_MIB = 1 << 20


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
class _Vendor:
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


class ProvisionedLauncher:
    def __init__(
        self,
        config: CapacityConfig,
        view: LiveView,
        port: KubePort,
        node_classes: WatchCache,
        metrics: ProvisionedMetrics,
        clusters: ObjectStore | None = None,
    ) -> None:
        self.config = config
        self.view = view
        self.port = port
        self.node_classes = node_classes
        self.clusters = clusters  # TensorFusionClusters: where a derived pool's computingVendor comes from
        self.metrics = metrics
        self.vendors: dict[VendorKey, _Vendor] = {}  # one provider per distinct computingVendor
        self._unavailable: dict[tuple[str, str, str], float] = {}  # offering -> monotonic end of back-off
        self._held: dict[str, tuple[float, str]] = {}  # pool -> (end of hold, why)
        self._checked: dict[str, float] = {}  # claim -> monotonic time its VM was last described
        self._swept: dict[VendorKey, float] = {}
        self._unfinalized: dict[str, str] = {}  # claim -> why its VM could not be terminated (reported)

    # -- the providers ----------------------------------------------------------------------------------

    def _fallback(self) -> VendorChoice | None:
        """The ``--computing-vendor`` file: for pools no TensorFusionCluster owns (None without the flag)."""
        path = self.config.computing_vendor_file
        if not path:
            return None
        source = f"--computing-vendor {path}"
        try:
            return VendorChoice(read_vendor_file(path), source)
        except (OSError, yaml.YAMLError) as exc:
            return VendorChoice(VendorConfig("", problems=(f"{source}: {exc}",)), source)

    async def provider(self, choice: VendorChoice) -> Provider | None:
        """The working provider of a vendor, or None with its ``_Vendor.error`` saying why."""
        config = choice.config
        vendor = self.vendors.get(choice.key)
        if vendor is None:
            vendor = self.vendors[choice.key] = _Vendor(config)
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
            self._failed(exc, vendor)
            vendor.error, vendor.reason = f"{config.type}: {exc}", "ConnectionFailed"
            log.warning("cloud connection test failed",
                        extra={"vendor": config.type, "source": choice.source, "error": str(exc)})
            return None
        vendor.error, vendor.reason = "", ""
        log.info("cloud connection ready",
                 extra={"vendor": config.type, "region": config.region, "source": choice.source})
        return vendor.provider

    async def _close_unused(self, used: set[VendorKey]) -> None:
        for key in [k for k in self.vendors if k not in used]:
            vendor = self.vendors.pop(key)
            self._swept.pop(key, None)
            if vendor.provider is not None:
                try:
                    await vendor.provider.close()
                except Exception as exc:
                    log.warning("cloud client not closed", extra={"vendor": vendor.config.type,
                                                                   "error": str(exc)})

    def _failed(self, exc: CloudError, vendor: _Vendor | None) -> None:
        """Count the error; a credentials error stops launches until the next connection test passes."""
        if vendor is None:
            return
        self.metrics.errors.labels(vendor.config.type, _kind(exc)).inc()
        if isinstance(exc, AuthFailure):
            vendor.error, vendor.reason = f"{vendor.config.type}: {exc}", "ConnectionFailed"
            vendor.tested_at = time.monotonic()

    def _problem(self, choice: VendorChoice) -> tuple[str, str]:
        """A pool's condition when its vendor has no working provider: the reason, and a message naming
        where the vendor came from (the TensorFusionCluster and field, or the file)."""
        vendor = self.vendors[choice.key]
        if vendor.reason == "InvalidVendorConfig":
            return vendor.reason, vendor.error  # parse_vendor's problems name the cluster and the field
        return vendor.reason or "ConnectionFailed", f"{choice.source}: {vendor.error}"

    # -- reconcile --------------------------------------------------------------------------------------

    async def reconcile(self, now: dt.datetime) -> list[Action]:
        pools = {object_name(p): p for p in self.view.pools.list()}
        configs = [c for c in (pool_config(p) for p in pools.values()) if c.launches_vms]
        claims = [c for c in self.view.gpunodeclaims.list() if is_provisioned_claim(c)]
        if not configs and not claims and not self.config.computing_vendor_file:
            await self._close_unused(set())
            return []  # no Provisioned pool and no cloud: nothing to do (with a cloud, the orphan sweep runs)
        clusters = {object_name(c): c for c in (self.clusters.list() if self.clusters is not None else [])}
        fallback = self._fallback()
        key_dir = self.config.cloud_key_dir
        pool_choice = {c.name: pool_vendor(pools[c.name], clusters, fallback, key_dir) for c in configs}
        claim_choice = {object_name(c): claim_vendor(c, pools.get(claim_pool(c)), clusters, fallback, key_dir)
                        for c in claims}
        # a claim that went without us (its finalizer removed by hand) takes its reported reason with it
        self._unfinalized = {k: v for k, v in self._unfinalized.items() if k in claim_choice}
        wanted: dict[VendorKey, VendorChoice] = {}
        for choice in [*pool_choice.values(), *claim_choice.values(), *([fallback] if fallback else [])]:
            wanted.setdefault(choice.key, choice)
        providers = {key: await self.provider(choice) for key, choice in wanted.items()}
        await self._close_unused(set(wanted))
        for claim in claims:
            meta = claim.get("metadata") or {}
            if meta.get("deletionTimestamp") and PROVISIONED_FINALIZER in (meta.get("finalizers") or []):
                choice = claim_choice[object_name(claim)]
                await self._finalize(claim, choice, providers[choice.key])
        problems: dict[str, tuple[str, str]] = {}
        for config in configs:
            if providers[pool_choice[config.name].key] is None:
                problems[config.name] = self._problem(pool_choice[config.name])
        by_pool = {c.name: c for c in configs if c.name not in problems}
        for claim in claims:
            owner = by_pool.get(claim_pool(claim))
            choice = claim_choice[object_name(claim)]
            provider = providers[choice.key]
            if owner is not None and provider is not None and \
                    not (claim.get("metadata") or {}).get("deletionTimestamp"):
                await self._sync(claim, owner, choice, provider, now)
        classes: dict[str, NodeClass] = {}
        for config in by_pool.values():
            problem = self._node_class_problem(config, classes)
            held = self._held.get(config.name)
            if problem is None and held is not None and held[0] > time.monotonic():
                problem = ("LaunchFailed", held[1])
            if problem is not None:
                problems[config.name] = problem
        ready = [c for c in configs if c.name not in problems]
        actions = await self._launches(ready, classes, pool_choice, providers, now, problems)
        for key, provider in providers.items():
            if provider is not None:
                await self._sweep(key, provider, now)
        for config in configs:
            await self._condition(config, pool_choice[config.name], problems.get(config.name))
        return actions

    def _node_class_problem(
        self, config: PoolConfig, classes: dict[str, NodeClass]
    ) -> tuple[str, str] | None:
        obj = self.node_classes.get(config.gpu_node_class)
        if obj is None:
            return (
                "NodeClassNotFound",
                f"GPUNodeClass {config.gpu_node_class!r} (nodeProvisioner.nodeClass) "
                "does not exist: no VM is launched",
            )
        node_class = parse_node_class(obj)
        if node_class.problems:
            return ("InvalidNodeClass", f"GPUNodeClass {node_class.name}: " + "; ".join(node_class.problems))
        classes[config.name] = node_class
        return None

    # -- launches ---------------------------------------------------------------------------------------

    async def _launches(
        self,
        configs: list[PoolConfig],
        classes: Mapping[str, NodeClass],
        choices: Mapping[str, VendorChoice],
        providers: Mapping[VendorKey, Provider | None],
        now: dt.datetime,
        problems: dict[str, tuple[str, str]],
    ) -> list[Action]:
        if not configs:
            return []
        names = {c.name for c in configs}
        done: list[Action] = []
        for _ in range(MAX_REPLANS):
            moment = time.monotonic()
            unavailable = frozenset(k for k, until in self._unavailable.items() if until > moment)
            inputs = self.view.inputs(now, await self.view.catalog(), None, leaving=self.view.leaving())
            inputs.pools = [p for p in inputs.pools if object_name(p) in names]
            inputs.unavailable = unavailable
            actions = list(plan_launches(inputs, provisioned=True))
            replan = False
            for action in actions:
                pool = self.view.pools.get(action.pool) or {
                    "kind": "GPUPool",
                    "metadata": {"name": action.pool},
                }
                log.info("plan", extra={"plan": action.as_json()})
                done.append(action)
                if action.action == "skip":
                    self.port.record(
                        pool, str(action.details.get("event") or "Skipped"), action.reason, "Warning"
                    )
                elif action.action == "launch":
                    choice = choices[action.pool]
                    provider = providers[choice.key]
                    if provider is None:  # not planned: its pool has a problem
                        continue
                    outcome = await self._launch(action, pool, classes[action.pool], choice, provider,
                                                 problems)
                    replan = replan or outcome == "capacity"
            if not replan:
                break
        return done

    def _request(self, claim: Mapping[str, Any], config: PoolConfig, node_class: NodeClass,
                 vendor: VendorConfig) -> LaunchRequest:
        spec = claim.get("spec") or {}
        return LaunchRequest(
            claim=object_name(claim),
            pool=config.name,
            cluster=self.config.cluster_name,
            instance_type=str(spec.get("instanceType") or ""),
            capacity_type=str(spec.get("capacityType") or "on-demand"),
            zone=str(spec.get("zone") or ""),
            region=str(spec.get("region") or vendor.region),
            node_class=node_class,
            extra={str(k): str(v) for k, v in (spec.get("extraParams") or {}).items()},
        )

    async def _launch(
        self,
        action: Action,
        pool: Mapping[str, Any],
        node_class: NodeClass,
        choice: VendorChoice,
        provider: Provider,
        problems: dict[str, tuple[str, str]],
    ) -> str:
        """ "ok", "capacity" (plan again without that offering) or "failed"."""
        payload: LaunchPayload = action.payload
        offer = payload.launch.offering
        for _ in range(payload.launch.count):
            name = claim_name(payload.config.name)
            body = gpunodeclaim_body(payload.config, offer, name)
            body["metadata"]["finalizers"] = [PROVISIONED_FINALIZER]
            body["metadata"]["annotations"][COMPUTING_VENDOR] = recorded_text(choice.config)
            body["spec"]["nodeClassRef"] = {
                "group": GPU_NODE_CLASSES.group,
                "kind": GPU_NODE_CLASS_KIND,
                "version": GPU_NODE_CLASSES.version,
                "name": node_class.name,
            }
            try:
                claim = await self.port.create(GPU_NODE_CLAIMS, body)
            except Exception as exc:
                message = f"{name}: {error_message(exc)}"
                self.port.record(pool, "GPUNodeClaimCreationFailed", message, "Warning")
                return "failed"
            self.view.remember(name, {**claim, "status": {"phase": PENDING}})
            outcome = await self._create_instance(claim, payload.config, node_class, choice, provider, pool,
                                                  problems)
            if outcome != "ok":
                return outcome
        return "ok"

    async def _create_instance(
        self,
        claim: Mapping[str, Any],
        config: PoolConfig,
        node_class: NodeClass,
        choice: VendorChoice,
        provider: Provider,
        pool: Mapping[str, Any],
        problems: dict[str, tuple[str, str]],
    ) -> str:
        request = self._request(claim, config, node_class, choice.config)
        name = request.claim
        try:
            instance = await provider.create(request)
        except CloudError as exc:
            self._failed(exc, self.vendors.get(choice.key))
            offering = (request.instance_type, request.capacity_type, request.zone)
            if isinstance(exc, CapacityUnavailable):
                self._unavailable[offering] = time.monotonic() + self.config.capacity_backoff_seconds
                message = (
                    f"{request.instance_type} ({request.capacity_type}"
                    f"{' in ' + request.zone if request.zone else ''}) not available: {exc}; trying the "
                    f"next offering, this one again in {self.config.capacity_backoff_seconds:.0f}s"
                )
                self.port.record(pool, "InsufficientCapacity", message, "Warning")
                outcome = "capacity"
            else:
                message = f"{name}: {request.instance_type}: {exc}"
                self.port.record(pool, "LaunchFailed", message, "Warning")
                if not isinstance(exc, AuthFailure):  # bad credentials hold the vendor, until a retest passes
                    until = time.monotonic() + self.config.capacity_backoff_seconds
                    self._held[config.name] = (until, message)
                problems[config.name] = (
                    "AuthFailed" if isinstance(exc, AuthFailure) else "LaunchFailed",
                    message,
                )
                outcome = "failed"
            log.warning("VM not launched", extra={"pool": config.name, "claim": name, "error": str(exc)})
            await self._drop_claim(name)
            return outcome
        await self._set_status(claim, {"phase": CREATING, "instanceID": instance.id})
        self.view.remember(name, {**claim, "status": {"phase": CREATING, "instanceID": instance.id}})
        self.metrics.launched.labels(config.name, request.instance_type, request.capacity_type).inc()
        self.port.record(
            dict(claim),
            "InstanceLaunched",
            f"{instance.id}: {request.instance_type} "
            f"({request.capacity_type}{' in ' + request.zone if request.zone else ''})",
        )
        self.port.record(pool, "GPUNodeClaimCreated", f"{name}: {instance.id} {request.instance_type}")
        return "ok"

    async def _drop_claim(self, name: str) -> None:
        """A claim whose VM was never made: no finalizer work, it just goes."""
        self.view.created.pop(name, None)
        try:
            await self.port.patch(GPU_NODE_CLAIMS, name, {"metadata": {"finalizers": None}})
            await self.port.delete(GPU_NODE_CLAIMS, name)
        except Exception as exc:
            log.warning("GPUNodeClaim not removed", extra={"claim": name, "error": error_message(exc)})

    async def _set_status(self, claim: Mapping[str, Any], status: dict[str, Any], node: str = "") -> None:
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

    # -- phases -----------------------------------------------------------------------------------------

    def _node_of(self, claim: str) -> dict[str, Any] | None:
        for node in self.view.nodes.list():
            if ((node.get("metadata") or {}).get("labels") or {}).get(NODE_PROVISIONER) == claim:
                return node
        return None

    async def _sync(
        self, claim: dict[str, Any], config: PoolConfig, choice: VendorChoice, provider: Provider,
        now: dt.datetime,
    ) -> None:
        name, phase = object_name(claim), claim_phase(claim)
        instance_id = str((claim.get("status") or {}).get("instanceID") or "")
        pool = self.view.pools.get(config.name) or {}
        if not instance_id:
            if name in self.view.created:
                return
            obj = self.node_classes.get(config.gpu_node_class)
            node_class = parse_node_class(obj) if obj is not None else None
            if node_class is None or node_class.problems:
                return
            await self._create_instance(claim, config, node_class, choice, provider, pool, {})
            return
        node = self._node_of(name)
        if node is not None:
            await self._label(node, config, claim)
            node_name = object_name(node)
            if phase != BOUND and self.view.state.node_gpus(node_name):
                await self._set_status(claim, {"phase": BOUND, "instanceID": instance_id}, node_name)
                return
        moment = time.monotonic()
        if phase == BOUND and moment - self._checked.get(name, 0.0) < BOUND_CHECK_SECONDS:
            return
        self._checked[name] = moment
        try:
            instance = await provider.describe(instance_id)
        except CloudError as exc:
            self._failed(exc, self.vendors.get(choice.key))
            log.warning("VM not described", extra={"claim": name, "error": str(exc)})
            return
        if instance is None or instance.gone:
            state = instance.state if instance else "unknown to the cloud"
            message = f"{name}: VM {instance_id} is {state}; the GPUNodeClaim is deleted"
            self.port.record(claim, "InstanceGone", message, "Warning")
            await self._delete(name)
            return
        created = _time(claim)
        if (
            phase != BOUND
            and node is None
            and created is not None
            and (now - created).total_seconds() > self.config.join_timeout_seconds
        ):
            message = (
                f"{name}: no Node labelled {NODE_PROVISIONER}={name} joined within "
                f"{self.config.join_timeout_seconds:.0f}s; VM {instance_id} is terminated (check the "
                "GPUNodeClass userData)"
            )
            log.warning("node not joined", extra={"claim": name, "instance": instance_id})
            self.port.record(claim, "NodeNotJoined", message, "Warning")
            self.port.record(pool, "NodeNotJoined", message, "Warning")
            self.metrics.terminated.labels("not_joined").inc()
            await self._delete(name)

    async def _delete(self, name: str) -> None:
        try:
            await self.port.delete(GPU_NODE_CLAIMS, name)
        except Exception as exc:
            log.warning("GPUNodeClaim not deleted", extra={"claim": name, "error": error_message(exc)})

    async def _label(self, node: Mapping[str, Any], config: PoolConfig, claim: Mapping[str, Any]) -> None:
        """The pool label, the pool's gpuNodeLabels and the GPU discovery labels of the instance type, where
        the Node does not carry them yet (GPU Feature Discovery, when it runs, writes the same)."""
        labels = (node.get("metadata") or {}).get("labels") or {}
        wanted: dict[str, str] = {**config.labels, POOL_LABEL: config.name}
        spec = claim.get("spec") or {}
        instance = (await self.view.catalog()).get(str(spec.get("instanceType") or ""))
        if instance is not None:
            wanted.setdefault(GFD_COUNT, str(instance.gpu_count))
            wanted.setdefault(GFD_MEMORY, str(instance.vram_per_gpu // _MIB))
            if label_value(instance.gpu_model):
                wanted.setdefault(GFD_PRODUCT, label_value(instance.gpu_model))
        missing = {k: v for k, v in wanted.items() if k not in labels}
        if missing:
            try:
                await self.port.patch(NODES, object_name(node), {"metadata": {"labels": missing}})
            except Exception as exc:
                log.warning(
                    "node not labelled", extra={"node": object_name(node), "error": error_message(exc)}
                )

    # -- deletion ---------------------------------------------------------------------------------------

    async def _finalize(
        self, claim: Mapping[str, Any], choice: VendorChoice, provider: Provider | None
    ) -> None:
        name = object_name(claim)
        if provider is None:
            vendor = self.vendors.get(choice.key)
            why = (vendor.error if vendor is not None and vendor.error else "no cloud connection")
            message = (f"{name}: its VM is not terminated yet and the finalizer {PROVISIONED_FINALIZER} "
                       f"stays: {choice.source}: {why}")
            log.warning("VM of a deleted claim not terminated", extra={"claim": name, "error": message})
            if self._unfinalized.get(name) != message:
                self._unfinalized[name] = message
                self.port.record(dict(claim), "InstanceNotTerminated", message, "Warning")
            return
        self._unfinalized.pop(name, None)
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
                self.metrics.terminated.labels("deleted").inc()
                log.info("VM terminated", extra={"claim": name, "instance": instance.id})
        except CloudError as exc:
            self._failed(exc, self.vendors.get(choice.key))
            log.warning("VM not terminated", extra={"claim": name, "error": str(exc)})
            return
        if live:
            return  # the next reconcile sees it gone
        node = self._node_of(name)
        if node is not None:
            self.view.released[object_name(node)] = time.monotonic()
            try:
                await self.port.delete(NODES, object_name(node))
            except Exception as exc:
                log.warning(
                    "node not deleted", extra={"node": object_name(node), "error": error_message(exc)}
                )
                return
        finalizers = [
            f for f in (claim.get("metadata") or {}).get("finalizers") or [] if f != PROVISIONED_FINALIZER
        ]
        try:
            await self.port.patch(GPU_NODE_CLAIMS, name, {"metadata": {"finalizers": finalizers or None}})
        except Exception as exc:
            log.warning("finalizer not removed", extra={"claim": name, "error": error_message(exc)})
            return
        self._checked.pop(name, None)
        log.info("GPUNodeClaim released", extra={"claim": name, "instance": instance_id or None})

    async def _sweep(self, key: VendorKey, provider: Provider, now: dt.datetime) -> None:
        """Once per distinct provider: the VMs tagged for this cluster that no GPUNodeClaim owns."""
        grace = self.config.orphan_grace_seconds
        moment = time.monotonic()
        if moment - self._swept.get(key, 0.0) < min(max(grace / 2, self.config.interval_seconds), 60.0):
            return
        self._swept[key] = moment
        try:
            instances = await provider.list_managed(self.config.cluster_name)
        except CloudError as exc:
            self._failed(exc, self.vendors.get(key))
            return
        owned = {object_name(c) for c in self.view.gpunodeclaim_list()}
        for instance in instances:
            if instance.claim in owned or instance.gone:
                continue
            if instance.launched is None or (now - instance.launched).total_seconds() < grace:
                continue
            try:
                await provider.terminate(instance.id)
            except CloudError as exc:
                self._failed(exc, self.vendors.get(key))
                continue
            self.metrics.terminated.labels("orphan").inc()
            pool_name = str(instance.tags.get(POOL_LABEL) or "")
            message = (
                f"VM {instance.id} (claim {instance.claim or '?'}) is tagged for cluster "
                f"{self.config.cluster_name} but no GPUNodeClaim owns it: terminated"
            )
            log.warning("orphan VM terminated", extra={"instance": instance.id, "claim": instance.claim})
            pool = self.view.pools.get(pool_name) if pool_name else None
            if pool is not None:
                self.port.record(pool, "OrphanTerminated", message, "Warning")

    # -- condition --------------------------------------------------------------------------------------

    async def _condition(self, config: PoolConfig, choice: VendorChoice,
                         problem: tuple[str, str] | None) -> None:
        if problem is None:
            wanted = {
                "type": CONDITION,
                "status": "True",
                "reason": "Ready",
                "message": f"{choice.config.type} {choice.config.region} ({choice.source}): connected; "
                f"GPUNodeClass {config.gpu_node_class} is valid",
            }
        else:
            wanted = {"type": CONDITION, "status": "False", "reason": problem[0], "message": problem[1]}
        await write_condition(self.port, self.view.pools.get(config.name) or {}, config.name, wanted)


def _time(claim: Mapping[str, Any]) -> dt.datetime | None:
    return parse_time((claim.get("metadata") or {}).get("creationTimestamp"))

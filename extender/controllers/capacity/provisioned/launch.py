"""Launch: the launch planner's launches for the Provisioned pools that can launch (a working provider, a
valid GPUNodeClass, no launch failure being waited out), each a GPUNodeClaim first (so pending capacity
survives a restart), then its VM. A capacity error (insufficient capacity, no spot, a quota) puts that
offering aside for a back-off, with a Warning ``InsufficientCapacity`` event on the pool, and the pool is
planned again: the next offering or zone. Every Provisioned pool's condition ``NodeProvisionerReady`` says
why it launches or why not."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Mapping
from typing import Any

from extender.cloud.nodeclass import NodeClass, parse_node_class
from extender.cloud.provider import AuthFailure, CapacityUnavailable, CloudError, LaunchRequest, Provider
from extender.cloud.vendor import VendorConfig
from extender.common.labels import COMPUTING_VENDOR, PROVISIONED_FINALIZER
from extender.controllers.capacity.gpunodeclaim import (
    CREATING,
    GPU_NODE_CLASS_KIND,
    PENDING,
    claim_name,
    gpunodeclaim_body,
)
from extender.controllers.capacity.launch_plan import CAPACITY_BACKOFF, LaunchPayload, plan_launches
from extender.controllers.capacity.port import write_condition
from extender.controllers.capacity.provisioned.backoff import EVENT as BACKOFF_EVENT
from extender.controllers.capacity.provisioned.backoff import (
    BackoffReport,
    backoff_message,
    provisioning_phase,
)
from extender.controllers.capacity.provisioned.cloud import Cloud, Picture
from extender.controllers.capacity.vendors import VendorChoice, VendorKey, recorded_text
from extender.kube.client import error_message
from extender.kube.resources import GPU_NODE_CLAIMS, GPU_NODE_CLASSES, GPU_POOLS
from extender.planning.action import Action
from extender.planning.pool import PoolConfig
from extender.scheduling.inventory import object_name

log = logging.getLogger(__name__)

CONDITION = "NodeProvisionerReady"
MAX_REPLANS = 8


class Launch:
    """The launches of the Provisioned pools, and their condition."""

    def __init__(self, cloud: Cloud) -> None:
        self.cloud = cloud
        self.backoff = BackoffReport()
        self._backoff_messages: dict[str, str] = {}  # pool -> why all its offerings wait, this pass

    async def reconcile(self, now: dt.datetime) -> list[Action]:
        return await self.cloud.turn(lambda picture: self._pass(picture, now)) or []

    async def _pass(self, picture: Picture, now: dt.datetime) -> list[Action]:
        cloud = self.cloud
        problems = picture.vendor_problems(cloud)
        classes: dict[str, NodeClass] = {}
        for config in [c for c in picture.configs if c.name not in problems]:
            problem = self._node_class_problem(config, classes)
            held = cloud.held.get(config.name)
            if problem is None and held is not None and held[0] > time.monotonic():
                problem = ("LaunchFailed", held[1])
            if problem is not None:
                problems[config.name] = problem
        ready = [c for c in picture.configs if c.name not in problems]
        self._backoff_messages = {}
        actions = await self._launches(ready, classes, picture.pool_choice, picture.providers, now,
                                       problems)
        for config in picture.configs:
            await self._condition(config, picture.pool_choice[config.name], problems.get(config.name))
            if config not in ready:  # not planned: NodeProvisionerReady says why
                continue
            backoff = self._backoff_messages.get(config.name)
            if backoff is None:
                self.backoff.clear(config.name)
            await write_condition(cloud.port, cloud.view.pools.get(config.name) or {}, config.name,
                                  BackoffReport.condition(backoff))
        for config in picture.configs:
            await self._provisioning_phase(config.name, picture.claims)
        return actions

    async def _provisioning_phase(self, name: str, claims: list[dict[str, Any]]) -> None:
        phase = provisioning_phase(name, claims)
        pool = self.cloud.view.pools.get(name) or {}
        if phase is None or (pool.get("status") or {}).get("provisioningPhase") == phase:
            return
        try:
            await self.cloud.port.patch(GPU_POOLS, name, {"status": {"provisioningPhase": phase}},
                                        subresource="status")
        except Exception as exc:
            log.warning("pool provisioningPhase not written",
                        extra={"pool": name, "error": error_message(exc)})

    def _report_backoff(self, pool: Mapping[str, Any], action: Action, now: dt.datetime) -> None:
        """All of a pool's offerings wait out a capacity back-off: a Warning event once per change."""
        cloud = self.cloud
        offerings = [(str(a), str(b), str(c)) for a, b, c in action.details.get("offerings") or []]
        def make() -> str:
            return backoff_message(offerings, cloud.unavailable_why, cloud.unavailable, time.monotonic(), now)

        message, news = self.backoff.news(action.pool, offerings, cloud.unavailable_why, make)
        self._backoff_messages[action.pool] = message
        if news:
            cloud.port.record(pool, BACKOFF_EVENT, message, "Warning")

    def _node_class_problem(
        self, config: PoolConfig, classes: dict[str, NodeClass]
    ) -> tuple[str, str] | None:
        obj = self.cloud.node_classes.get(config.gpu_node_class)
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
        view = self.cloud.view
        names = {c.name for c in configs}
        done: list[Action] = []
        for _ in range(MAX_REPLANS):
            moment = time.monotonic()
            unavailable = frozenset(k for k, until in self.cloud.unavailable.items() if until > moment)
            inputs = view.inputs(now, await view.catalog(), None, leaving=view.leaving())
            inputs.pools = [p for p in inputs.pools if object_name(p) in names]
            inputs.unavailable = unavailable
            actions = list(plan_launches(inputs, provisioned=True))
            replan = False
            for action in actions:
                pool = view.pools.get(action.pool) or {
                    "kind": "GPUPool",
                    "metadata": {"name": action.pool},
                }
                log.info("plan", extra={"plan": action.as_json()})
                done.append(action)
                if action.action == "skip" and action.details.get("event") == CAPACITY_BACKOFF:
                    self._report_backoff(pool, action, now)
                elif action.action == "skip":
                    self.cloud.port.record(
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
        cloud = self.cloud
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
                claim = await cloud.port.create(GPU_NODE_CLAIMS, body)
            except Exception as exc:
                message = f"{name}: {error_message(exc)}"
                cloud.port.record(pool, "GPUNodeClaimCreationFailed", message, "Warning")
                return "failed"
            cloud.view.remember(name, {**claim, "status": {"phase": PENDING}})
            outcome = await create_instance(cloud, claim, payload.config, node_class, choice, provider, pool,
                                            problems)
            if outcome != "ok":
                return outcome
        return "ok"

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
        view = self.cloud.view
        await write_condition(self.cloud.port, view.pools.get(config.name) or {}, config.name, wanted)


def launch_request(cloud: Cloud, claim: Mapping[str, Any], config: PoolConfig, node_class: NodeClass,
                   vendor: VendorConfig) -> LaunchRequest:
    spec = claim.get("spec") or {}
    return LaunchRequest(
        claim=object_name(claim),
        pool=config.name,
        cluster=cloud.config.cluster_name,
        instance_type=str(spec.get("instanceType") or ""),
        capacity_type=str(spec.get("capacityType") or "on-demand"),
        zone=str(spec.get("zone") or ""),
        region=str(spec.get("region") or vendor.region),
        node_class=node_class,
        extra={str(k): str(v) for k, v in (spec.get("extraParams") or {}).items()},
    )


async def create_instance(
    cloud: Cloud,
    claim: Mapping[str, Any],
    config: PoolConfig,
    node_class: NodeClass,
    choice: VendorChoice,
    provider: Provider,
    pool: Mapping[str, Any],
    problems: dict[str, tuple[str, str]],
) -> str:
    """Create the VM of a claim (the cloud finds one already tagged with the claim: nothing is bought
    twice) and move the claim to Creating: "ok", "capacity" (the offering is put aside) or "failed" (the
    pool waits, its problem in ``problems``); a claim whose VM was not made is removed."""
    request = launch_request(cloud, claim, config, node_class, choice.config)
    name = request.claim
    try:
        instance = await provider.create(request)
    except CloudError as exc:
        cloud.failed(exc, cloud.vendors.get(choice.key))
        offering = (request.instance_type, request.capacity_type, request.zone)
        if isinstance(exc, CapacityUnavailable):
            cloud.unavailable[offering] = time.monotonic() + cloud.config.capacity_backoff_seconds
            cloud.unavailable_why[offering] = " ".join(str(exc).split())
            message = (
                f"{request.instance_type} ({request.capacity_type}"
                f"{' in ' + request.zone if request.zone else ''}) not available: {exc}; trying the "
                f"next offering, this one again in {cloud.config.capacity_backoff_seconds:.0f}s"
            )
            cloud.port.record(pool, "InsufficientCapacity", message, "Warning")
            outcome = "capacity"
        else:
            message = f"{name}: {request.instance_type}: {exc}"
            cloud.port.record(pool, "LaunchFailed", message, "Warning")
            if not isinstance(exc, AuthFailure):  # bad credentials hold the vendor, until a retest passes
                until = time.monotonic() + cloud.config.capacity_backoff_seconds
                cloud.held[config.name] = (until, message)
            problems[config.name] = (
                "AuthFailed" if isinstance(exc, AuthFailure) else "LaunchFailed",
                message,
            )
            outcome = "failed"
        log.warning("VM not launched", extra={"pool": config.name, "claim": name, "error": str(exc)})
        await cloud.drop_claim(name)
        return outcome
    await cloud.set_status(claim, {"phase": CREATING, "instanceID": instance.id})
    cloud.view.remember(name, {**claim, "status": {"phase": CREATING, "instanceID": instance.id}})
    cloud.metrics.launched.labels(config.name, request.instance_type, request.capacity_type).inc()
    cloud.port.record(
        dict(claim),
        "InstanceLaunched",
        f"{instance.id}: {request.instance_type} "
        f"({request.capacity_type}{' in ' + request.zone if request.zone else ''})",
    )
    cloud.port.record(pool, "GPUNodeClaimCreated", f"{name}: {instance.id} {request.instance_type}")
    return "ok"

"""The launch planner of Karpenter-mode pools: the pool's capacity targets decide when to add nodes.

For every pool with ``nodeManagerConfig.provisioningMode: Karpenter`` it computes the gap (minimum,
else warm, plus the pool's pending pods that fail only for capacity), the cheapest eligible launches
that close it under ``maxResources``, and emits one ``launch`` action per instance type. A pool that
cannot be served (a malformed setting, a NodeClass that does not exist, no eligible instance type,
the maximum reached) gets a ``skip`` action saying why; the live controller turns those into Warning
events on the pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from extender.common.contract import GPURequest
from extender.planning.action import Action
from extender.planning.amounts import ZERO, Amount
from extender.planning.gaps import Gap, gap, room
from extender.planning.inputs import Inputs
from extender.planning.offerings import Launch, Offering, cheapest, offerings
from extender.planning.pool import PoolConfig, ProvisioningMode
from extender.scheduling.instance_topology import instance_meets
from extender.scheduling.placement import topology_settings
from extender.scheduling.state import TERMINAL_PHASES, FilterOutcome, PlacementError
from extender.scheduling.topology import Settings as TopologySettings

MAX_RESOURCE_CONSTRAINT = "MaxResourceConstraintReached"
NODECLASS_NOT_FOUND = "NodeClassNotFound"
INVALID_POOL = "InvalidPoolConfig"
NO_INSTANCE_TYPE = "NoEligibleInstanceType"
# every offering the gpuRequirements allow is in capacity back-off (the cloud had none of it lately)
CAPACITY_BACKOFF = "CapacityBackoff"


@dataclass(frozen=True)
class LaunchPayload:
    config: PoolConfig
    launch: Launch


def _skip(config: PoolConfig, event: str, message: str) -> Action:
    return Action("skip", config.name, message, details={"event": event})


def _holds(offer: Offering, request: GPURequest, topology: TopologySettings | None = None) -> bool:
    instance = offer.instance
    if instance.gpu_count < request.gpu_count:
        return False
    # a pod that requires GPU topology holds only on a type whose known topology meets it (docs/topology.md)
    if topology is not None and not instance_meets(instance.name, instance.gpu_count, request.gpu_count,
                                                   topology_settings(request, topology)):
        return False
    if request.gpu_model and request.gpu_model != instance.gpu_model:
        return False
    if request.vendor and request.vendor.upper() != instance.vendor.upper():
        return False
    return (request.tflops_on(instance.tflops_per_gpu) <= instance.tflops_per_gpu
            and request.vram_on(instance.vram_per_gpu) <= instance.vram_per_gpu)


def _pending(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    return (not (pod.get("spec") or {}).get("nodeName") and not meta.get("deletionTimestamp")
            and str((pod.get("status") or {}).get("phase") or "Pending") not in TERMINAL_PHASES)


def _capacity_only(outcome: FilterOutcome) -> bool:
    return not outcome.fits and outcome.capacity_only


def pending_demand(inputs: Inputs, config: PoolConfig, nodes: Sequence[str],
                   offers: Sequence[Offering]) -> tuple[Amount, list[Offering]]:
    """What the pool's pending pods ask for, counting only pods that fit none of the pool's nodes for
    lack of capacity (every pod when the pool has no node yet), that their namespace's GPU quota admits
    (no node is bought for a pod the quota holds) and that an eligible instance type holds;
    and the offerings that hold every one of those pods (a 4-GPU pod needs a node with 4 GPUs, whatever
    the cheapest TFLOPS are)."""
    total = ZERO
    holding = list(offers)
    asking: list[tuple[Mapping[str, Any], GPURequest]] = []
    for pod in inputs.pods:
        if not _pending(pod):
            continue
        try:
            request = inputs.state.request_of(pod)
        except PlacementError:
            continue
        gate = inputs.state.quota_gate
        if gate is not None and gate.blocks(pod) is not None:
            continue
        if request.pool == config.name:
            asking.append((pod, request))
    if nodes and asking:
        # the filter lapses holds and caches verdicts: a plan asks a what-if copy, never the live state
        with inputs.state.what_if() as sim:
            asking = [(pod, request) for pod, request in asking
                      if _capacity_only(sim.filter_with_quota(dict(pod), list(nodes)))]
    for _pod, request in asking:
        topology = inputs.state.topology_for(request.pool)
        holders = [o for o in offers if _holds(o, request, topology)]
        if not holders:
            continue
        smallest = min(holders, key=lambda o: (o.instance.tflops_per_gpu, o.instance.vram_per_gpu))
        per_gpu = Amount(request.tflops_on(smallest.instance.tflops_per_gpu),
                         request.vram_on(smallest.instance.vram_per_gpu))
        total = total + per_gpu.times(request.gpu_count)
        holding = [o for o in holding if o in holders]
    return total, holding


def offering_text(key: Sequence[str]) -> str:
    """``g5.xlarge (spot in us-east-1a)`` for an offering's (instance type, capacity type, zone)."""
    instance, capacity, zone = key
    return f"{instance} ({capacity}{' in ' + zone if zone else ''})"


def _launch_action(config: PoolConfig, launch: Launch, needed: Gap) -> Action:
    offer = launch.offering
    return Action("launch", config.name, needed.reason, details={
        "instanceType": offer.instance.name, "capacityType": offer.capacity_type,
        "zone": offer.zone or None, "count": launch.count, "hourlyPrice": _money(offer.price),
    }, payload=LaunchPayload(config, launch))


def _money(value: Fraction) -> float:
    return round(float(value), 6)


def plan_pool(inputs: Inputs, config: PoolConfig) -> list[Action]:
    if config.problems:
        return [_skip(config, INVALID_POOL, "; ".join(config.problems))]
    ref = config.node_class
    if ref is not None and inputs.node_classes is not None and \
            (ref.group, ref.kind, ref.name) not in inputs.node_classes:
        return [_skip(config, NODECLASS_NOT_FOUND,
                      f"{ref.kind} {ref.name!r} ({ref.group}/{ref.version}) does not exist: no NodeClaim "
                      "can be launched")]
    nodes = inputs.pool_nodes(config.name)
    capacity = inputs.capacity(config.name, nodes)
    matching = offerings(inputs.catalog, config.requirements)
    offers = [o for o in matching if o.sort_key not in inputs.unavailable]
    backed_off = [o for o in matching if o.sort_key in inputs.unavailable]
    demand, holding = pending_demand(inputs, config, [n.name for n in nodes], offers)
    needed = gap(config, capacity, demand)
    if needed.is_zero:
        return []
    if "demand" in needed.kind and holding:
        offers = holding  # buy nodes the waiting pods can actually use
    choice = cheapest(offers, needed.amount, room(config, capacity))
    actions = [_launch_action(config, launch, needed) for launch in choice.launches]
    if not choice.launches and not choice.max_reached and backed_off and not offers:
        # the requirements match: the cloud is out of every offering they allow, for now
        actions.append(Action("skip", config.name, (
            f"every offering the pool's gpuRequirements allow is in capacity back-off: "
            f"{', '.join(offering_text(o.sort_key) for o in backed_off)}; {needed.reason}"),
            details={"event": CAPACITY_BACKOFF, "offerings": [list(o.sort_key) for o in backed_off]}))
    elif not choice.launches and not choice.max_reached:
        aside = f" ({len(backed_off)} more in capacity back-off)" if backed_off else ""
        actions.append(_skip(config, NO_INSTANCE_TYPE, f"{choice.reason}{aside}; {needed.reason}"))
    if choice.max_reached:
        assert config.max is not None
        actions.append(_skip(config, MAX_RESOURCE_CONSTRAINT, (
            f"{choice.reason or 'maxResources caps the launch'}: maxResources {config.max.describe()}, "
            f"{needed.reason}")))
    return actions


def plan_launches(inputs: Inputs, provisioned: bool = False) -> Iterable[Action]:
    """Karpenter-mode pools; with ``provisioned``, the Provisioned pools that name a GPUNodeClass."""
    for config in inputs.configs():
        if (config.launches_vms if provisioned else config.mode is ProvisioningMode.KARPENTER):
            yield from plan_pool(inputs, config)


def plan_provisioned_launches(inputs: Inputs) -> Iterable[Action]:
    """The launches of Provisioned pools that name a GPUNodeClass (VMs through the cloud's API)."""
    return plan_launches(inputs, provisioned=True)

"""The capacity controllers on the runner, all leader-only, over one ``LiveView``:

- ``provisioner``: Karpenter-mode launches (``launcher.Launcher``);
- ``compactor``: compaction of empty nodes (``compactor.Compactor``);
- ``provisioned-launch``, ``provisioned-registration``, ``provisioned-termination`` and
  ``provisioned-garbagecollection``: Provisioned mode (``provisioned/``).

Each runs every ``--capacity-interval``; a change of a GPUNodeClaim, NodeClaim, GPUNodeClass or
TensorFusionCluster wakes all but the compactor and the garbage collection, and a GPU pod of a Karpenter-mode
or Provisioned pool that fits nowhere (``after_filter``) wakes the two launchers, at most every
``DEMAND_WAKE_SECONDS``.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry

from extender.common.contract import GPU_POOL
from extender.controllers.capacity.compactor import Compactor, CompactorMetrics
from extender.controllers.capacity.config import CapacityConfig
from extender.controllers.capacity.launcher import Launcher, LauncherMetrics
from extender.controllers.capacity.port import KubePort, LiveView, ObjectStore, WatchedStore
from extender.controllers.capacity.provisioned.cloud import Cloud, ProvisionedMetrics
from extender.controllers.capacity.provisioned.garbagecollection import GarbageCollection
from extender.controllers.capacity.provisioned.launch import Launch
from extender.controllers.capacity.provisioned.registration import Registration
from extender.controllers.capacity.provisioned.termination import Termination
from extender.controllers.runner import Reconciler, Synced
from extender.kube.events import EventRecorder
from extender.planning.pool import ProvisioningMode, pool_config
from extender.scheduling.state import ClusterState, FilterOutcome
from extender.server.hooks import FilterHook

DEMAND_WAKE_SECONDS = 2.0


class Capacity(FilterHook):
    """The capacity package's state and controllers; its ``after_filter`` turns unmet demand into a
    wake-up."""

    def __init__(self, config: CapacityConfig, api_client: client.ApiClient, state: ClusterState, *,
                 recorder: EventRecorder, registry: CollectorRegistry, nodes: ObjectStore,
                 pools: ObjectStore, pods: ObjectStore, gpunodeclaims: WatchedStore,
                 nodeclaims: WatchedStore,
                 node_classes: WatchedStore, clusters: WatchedStore, gpunodes: WatchedStore | None = None,
                 core: Sequence[Synced] = ()) -> None:
        self.config = config
        self.port = KubePort(api_client, recorder)
        self.view = LiveView(config, state, nodes=nodes, pools=pools, pods=pods, gpunodeclaims=gpunodeclaims,
                             nodeclaims=nodeclaims, port=self.port, gpunodes=gpunodes)
        self.node_classes = node_classes
        self.clusters = clusters  # a derived pool's computingVendor (the TensorFusionCluster controller's)
        self.launcher = Launcher(self.view, self.port, LauncherMetrics(registry))
        self.compactor = Compactor(self.view, self.port, CompactorMetrics(registry),
                                   config.manual_window_seconds)
        self.cloud = Cloud(config, self.view, self.port, node_classes, ProvisionedMetrics(registry),
                           clusters=clusters)
        self.launch = Launch(self.cloud)
        self.registration = Registration(self.cloud)
        self.termination = Termination(self.cloud)
        self.garbagecollection = GarbageCollection(self.cloud)
        caches: tuple[Synced, ...] = (*core, gpunodeclaims, nodeclaims, node_classes, clusters)
        if gpunodes is not None:
            caches += (gpunodes,)

        def controller(name: str, reconcile: Callable[[dt.datetime], Awaitable[Any]]) -> Reconciler:
            return Reconciler(name, _one_pass(reconcile), interval=config.interval_seconds, leader_only=True,
                              caches=caches)

        self.provisioner = controller("provisioner", self.launcher.reconcile)
        self.compaction = controller("compactor", self.compactor.reconcile)
        self.provisioned_launch = controller("provisioned-launch", self.launch.reconcile)
        self.provisioned_registration = controller("provisioned-registration", self.registration.reconcile)
        self.provisioned_termination = controller("provisioned-termination", self.termination.reconcile)
        self.provisioned_gc = controller("provisioned-garbagecollection", self.garbagecollection.reconcile)
        self.woken_by_change = (self.provisioner, self.provisioned_launch, self.provisioned_registration,
                                self.provisioned_termination)
        for cache in (gpunodeclaims, nodeclaims, node_classes, clusters):
            cache.subscribe(self._changed)
        self._demand_woken = -DEMAND_WAKE_SECONDS

    @property
    def controllers(self) -> tuple[Reconciler, ...]:
        return (self.provisioner, self.compaction, self.provisioned_launch, self.provisioned_registration,
                self.provisioned_termination, self.provisioned_gc)

    def _changed(self, _type: str, _obj: dict[str, Any]) -> None:
        for c in self.woken_by_change:
            c.wake()

    def after_filter(self, pod: dict[str, Any], outcome: FilterOutcome) -> None:
        """A GPU pod of a Karpenter-mode or Provisioned pool that fits nowhere is demand, so the launchers
        reconcile now rather than at their next interval (at most every few seconds)."""
        if outcome.error or outcome.fits:
            return
        pool = str(((pod.get("metadata") or {}).get("annotations") or {}).get(GPU_POOL) or "")
        obj = self.view.pools.get(pool) if pool else None
        config = pool_config(obj) if obj is not None else None
        if config is None or not (config.mode is ProvisioningMode.KARPENTER or config.launches_vms):
            return
        now = time.monotonic()
        if now - self._demand_woken >= DEMAND_WAKE_SECONDS:
            self._demand_woken = now
            self.provisioner.wake()
            self.provisioned_launch.wake()


def _one_pass(reconcile: Callable[[dt.datetime], Awaitable[Any]]) -> Callable[[dt.datetime], Awaitable[None]]:
    """A reconcile whose result (the actions taken, for tests and logs) is not a requeue: the next pass is
    after the interval."""

    async def pass_(now: dt.datetime) -> None:
        await reconcile(now)

    return pass_

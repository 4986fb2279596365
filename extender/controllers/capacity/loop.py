"""The capacity controllers wired into ``tf-extender serve``: one loop per concern, behind the process's
leader."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry

from extender.common.contract import GPU_POOL
from extender.common.tasks import cancel_and_wait
from extender.controllers import Leader, leader_gated_loop
from extender.controllers.capacity.compactor import Compactor, CompactorMetrics
from extender.controllers.capacity.config import CapacityConfig
from extender.controllers.capacity.launcher import Launcher, LauncherMetrics
from extender.controllers.capacity.port import KubePort, LiveView, ObjectStore, run_caches
from extender.controllers.capacity.provisioned import ProvisionedLauncher, ProvisionedMetrics
from extender.kube.events import EventRecorder
from extender.kube.informer import WatchCache
from extender.kube.resources import GPU_NODE_CLASSES, TENSOR_FUSION_CLUSTERS
from extender.planning.pool import ProvisioningMode, pool_config
from extender.scheduling.state import ClusterState, FilterOutcome

log = logging.getLogger(__name__)

DEMAND_WAKE_SECONDS = 2.0


class CapacityControllers:
    """Karpenter-mode launches and compaction: two reconcile loops on one ``LiveView``, acting while
    ``leader`` says so (no leader: always, for a single replica and tests)."""

    def __init__(self, config: CapacityConfig, api_client: client.ApiClient, state: ClusterState, *,
                 nodes: ObjectStore, pools: ObjectStore, pods: ObjectStore, recorder: EventRecorder,
                 registry: CollectorRegistry, ready: Callable[[], Awaitable[None]],
                 leader: Leader | None = None, nodeclaims: WatchCache | None = None,
                 gpunodes: ObjectStore | None = None, clusters: WatchCache | None = None) -> None:
        self.config = config
        self.port = KubePort(api_client, recorder)
        self.view = LiveView(config, api_client, state, nodes=nodes, pools=pools, pods=pods, port=self.port,
                             nodeclaims=nodeclaims, gpunodes=gpunodes)
        self.launcher = Launcher(self.view, self.port, LauncherMetrics(registry))
        self.compactor = Compactor(self.view, self.port, CompactorMetrics(registry),
                                   config.manual_window_seconds)
        self.node_classes = WatchCache(api_client, GPU_NODE_CLASSES, optional=True, name="gpunodeclasses")
        # TensorFusionClusters (a derived pool's computingVendor): the process's one cache when given (the
        # TensorFusionCluster controller reads it too), else one of its own.
        self._own_clusters = clusters is None
        self.clusters = clusters or WatchCache(api_client, TENSOR_FUSION_CLUSTERS, optional=True,
                                               name="tensorfusionclusters")
        self.provisioned = ProvisionedLauncher(config, self.view, self.port, self.node_classes,
                                               ProvisionedMetrics(registry), clusters=self.clusters)
        self.leader: Leader = leader or _ALWAYS
        self._ready = ready
        self._wake: asyncio.Event | None = None
        self._demand_woken = -DEMAND_WAKE_SECONDS

    @property
    def caches(self) -> Sequence[WatchCache]:
        return (*self.view.caches, self.node_classes, self.clusters)

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def observe(self, pod: dict[str, Any], outcome: FilterOutcome) -> None:
        """A filter observer: a GPU pod of a Karpenter-mode pool that fits nowhere is demand, so the
        launcher reconciles now rather than at its next interval (at most every few seconds)."""
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
            self.wake()

    async def run(self) -> None:
        self._wake = asyncio.Event()
        self.view.set_on_change(self.wake)
        self.node_classes.subscribe(lambda _t, _o: self.wake())
        self.clusters.subscribe(lambda _t, _o: self.wake())
        own = (self.clusters,) if self._own_clusters else ()
        tasks = await run_caches((*self.view.owned_caches, self.node_classes, *own))
        try:
            await self._ready()
            await asyncio.gather(*(c.synced.wait() for c in self.caches))
            log.info("capacity controllers started")
            interval = self.config.interval_seconds
            await asyncio.gather(
                leader_gated_loop("provisioner", self.leader, self.launcher.reconcile, interval, self._wake),
                leader_gated_loop("compactor", self.leader, self.compactor.reconcile, interval),
                leader_gated_loop("provisioned", self.leader, self.provisioned.reconcile, interval,
                                  self._wake),
            )
        finally:
            await cancel_and_wait(tasks)


class _Always:
    is_leader = True


_ALWAYS = _Always()

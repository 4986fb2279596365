"""Wiring of the extender: one set of watch caches feeding the cluster state and the controllers, the
binder, one flat list of controllers (``controllers.Controller``, each a named loop, started and stopped
in one place), the HTTP server, and an orderly shutdown.

What the caches watch:

- Nodes, GPUs (``gpus.tensor-fusion.ai``), GPUPools and SchedulingConfigTemplates: everything.
- Pods: only those labelled ``tensor-fusion.ai/component=worker``. The webhook writes that label on
  every GPU pod and the binder adds it when a pod arrives without it, so every pod that can carry
  ``tensor-fusion.ai/gpu-ids`` is seen, while the (usually far larger) rest of the cluster's pods is
  not held in memory. A label selector cannot express "has the gpu-ids annotation".

- NodeClaims, when node expansion or the capacity controllers run: one cache that both read. A cache that
  only one controller reads (NodePools, GPUNodeClaims, the placeholder and reservation pods, narrowed to
  one namespace and label) belongs to that controller.

The custom resources are optional: a cluster without the CRD installed counts as having none.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web
from kubernetes import client

from extender import controllers
from extender.common.contract import COMPONENT_LABEL, COMPONENT_WORKER
from extender.controllers import Controller, Loop, leader_gated_loop
from extender.controllers.autoscale.config import AutoscaleOptions
from extender.controllers.capacity.config import CapacityConfig
from extender.controllers.capacity.loop import CapacityControllers
from extender.controllers.defrag.config import DefragOptions
from extender.controllers.defrag.port import kube_defragmenter
from extender.controllers.expansion.config import ExpansionConfig
from extender.controllers.expansion.placeholder_port import attach_placeholders
from extender.controllers.expansion.port import SharedCaches, kube_expander
from extender.controllers.expansion.provisioner import AutoscalerConfig
from extender.controllers.expansion.reservations import ReservationKeeper
from extender.controllers.gpunode.config import GPUNodeConfig
from extender.controllers.gpunode.writer import GPUNodeWriter, KubeGPUNodeApi
from extender.controllers.gpustatus import GPUStatusWriter, KubeStatusApi, StatusSettings
from extender.controllers.leadership import Leadership
from extender.controllers.nudge import SchedulerNudger
from extender.controllers.preemptor import Preemptor
from extender.controllers.tfcluster.config import TFClusterConfig
from extender.controllers.tfcluster.loop import TFClusterController
from extender.kube import resources
from extender.kube.aio import AsyncKube
from extender.kube.events import EventRecorder
from extender.kube.informer import WatchCache
from extender.kube.pods import KubePodApi
from extender.scheduling.ledger import Allocation, Distrust
from extender.scheduling.pdb import PdbGuard
from extender.scheduling.state import ClusterState, InventorySource, Kind
from extender.server.allocated import allocation_rows
from extender.server.app import (
    DEFAULT_BIND_DEADLINE,
    DEFAULT_DEADLINE,
    DEFAULT_PREFIX,
    FilterObserver,
    Handlers,
    create_app,
    create_monitoring_app,
)
from extender.server.binder import Binder, bind_log
from extender.server.metrics import Metrics, NodeUse, PoolUse
from extender.server.stranded import StrandedCollector

if TYPE_CHECKING:
    from extender.controllers.autoscale.loop import WorkloadAutoscaler

log = logging.getLogger(__name__)

COMPONENT = "tensor-fusion-extender"
POD_SELECTOR = f"{COMPONENT_LABEL}={COMPONENT_WORKER}"
GC_YOUNG_THRESHOLD = 10_000  # allocations between young collections, once the caches have synced


@dataclass(frozen=True)
class Settings:
    port: int = 8080
    bind_address: str = "127.0.0.1"
    metrics_port: int = 0  # 0: no separate listener (/metrics is on the verbs' port)
    metrics_bind_address: str = "0.0.0.0"
    prefix: str = DEFAULT_PREFIX
    cert_dir: str | None = None
    cert_interval: float = 30.0
    inventory: InventorySource = InventorySource.AUTO
    max_pods_per_node: int = 256
    preemptor: bool = True
    deadline: float = DEFAULT_DEADLINE
    bind_deadline: float = DEFAULT_BIND_DEADLINE
    filter_first_choice: bool = True
    nudge_scheduler: bool = True
    shutdown_timeout: float = 15.0
    expansion: ExpansionConfig = field(default_factory=ExpansionConfig)
    gpu_status: StatusSettings | None = None  # --write-gpu-status
    defrag: DefragOptions = field(default_factory=DefragOptions)
    autoscaler: AutoscalerConfig = field(default_factory=AutoscalerConfig)
    capacity: CapacityConfig = field(default_factory=lambda: CapacityConfig(enabled=False))
    tfcluster: TFClusterConfig = field(default_factory=lambda: TFClusterConfig(enabled=False))
    gpu_nodes: GPUNodeConfig = field(default_factory=lambda: GPUNodeConfig(enabled=False))
    workload_autoscale: AutoscaleOptions = field(default_factory=AutoscaleOptions)  # --autoscale

    @property
    def leader_elected(self) -> bool:
        """Whether a controller that acts on the whole cluster runs, so the process elects a leader."""
        return (self.expansion.enabled or self.capacity.enabled or self.defrag.enabled
                or self.workload_autoscale.enabled or self.tfcluster.enabled)


def build_caches(api_client: client.ApiClient, state: ClusterState,
                 inventory: InventorySource) -> dict[str, WatchCache]:
    def feed(kind: Kind) -> Callable[[str, dict[str, Any]], None]:
        return lambda event, obj: state.apply(kind, event, obj)

    caches = {
        "nodes": WatchCache(api_client, resources.NODES, on_change=feed(Kind.NODE), name="nodes"),
        "pods": WatchCache(api_client, resources.PODS, label_selector=POD_SELECTOR, on_change=feed(Kind.POD),
                           name="pods"),
        "gpupools": WatchCache(api_client, resources.GPU_POOLS, on_change=feed(Kind.POOL), name="gpupools",
                               optional=True),
        "schedulingconfigtemplates": WatchCache(
            api_client, resources.SCHEDULING_CONFIG_TEMPLATES, on_change=feed(Kind.TEMPLATE),
            name="schedulingconfigtemplates", optional=True),
    }
    if inventory is not InventorySource.NODE_LABELS:
        caches["gpus"] = WatchCache(api_client, resources.GPUS, on_change=feed(Kind.GPU), name="gpus",
                                    optional=inventory is InventorySource.AUTO)
    return caches


def build_controller_caches(api_client: client.ApiClient, settings: Settings) -> dict[str, WatchCache]:
    """The caches more than one controller reads, beyond the cluster state's: run with the others, but
    not waited for by readiness (the verbs never read them)."""
    caches: dict[str, WatchCache] = {}
    if settings.expansion.enabled or settings.capacity.enabled:
        caches["nodeclaims"] = WatchCache(api_client, resources.NODECLAIMS, optional=True, name="nodeclaims")
    if settings.capacity.enabled or settings.tfcluster.enabled:
        # the TensorFusionCluster controller derives pools from them; Provisioned pools read their vendor
        caches["tensorfusionclusters"] = WatchCache(api_client, resources.TENSOR_FUSION_CLUSTERS,
                                                    optional=True, name="tensorfusionclusters")
    if settings.gpu_nodes.enabled or settings.capacity.enabled:
        # the GPUNode writer keeps them; compaction reads their phase and age
        caches["gpunodes"] = WatchCache(api_client, resources.GPU_NODES, optional=True, name="gpunodes")
    return caches


class ExtenderService:
    def __init__(self, api_client: client.ApiClient, settings: Settings,
                 observers: Sequence[FilterObserver] = ()) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.kube = AsyncKube.from_api_client(api_client)
        self.nudger = (SchedulerNudger(self._patch_node,
                                       on_nudge=lambda node, outcome: self.metrics.scheduler_nudges.labels(
                                           outcome).inc())
                       if settings.nudge_scheduler else None)
        self.state = ClusterState(inventory=settings.inventory, max_pods_per_node=settings.max_pods_per_node,
                                  on_refused=self.distrusted,
                                  on_room=self.nudger.gained if self.nudger is not None else None)
        self.caches = build_caches(api_client, self.state, settings.inventory)
        self._synced = False
        self.recorder = EventRecorder(api_client, COMPONENT, kube=self.kube)
        pod_api = KubePodApi(self.kube)
        self.binder = Binder(self.state, self.caches["pods"], pod_api, self.recorder, self.metrics)
        self.pdb: PdbGuard | None = None
        if settings.preemptor:
            # PodDisruptionBudgets, for the choice of victims (the Eviction API enforces them as well)
            self.caches["poddisruptionbudgets"] = WatchCache(api_client, resources.PDBS,
                                                             name="poddisruptionbudgets", optional=True)
            self.pdb = PdbGuard(self.caches["pods"], self.caches["poddisruptionbudgets"])
        self.preemptor = (Preemptor(self.state, pod_api, self.recorder, self.metrics, pdb=self.pdb)
                          if settings.preemptor else None)
        self.controller_caches = build_controller_caches(api_client, settings)
        nodeclaims = self.controller_caches.get("nodeclaims")
        self.leadership = (Leadership.of(api_client, settings.expansion.lease_namespace)
                           if settings.leader_elected else None)
        shared = SharedCaches(nodes=self.caches["nodes"], gpupools=self.caches["gpupools"],
                              gpu_pods=self.caches["pods"], nodeclaims=nodeclaims)
        self.expander = (kube_expander(settings.expansion, api_client, self.state, self.recorder, shared,
                                       self.metrics.registry, leader=self._leadership().follower())
                         if settings.expansion.enabled else None)
        self.status_writer = (GPUStatusWriter(
            self.state, KubeStatusApi(api_client), gpus=self.caches.get("gpus") or _NoObjects(),
            pools=self.caches["gpupools"], pods=self.caches["pods"], settings=settings.gpu_status,
            registry=self.metrics.registry, ready=self._all_synced) if settings.gpu_status else None)
        self.defragmenter = (kube_defragmenter(
            api_client, self.caches, self.state, self.recorder, self.metrics.registry,
            leader=self._leadership(), replacement_timeout=settings.defrag.replacement_timeout,
            tick_seconds=settings.defrag.tick_seconds) if settings.defrag.enabled else None)
        if self.expander is not None:
            attach_placeholders(self.expander, settings.autoscaler, api_client, self.caches["pods"])
        self.reservations = (ReservationKeeper(settings.autoscaler, api_client, self.state,
                                               self.caches["nodes"], self._all_synced,
                                               self.metrics.registry)
                             if settings.autoscaler.reservations else None)
        self.capacity = (CapacityControllers(
            settings.capacity, api_client, self.state, nodes=self.caches["nodes"],
            pools=self.caches["gpupools"], pods=self.caches["pods"], recorder=self.recorder,
            registry=self.metrics.registry, ready=self._all_synced, leader=self._leadership(),
            nodeclaims=nodeclaims, gpunodes=self.controller_caches.get("gpunodes"),
            clusters=self.controller_caches.get("tensorfusionclusters"))
            if settings.capacity.enabled else None)
        self.tfclusters = (TFClusterController(settings.tfcluster, api_client, pools=self.caches["gpupools"],
                                               recorder=self.recorder, leader=self._leadership(),
                                               clusters=self.controller_caches.get("tensorfusionclusters"))
                           if settings.tfcluster.enabled else None)
        gpunodes = self.controller_caches.get("gpunodes")
        self.gpunode_writer = (GPUNodeWriter(settings.gpu_nodes, self.state, KubeGPUNodeApi(api_client),
                                             nodes=self.caches["nodes"], gpunodes=gpunodes,
                                             registry=self.metrics.registry, ready=self._all_synced)
                               if settings.gpu_nodes.enabled and gpunodes is not None else None)
        self.workload_autoscaler = (self._workload_autoscaler(pod_api)
                                    if settings.workload_autoscale.enabled else None)
        all_observers = list(observers)
        if self.preemptor is not None:
            all_observers.append(self.preemptor.consider)
        if self.expander is not None:
            all_observers.append(self.expander.observe)
        if self.capacity is not None:
            all_observers.append(self.capacity.observe)
        if self.nudger is not None:
            all_observers.append(self.nudger.observe)
        self.handlers = Handlers(self.state, self.binder, self.metrics, unsynced=self.unsynced,
                                 observers=all_observers, deadline=settings.deadline,
                                 bind_deadline=settings.bind_deadline,
                                 first_choice_only=settings.filter_first_choice,
                                 gate=self.preemptor.filter_gate if self.preemptor is not None else None,
                                 fence=self.defragmenter.restrict if self.defragmenter is not None else None,
                                 pdb=self.pdb)
        self.metrics.on_scrape(self.refresh_gauges)
        self.metrics.registry.register(StrandedCollector(self.caches["pods"], self.caches["nodes"]))

    def _leadership(self) -> Leadership:
        if self.leadership is None:
            raise RuntimeError("a leader-elected controller runs without the process's leadership")
        return self.leadership

    def controllers(self) -> list[Controller]:
        """Every loop of the process, in start order: the watches, then each enabled controller."""
        out: list[Controller] = [Loop(f"watch-{name}", cache.run)
                                 for name, cache in (*self.caches.items(), *self.controller_caches.items())]
        if self.leadership is not None:
            out.append(Loop("leader", self.leadership.run))
        if self.preemptor is not None:
            out.append(Loop("preemptor", self.preemptor.run))
        if self.expander is not None:
            out.append(Loop("expander", self.expander.run))
        if self.status_writer is not None:
            out.append(Loop("gpu-status", self.status_writer.run))
        if self.defragmenter is not None:
            out.append(Loop("defrag", self._defrag_after_sync))
        if self.reservations is not None:
            out.append(Loop("gpu-reservations", self.reservations.run))
        if self.capacity is not None:
            out.append(Loop("capacity", self.capacity.run))
        if self.tfclusters is not None:
            out.append(Loop("tensorfusioncluster", self.tfclusters.run))
        if self.gpunode_writer is not None:
            out.append(Loop("gpunodes", self.gpunode_writer.run))
        if self.nudger is not None:
            out.append(Loop("scheduler-nudge", self.nudger.run))
        if self.workload_autoscaler is not None:
            out.append(Loop("workload-autoscale", self._autoscale_after_sync))
        out.append(Loop("gc-freeze", self._freeze_after_sync))
        return out

    def distrusted(self, allocation: Allocation, reason: Distrust, message: str) -> None:
        """The ledger did not believe a pod's allocation record: say so in the log, a metric and an event
        on the pod (each once per pod and finding)."""
        log.warning("allocation record not believed",
                    extra={"pod": allocation.pod_key, "reason": reason.value, "detail": message})
        self.metrics.distrusted.labels(reason.value).inc()
        namespace, _, name = allocation.pod_key.partition("/")
        ref = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"namespace": namespace, "name": name, "uid": allocation.uid}}
        self.recorder.record(ref, "GPUAllocationNotBelieved", message, "Warning")

    async def _patch_node(self, node: str, patch: dict[str, Any]) -> None:
        await self.kube.request("PATCH", resources.object_path(resources.NODES, node), body=patch,
                                content_type="application/merge-patch+json", timeout=10.0)

    def unsynced(self) -> list[str]:
        # asked on every verb: once every cache has synced (a cache never unsyncs), the answer is fixed
        if self._synced:
            return []
        waiting = [name for name, cache in self.caches.items() if not cache.synced.is_set()]
        self._synced = not waiting
        return waiting

    def refresh_gauges(self) -> None:
        use = self.state.utilisation()
        nodes = []
        for node, figures in use.nodes.items():
            names = sorted({gpu.pool for gpu in self.state.node_gpus(node) if gpu.pool})
            nodes.append(NodeUse(node, ",".join(names), figures.tflops_percent, figures.vram_percent))
        pools = [PoolUse(pool, f.tflops_percent, f.vram_percent, f.capacity_tflops, f.capacity_vram_bytes)
                 for pool, f in use.pools.items()]
        self.metrics.set_utilisation(nodes, pools, use.partially_used_gpus)
        self.metrics.set_allocations(*allocation_rows(self.state, self.caches["pods"].get))

    async def _all_synced(self) -> None:
        await asyncio.gather(*(cache.synced.wait() for cache in self.caches.values()))

    async def _freeze_after_sync(self) -> None:
        # The first full sync allocates the bulk of the long-lived objects; moving them out of the
        # collector's generations keeps full collections (tens of ms at 40,000 GPUs) off the verbs' path.
        await asyncio.gather(*(cache.synced.wait() for cache in self.caches.values()))
        gc.collect()
        gc.freeze()
        # Every watch event allocates a few hundred containers (a decoded object) that live in the caches
        # or die by reference count; almost none are cyclic garbage. At the default threshold (700) the
        # collector ran ~800 young and 8 full collections (58 ms each) per 2,000 pods, 10% of the
        # extender's CPU in bench/e2e_throughput; a full collection now comes ~15 times less often.
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        log.info("caches synced", extra={"caches": sorted(self.caches)})

    def _workload_autoscaler(self, pod_api: KubePodApi) -> WorkloadAutoscaler:
        from extender.controllers.autoscale.loop import WorkloadAutoscaler
        from extender.controllers.autoscale.port import KubeWorkloadApi
        from extender.server.resize import Resizer

        return WorkloadAutoscaler(self.state, self.caches["pods"], KubeWorkloadApi(self.kube),
                                  Resizer(self.state, pod_api, self.recorder),
                                  self.settings.workload_autoscale)

    async def _autoscale_after_sync(self) -> None:
        if self.workload_autoscaler is None:
            return
        await self._all_synced()  # the ledger must know every pod before it resizes one
        # One replica resizes: two would each decide from their own ledger and patch the same pods.
        await leader_gated_loop("workload-autoscale", self._leadership(), self.workload_autoscaler.reconcile,
                                self.workload_autoscaler.options.interval_seconds)

    async def _defrag_after_sync(self) -> None:
        if self.defragmenter is None:
            return
        await asyncio.gather(*(cache.synced.wait() for cache in self.caches.values()))
        await self.defragmenter.run()

    def app(self) -> web.Application:
        return create_app(self.handlers, prefix=self.settings.prefix)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then stop accepting, finish in-flight binds and return."""
        tasks = controllers.start(self.controllers())
        await self.recorder.start()
        ssl_context = None
        if self.settings.cert_dir:
            from certs.reload import serving_context, watch_certificates

            ssl_context = serving_context(self.settings.cert_dir)
            cert_dir, interval = self.settings.cert_dir, self.settings.cert_interval
            tasks += controllers.start([Loop("certificates",
                                             lambda: watch_certificates(ssl_context, cert_dir, interval))])
        runner = web.AppRunner(self.app(), shutdown_timeout=self.settings.shutdown_timeout,
                               access_log=None)
        await runner.setup()
        monitoring = None
        if self.settings.metrics_port:
            monitoring = web.AppRunner(create_monitoring_app(self.handlers), access_log=None)
            await monitoring.setup()
        try:
            site = web.TCPSite(runner, self.settings.bind_address, self.settings.port,
                               ssl_context=ssl_context)
            await site.start()
            log.info("serving", extra={"address": self.settings.bind_address, "port": self.settings.port,
                                       "tls": ssl_context is not None, "prefix": self.settings.prefix})
            if monitoring is not None:
                await web.TCPSite(monitoring, self.settings.metrics_bind_address,
                                  self.settings.metrics_port).start()
                log.info("serving metrics", extra={"address": self.settings.metrics_bind_address,
                                                   "port": self.settings.metrics_port})
            await stop.wait()
            log.info("shutting down")
        finally:
            if monitoring is not None:
                await monitoring.cleanup()
            await runner.cleanup()  # stops listening, then waits for requests in flight
            await self.binder.drain(self.settings.shutdown_timeout)
            bind_log.flush()  # the bind lines still waiting for their write
            await controllers.stop(tasks)
            await self.recorder.stop()
            await self.kube.close()


class _NoObjects:
    """No GPU objects are watched (--inventory-source node-labels): no GPU status to write."""

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return None

    def list(self) -> list[dict[str, Any]]:
        return []

"""Wiring of the extender: the cache factory and the cluster state it feeds, the binder, the controllers of
``registry.CONTROLLERS`` (each package builds itself; one ``Runner`` runs them all), the HTTP server, and an
orderly shutdown.

What the core caches watch (the verbs answer once they have synced):

- Nodes, GPUs (``gpus.tensor-fusion.ai``), GPUPools and SchedulingConfigTemplates: everything.
- Pods: only those labelled ``tensor-fusion.ai/component=worker``. The webhook writes that label on
  every GPU pod and the binder adds it when a pod arrives without it, so every pod that can carry
  ``tensor-fusion.ai/gpu-ids`` is seen, while the (usually far larger) rest of the cluster's pods is
  not held in memory. A label selector cannot express "has the gpu-ids annotation".

Every other watch is a controller's, asked of the same factory (``Informers``), so two controllers reading
one resource share one watch, and every watch starts and stops with the others.

The custom resources are optional: a cluster without the CRD installed counts as having none.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from kubernetes import client

from extender.common.contract import COMPONENT_LABEL, COMPONENT_WORKER
from extender.common.tasks import cancel_and_wait
from extender.controllers import preemptor, registry
from extender.controllers.leadership import DEFAULT_NAMESPACE, Leadership
from extender.controllers.runner import Controller, ControllerMetrics, Runner, wait_synced
from extender.controllers.wiring import ControllerPackage, CoreCaches, Deps
from extender.kube import resources
from extender.kube.aio import AsyncKube
from extender.kube.events import EventRecorder
from extender.kube.informer import Informers, WatchCache
from extender.kube.pods import KubePodApi
from extender.scheduling import instance_topology
from extender.scheduling.ledger import Allocation, Distrust
from extender.scheduling.pdb import PdbGuard
from extender.scheduling.state import ClusterState, InventorySource, Kind
from extender.server.allocated import allocation_rows_async
from extender.server.app import (
    DEFAULT_BIND_DEADLINE,
    DEFAULT_DEADLINE,
    DEFAULT_PREFIX,
    Handlers,
    create_app,
    create_monitoring_app,
)
from extender.server.binder import Binder, bind_log
from extender.server.hooks import FilterHook, FilterHooks
from extender.server.metrics import GPUAllocated, Metrics, NodeUse, PodAllocated, PoolUse
from extender.server.stranded import StrandedCollector

log = logging.getLogger(__name__)

COMPONENT = "tensor-fusion-extender"
POD_SELECTOR = f"{COMPONENT_LABEL}={COMPONENT_WORKER}"
GC_YOUNG_THRESHOLD = 10_000  # allocations between young collections, once the caches have synced

Loop = tuple[str, Callable[[], Awaitable[None]]]  # a named task of the process


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
    instance_topology_configmap: str = ""  # NAMESPACE/NAME: entries over the built-in instance-type table
    max_pods_per_node: int = 256
    deadline: float = DEFAULT_DEADLINE
    bind_deadline: float = DEFAULT_BIND_DEADLINE
    filter_first_choice: bool = True
    shutdown_timeout: float = 15.0
    lease_namespace: str = DEFAULT_NAMESPACE  # the Lease of the leader-only controllers
    # each controller package's settings by its NAME; a package not named runs with its DEFAULT
    controllers: Mapping[str, Any] = field(default_factory=dict)

    def of(self, package: ControllerPackage) -> Any:
        """The settings ``package`` is built with."""
        return self.controllers.get(package.NAME, package.DEFAULT)


def build_core_caches(informers: Informers, state: ClusterState, inventory: InventorySource) -> CoreCaches:
    """The caches that feed ``state``, made first so the state hears of every change before any controller."""
    def fed(cache: WatchCache, kind: Kind) -> WatchCache:
        cache.subscribe(lambda event, obj: state.apply(kind, event, obj))
        return cache

    nodes = fed(informers.cache(resources.NODES, name="nodes"), Kind.NODE)
    pods = fed(informers.cache(resources.PODS, label_selector=POD_SELECTOR, name="pods"), Kind.POD)
    gpupools = fed(informers.cache(resources.GPU_POOLS, name="gpupools", optional=True), Kind.POOL)
    templates = fed(informers.cache(resources.SCHEDULING_CONFIG_TEMPLATES, name="schedulingconfigtemplates",
                                    optional=True), Kind.TEMPLATE)
    gpus = None
    if inventory is not InventorySource.NODE_LABELS:
        gpus = fed(informers.cache(resources.GPUS, name="gpus", optional=inventory is InventorySource.AUTO),
                   Kind.GPU)
    return CoreCaches(nodes=nodes, pods=pods, gpupools=gpupools, templates=templates, gpus=gpus)


def watch_instance_topology(informers: Informers, state: ClusterState, ref: str) -> WatchCache | None:
    """Keep the state's instance-type topology table in step with a ConfigMap (``NAMESPACE/NAME``). A
    broken ConfigMap keeps the last good table and says why in the log, once per change."""
    namespace, _, name = ref.partition("/")
    if not ref or not name:
        return None
    cache = informers.cache(resources.CONFIGMAPS, namespace=namespace, field_selector=f"metadata.name={name}",
                            optional=True, name="instance-topology")

    def changed(event: str, obj: dict[str, Any]) -> None:
        try:
            state.set_shapes(instance_topology.from_configmap(None if event == "DELETED" else obj))
        except instance_topology.TableError as exc:
            log.warning("instance topology table kept: %s", exc)

    cache.subscribe(changed)
    return cache


def warn_bad_topology_settings(templates: WatchCache, state: ClusterState) -> None:
    """Say in the log when a SchedulingConfigTemplate's ``placement.gpuTopology`` cannot be read."""
    def changed(event: str, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        error = None if event == "DELETED" else state.topology_error(name)
        if error:
            log.warning("GPU topology setting ignored, TensorFusion's defaults apply: %s", error)

    templates.subscribe(changed)


class ExtenderService:
    def __init__(self, api_client: client.ApiClient, settings: Settings,
                 hooks: tuple[FilterHook, ...] = ()) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.kube = AsyncKube.from_api_client(api_client)
        self._room_sinks: list[Callable[[Any], None]] = []
        self.state = ClusterState(inventory=settings.inventory, max_pods_per_node=settings.max_pods_per_node,
                                  on_refused=self.distrusted, on_room=self._room_gained)
        self.informers = Informers(api_client)
        self.core = build_core_caches(self.informers, self.state, settings.inventory)
        topology = watch_instance_topology(self.informers, self.state, settings.instance_topology_configmap)
        warn_bad_topology_settings(self.core.templates, self.state)
        self._synced = False
        self.recorder = EventRecorder(api_client, COMPONENT, kube=self.kube)
        pod_api = KubePodApi(self.kube)
        self.pdb: PdbGuard | None = None
        self.ready_caches: tuple[WatchCache, ...] = self.core.all + ((topology,) if topology else ())
        if settings.of(preemptor):
            # PodDisruptionBudgets, for the choice of victims (the Eviction API enforces them as well)
            pdbs = self.informers.cache(resources.PDBS, name="poddisruptionbudgets", optional=True)
            self.pdb = PdbGuard(self.core.pods, pdbs)
            self.ready_caches += (pdbs,)
        deps = Deps(api_client=api_client, kube=self.kube, state=self.state, informers=self.informers,
                    core=self.core, recorder=self.recorder, metrics=self.metrics, pod_api=pod_api,
                    pdb=self.pdb)
        self.controllers: list[Controller] = []
        self.parts: dict[str, Any] = {}  # each built package's state by its NAME, for tests and tools
        all_hooks = list(hooks)
        for package in registry.CONTROLLERS:
            built = package.build(deps, settings.of(package))
            if built is None:
                continue
            self.controllers += built.controllers
            all_hooks += built.hooks
            self._room_sinks += built.room_sinks
            self.parts[package.NAME] = built.part
        # one Lease for the process, only when a controller acts on the whole cluster
        self.leadership = (Leadership.of(api_client, settings.lease_namespace)
                           if any(c.leader_only for c in self.controllers) else None)
        self.runner = Runner(self.leadership, ControllerMetrics(self.metrics.registry))
        verb_hooks = FilterHooks(all_hooks)
        self.binder = Binder(self.state, self.core.pods, pod_api, self.recorder, self.metrics,
                             hooks=verb_hooks)
        self.handlers = Handlers(self.state, self.binder, self.metrics, unsynced=self.unsynced,
                                 hooks=verb_hooks, deadline=settings.deadline,
                                 bind_deadline=settings.bind_deadline,
                                 first_choice_only=settings.filter_first_choice, pdb=self.pdb,
                                 role=self._role if self.leadership is not None else None)
        self.metrics.on_scrape(self.refresh_gauges, self.allocations)
        self.metrics.registry.register(StrandedCollector(self.core.pods, self.core.nodes))

    def _role(self) -> str:
        """This replica as /readyz names it: the one whose leader-only controllers act, or a standby."""
        leadership = self.leadership
        return "leader" if leadership is not None and leadership.is_leader else "standby"

    def _room_gained(self, nodes: Any) -> None:
        for sink in self._room_sinks:
            sink(nodes)

    def loops(self) -> list[Loop]:
        """Every task of the process, in start order: the watches, the leader election, each controller."""
        out: list[Loop] = [(f"watch-{cache.name}", cache.run) for cache in self.informers.caches()]
        if self.leadership is not None:
            out.append(("leader", self.leadership.run))
        out += [(c.name, functools.partial(self.runner.run, c)) for c in self.controllers]
        out.append(("gc-freeze", self._freeze_after_sync))
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

    def unsynced(self) -> list[str]:
        # asked on every verb: once every cache has synced (a cache never unsyncs), the answer is fixed
        if self._synced:
            return []
        waiting = [cache.name for cache in self.ready_caches if not cache.synced.is_set()]
        self._synced = not waiting
        return waiting

    def refresh_gauges(self) -> None:
        if self.leadership is not None:
            identity = self.leadership.keepers[0].identity
            self.metrics.leader.labels(identity).set(1 if self.leadership.is_leader else 0)
        use = self.state.utilisation()
        nodes = []
        for node, figures in use.nodes.items():
            names = sorted({gpu.pool for gpu in self.state.node_gpus(node) if gpu.pool})
            nodes.append(NodeUse(node, ",".join(names), figures.tflops_percent, figures.vram_percent))
        pools = [PoolUse(pool, f.tflops_percent, f.vram_percent, f.capacity_tflops, f.capacity_vram_bytes)
                 for pool, f in use.pools.items()]
        self.metrics.set_utilisation(nodes, pools, use.partially_used_gpus)

    async def allocations(self) -> tuple[list[GPUAllocated], list[PodAllocated]]:
        """The per-GPU and per-pod rows of a scrape, made between the verbs."""
        return await allocation_rows_async(self.state, self.core.pods.get)

    async def _freeze_after_sync(self) -> None:
        # The first full sync allocates the bulk of the long-lived objects; moving them out of the
        # collector's generations keeps full collections (tens of ms at 40,000 GPUs) off the verbs' path.
        await wait_synced(self.ready_caches)
        gc.collect()
        gc.freeze()
        # Every watch event allocates a few hundred containers (a decoded object) that live in the caches
        # or die by reference count; almost none are cyclic garbage. At the default threshold (700) the
        # collector ran ~800 young and 8 full collections (58 ms each) per 2,000 pods, 10% of the
        # extender's CPU in bench/e2e_throughput; a full collection now comes ~15 times less often.
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        log.info("caches synced", extra={"caches": [c.name for c in self.ready_caches]})

    def app(self) -> web.Application:
        return create_app(self.handlers, prefix=self.settings.prefix)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then stop accepting, finish in-flight binds and return."""
        tasks = start(self.loops())
        await self.recorder.start()
        ssl_context = None
        if self.settings.cert_dir:
            from certs.reload import serving_context, watch_certificates

            ssl_context = serving_context(self.settings.cert_dir)
            cert_dir, interval = self.settings.cert_dir, self.settings.cert_interval
            tasks += start([("certificates", lambda: watch_certificates(ssl_context, cert_dir, interval))])
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
            await cancel_and_wait(tasks)
            await self.recorder.stop()
            await self.kube.close()


def start(loops: list[Loop]) -> list[asyncio.Task[None]]:
    """One task per loop, named after it. A loop that crashes ends its own task and nothing else."""
    return [asyncio.create_task(_awaited(run()), name=name) for name, run in loops]


async def _awaited(awaitable: Awaitable[None]) -> None:
    await awaitable

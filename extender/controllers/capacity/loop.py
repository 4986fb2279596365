"""The capacity controllers wired into ``tf-extender serve``: one Lease, one loop per concern."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry

from extender.common.contract import GPU_POOL
from extender.common.tasks import cancel_and_wait
from extender.controllers.capacity.compactor import Compactor, CompactorMetrics
from extender.controllers.capacity.config import CapacityConfig
from extender.controllers.capacity.launcher import Launcher, LauncherMetrics
from extender.controllers.capacity.port import KubePort, LiveView, ObjectStore, run_caches
from extender.kube.client import error_message
from extender.kube.events import EventRecorder
from extender.kube.informer import WatchCache
from extender.kube.lease import LeaseKeeper
from extender.planning.action import Action
from extender.planning.pool import ProvisioningMode, pool_config
from extender.scheduling.state import ClusterState, FilterOutcome

log = logging.getLogger(__name__)

DEMAND_WAKE_SECONDS = 2.0


class CapacityControllers:
    def __init__(self, config: CapacityConfig, api_client: client.ApiClient, state: ClusterState, *,
                 nodes: ObjectStore, pools: ObjectStore, pods: ObjectStore, recorder: EventRecorder,
                 registry: CollectorRegistry, ready: Callable[[], Awaitable[None]],
                 identity: str | None = None) -> None:
        self.config = config
        self.port = KubePort(api_client, recorder)
        self.view = LiveView(config, api_client, state, nodes=nodes, pools=pools, pods=pods, port=self.port)
        self.provisioner = Launcher(self.view, self.port, LauncherMetrics(registry))
        self.compactor = Compactor(self.view, self.port, CompactorMetrics(registry),
                                   config.manual_window_seconds)
        self.leader = LeaseKeeper(
            api_client, config.lease_name, config.lease_namespace,
            identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
            duration_seconds=config.lease_duration_seconds, renew_seconds=config.lease_renew_seconds)
        self._ready = ready
        self._wake: asyncio.Event | None = None
        self._demand_woken = -DEMAND_WAKE_SECONDS

    @property
    def caches(self) -> Sequence[WatchCache]:
        return self.view.caches

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def observe(self, pod: dict[str, Any], outcome: FilterOutcome) -> None:
        """A filter observer: a GPU pod of a Karpenter-mode pool that fits nowhere is demand, so the
        provisioner reconciles now rather than at its next interval (at most every few seconds)."""
        if outcome.error or outcome.fits:
            return
        pool = str(((pod.get("metadata") or {}).get("annotations") or {}).get(GPU_POOL) or "")
        obj = self.view.pools.get(pool) if pool else None
        if obj is None or pool_config(obj).mode is not ProvisioningMode.KARPENTER:
            return
        now = time.monotonic()
        if now - self._demand_woken >= DEMAND_WAKE_SECONDS:
            self._demand_woken = now
            self.wake()

    async def _loop(self, name: str, reconcile: Callable[[dt.datetime], Awaitable[list[Action]]],
                    wake: asyncio.Event | None) -> None:
        while True:
            if self.leader.is_leader:
                try:
                    await reconcile(dt.datetime.now(dt.UTC))
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.exception("%s reconcile failed", name, extra={"error": error_message(exc)})
            if wake is None:
                await asyncio.sleep(self.config.interval_seconds)
                continue
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), self.config.interval_seconds)
            wake.clear()
            await asyncio.sleep(0.5)  # let a burst of watch events settle

    async def run(self) -> None:
        self._wake = asyncio.Event()
        self.view.set_on_change(self.wake)
        tasks = await run_caches(self.view.caches)
        tasks.append(asyncio.create_task(self.leader.run(), name="capacity-lease"))
        try:
            await self._ready()
            await asyncio.gather(*(c.synced.wait() for c in self.view.caches))
            log.info("capacity controllers started", extra={"lease": self.config.lease_name})
            await asyncio.gather(
                self._loop("provisioner", self.provisioner.reconcile, self._wake),
                self._loop("compactor", self.compactor.reconcile, None),
            )
        finally:
            await cancel_and_wait(tasks)



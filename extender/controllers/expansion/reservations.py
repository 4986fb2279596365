"""GPU reservation pods: make the Cluster Autoscaler's GPU accounting true.

On a node that advertises ``nvidia.com/gpu`` the Cluster Autoscaler counts only ``nvidia.com/gpu`` requests
as GPU use, and GPU pods placed by the extender request none (the webhook moved them to
``tensor-fusion.ai/index_*``). So for every GPU that bound GPU pods hold any share of, the keeper keeps one
pod bound to that node holding ``nvidia.com/gpu: 1`` (``placeholder_pods.reservation_body``): its scale-up
simulation no longer sees shared GPUs as free, and its scale-down neither counts the node as idle nor
drains it (the pods say ``safe-to-evict: false``). A reservation is created after the first allocation on
its GPU and deleted after the last, off the bind path (a bind never waits for it). The wanted set is
computed from the ledger, so after a restart the keeper rebuilds exactly the same pods, deleting stale
ones and creating missing ones, once the extender's caches have synced.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry, Gauge

from extender.common.labels import RESERVATION_LABEL, RESERVED_GPU
from extender.controllers.expansion.placeholder_pods import advertised_gpus, reservation_body
from extender.controllers.expansion.placeholder_port import KubePodWriter
from extender.controllers.expansion.provisioner import AutoscalerConfig
from extender.controllers.runner import Reconciler, Synced
from extender.kube.informer import WatchCache
from extender.scheduling.state import ClusterState

log = logging.getLogger(__name__)

RESYNC_SECONDS = 30.0
POLL_SECONDS = 0.5
# A reservation pod the node refused (phase Failed, e.g. the kubelet found no free nvidia.com/gpu) is
# replaced at most this often.
RETRY_FAILED_SECONDS = 30.0

RESERVATION_SELECTOR = f"{RESERVATION_LABEL}=true"

NodeLookup = Callable[[str], Mapping[str, Any] | None]


@dataclass(frozen=True)
class ReservationPlan:
    create: list[tuple[str, str]]  # (gpu, node)
    delete: list[tuple[str, str, str]]  # (pod name, uid, why)
    refused: list[str]  # GPUs whose reservation pod the node refused (deleted above, replaced later)


def wanted(held: Mapping[str, str], node: NodeLookup) -> dict[str, str]:
    """GPU -> node for the held GPUs on nodes that advertise ``nvidia.com/gpu``, at most as many per node
    as it advertises (by GPU name)."""
    by_node: dict[str, list[str]] = {}
    for gpu, name in held.items():
        by_node.setdefault(name, []).append(gpu)
    out: dict[str, str] = {}
    for name, gpus in by_node.items():
        for gpu in sorted(gpus)[: advertised_gpus(node(name))]:
            out[gpu] = name
    return out


def plan(want: Mapping[str, str], existing: Sequence[Mapping[str, Any]],
         failed_recently: Callable[[str], bool] = lambda gpu: False) -> ReservationPlan:
    """What to create and delete so that exactly one live reservation pod exists per wanted GPU."""
    have: dict[str, Mapping[str, Any]] = {}
    delete: list[tuple[str, str, str]] = []
    refused: list[str] = []
    for pod in sorted(existing, key=lambda p: str((p.get("metadata") or {}).get("name"))):
        meta = pod.get("metadata") or {}
        name, uid = str(meta.get("name") or ""), str(meta.get("uid") or "")
        gpu = str((meta.get("annotations") or {}).get(RESERVED_GPU) or "")
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        if meta.get("deletionTimestamp"):
            have.setdefault(gpu, pod)  # on its way out: wait for it before creating its successor
            continue
        if gpu not in want:
            delete.append((name, uid, "no pod holds a share of its GPU any more"))
        elif want[gpu] != node:
            delete.append((name, uid, f"its GPU is on node {want[gpu]} now"))
            have[gpu] = pod  # its successor has the same name: created once this one is gone
        elif gpu in have:
            delete.append((name, uid, "a duplicate"))
        elif (pod.get("status") or {}).get("phase") == "Failed":
            delete.append((name, uid, "the node refused it"))
            refused.append(gpu)
            have[gpu] = pod
        else:
            have[gpu] = pod
    create = [(gpu, node) for gpu, node in sorted(want.items())
              if gpu not in have and not failed_recently(gpu)]
    return ReservationPlan(create, delete, refused)


class ReservationKeeper:
    """Keeps the reservation pods (``cache``: the pods labelled ``RESERVATION_SELECTOR`` in the configured
    namespace) equal to the ledger's shared GPUs, on every replica (``controller``). Its reconcile waits for
    ``caches`` (the ones that feed the ledger, and its own): acting on a half-synced ledger would delete live
    pods. It reconciles when the ledger's version moved (looked at every ``POLL_SECONDS``), when a
    reservation pod or a node's advertised ``nvidia.com/gpu`` changes, and at least every
    ``RESYNC_SECONDS``."""

    def __init__(self, config: AutoscalerConfig, api_client: client.ApiClient, state: ClusterState,
                 nodes: WatchCache, cache: WatchCache, caches: Sequence[Synced] = (),
                 registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.state = state
        self.nodes = nodes
        self.writer = KubePodWriter(api_client)
        self.cache = cache
        self._clock = clock
        self._failed_at: dict[str, float] = {}
        self.controller = Reconciler("gpu-reservations", self.reconcile_if_changed, interval=POLL_SECONDS,
                                     caches=tuple(dict.fromkeys((*caches, cache))), settle=0.0)
        self._woken = False
        self._seen_version = -1
        self._next_resync = 0.0
        cache.subscribe(self._wake)
        # Node -> the nvidia.com/gpu it advertises, to wake on a change of it (bounded by the nodes: a
        # deleted node's entry goes with it).
        self._advertised: dict[str, int] = {}
        nodes.subscribe(self._node_changed)
        self.gauge = Gauge("tf_extender_gpu_reservation_pods",
                           "GPU reservation pods (nvidia.com/gpu: 1 per shared GPU) in the cluster",
                           registry=registry)

    def _wake(self, *_: Any) -> None:
        self._woken = True
        self.controller.wake()

    def _node_changed(self, event_type: str, node: Mapping[str, Any]) -> None:
        """Reconcile at once when a node's advertised ``nvidia.com/gpu`` changes: a new node's allocatable
        often lands after the first pods are bound there (the ledger did not change then), and waiting for
        the resync left its GPUs unreserved for up to 30 s, long enough for the Cluster Autoscaler to find
        the node idle and drain it."""
        name = str((node.get("metadata") or {}).get("name") or "")
        if event_type == "DELETED":
            changed = self._advertised.pop(name, None) is not None
        else:
            count = advertised_gpus(node)
            changed = self._advertised.get(name) != count
            self._advertised[name] = count
        if changed:
            self._wake()

    def _failed_recently(self, gpu: str) -> bool:
        at = self._failed_at.get(gpu)
        return at is not None and self._clock() - at < RETRY_FAILED_SECONDS

    async def reconcile_if_changed(self, now: dt.datetime | None = None) -> float | None:
        """One pass of the runner: ``reconcile`` when the ledger moved, something woke the keeper or the
        resync is due; the ledger is looked at again in ``POLL_SECONDS``."""
        at = self._clock()
        if self.state.version != self._seen_version or self._woken or at >= self._next_resync:
            self._woken = False
            self._seen_version = self.state.version
            self._next_resync = at + RESYNC_SECONDS
            await self.reconcile()
        return POLL_SECONDS

    async def reconcile(self) -> ReservationPlan:
        want = wanted(self.state.held_gpus(), self.nodes.get)
        todo = plan(want, self.cache.list(), self._failed_recently)
        for gpu in todo.refused:
            self._failed_at[gpu] = self._clock()
        for name, uid, why in todo.delete:
            try:
                await self.writer.delete_pod(self.config.namespace, name, uid)
                log.info("GPU reservation pod deleted", extra={"pod": name, "reason": why})
            except Exception as exc:
                log.warning("deleting a GPU reservation pod failed", extra={"pod": name, "error": str(exc)})
        for gpu, node_name in todo.create:
            node = self.nodes.get(node_name)
            if node is None:
                continue
            body = reservation_body(gpu, node, namespace=self.config.namespace, image=self.config.image,
                                    priority_class=self.config.reservation_priority_class)
            try:
                await self.writer.create_pod(self.config.namespace, body)
                log.info("GPU reservation pod created", extra={"gpu": gpu, "node": node_name,
                                                               "pod": body["metadata"]["name"]})
            except Exception as exc:
                log.warning("creating a GPU reservation pod failed",
                            extra={"gpu": gpu, "node": node_name, "error": str(exc)})
        self.gauge.set(len(want))
        return todo

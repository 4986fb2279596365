"""Placeholder pods: node expansion through the Cluster Autoscaler.

For a capacity-only failure that Karpenter cannot serve (no template node owned by a NodeClaim), or in a
pool whose ``tensor-fusion.ai/node-provisioner`` is ``cluster-autoscaler``, the expander creates one
placeholder pod (``placeholder_pods.placeholder_body``) that the Cluster Autoscaler scales a node group for.
Each placeholder stands for one new node: the empty copy of the candidate node it was modelled on. Later
pods with the same constraints that fit what is left of that node ride on it and create nothing.

A placeholder is deleted as soon as its pod is bound, deleted, finished, or no longer a capacity-only
failure; riders are then free to be considered again. After a restart the placeholders found in the
cluster are adopted (or deleted when their pod no longer needs them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from extender.common.contract import GPU_POOL, GPURequest
from extender.common.labels import PLACEHOLDER_FOR, PLACEHOLDER_FOR_UID, PLACEHOLDER_TEMPLATE
from extender.controllers.expansion.decide import skip_reason
from extender.controllers.expansion.detect import REASON_COMPLETED, REASON_FAILED
from extender.controllers.expansion.fit import choose, empty_copy, empty_copy_fits, take
from extender.controllers.expansion.inflight import PodRef
from extender.controllers.expansion.placeholder_pods import (
    constraints_key,
    describe_requests,
    node_cpu_memory,
    placeholder_body,
    pod_cpu_memory,
)
from extender.controllers.expansion.provisioner import AutoscalerConfig, Provisioner, pool_provisioner
from extender.kube.client import error_status
from extender.scheduling.inventory import GPUDevice
from extender.scheduling.placement import Slot

log = logging.getLogger(__name__)

REASON_WAITING = "NodeExpansionWaiting"
# A placeholder just created but not yet in the watch cache is not "gone" before this.
UNSEEN_GRACE_SECONDS = 30.0


class PlaceholderPort(Protocol):
    def node(self, name: str) -> Mapping[str, Any] | None: ...

    def node_gpus(self, name: str) -> Sequence[GPUDevice]: ...

    def record(self, obj: Mapping[str, Any], reason: str, message: str, type_: str = "Normal") -> None: ...

    def gpu_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The cached GPU pod, or None when it is gone."""

    def placeholder_pods(self) -> Sequence[Mapping[str, Any]]:
        """The placeholder pods in the cluster (cached)."""

    async def placeholder_owner(self) -> Mapping[str, Any] | None:
        """The object placeholders are owned by (None: they get no owner reference)."""

    async def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None: ...


@dataclass
class Coming:
    """The node one placeholder asks for, with what the pods counted on it leave free."""

    name: str
    uid: str
    owner: PodRef
    key: str
    slots: list[Slot]
    cpu_free: Fraction | None
    memory_free: Fraction | None
    created_at: float = 0.0
    riders: dict[str, PodRef] = field(default_factory=dict)
    seen: bool = False  # once in the watch cache, its absence means it is gone
    arrived: bool = False  # the placeholder is bound: its node exists and the scheduler retries on it

    def room_for(self, key: str, request: GPURequest, cpu: Fraction, memory: Fraction) -> list[int] | None:
        if self.arrived or key != self.key:
            return None
        if self.cpu_free is not None and cpu > self.cpu_free:
            return None
        if self.memory_free is not None and memory > self.memory_free:
            return None
        return choose(self.slots, request)

    def count(self, positions: list[int], request: GPURequest, cpu: Fraction, memory: Fraction) -> None:
        take(self.slots, positions, request)
        if self.cpu_free is not None:
            self.cpu_free -= cpu
        if self.memory_free is not None:
            self.memory_free -= memory


def _owner_of(placeholder: Mapping[str, Any]) -> PodRef | None:
    meta = placeholder.get("metadata") or {}
    namespace, _, name = str((meta.get("annotations") or {}).get(PLACEHOLDER_FOR, "")).partition("/")
    uid = str((meta.get("labels") or {}).get(PLACEHOLDER_FOR_UID, ""))
    return PodRef(namespace, name, uid) if namespace and name and uid else None


class Placeholders:
    """Creates, tracks and deletes placeholder pods, in the expander's deciding reconcile (leader only)."""

    def __init__(self, config: AutoscalerConfig, port: PlaceholderPort,
                 forget: Callable[[str], None] = lambda uid: None,
                 clock: Callable[[], float] = time.monotonic,
                 registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self._clock = clock
        self.port = port
        self._forget = forget  # lets the expander flag the pod again
        self._coming: dict[str, Coming] = {}  # by owner uid
        self._release: set[str] = set()
        registry = registry if registry is not None else CollectorRegistry()
        self.created = Counter("tf_extender_placeholder_pods_created_total",
                               "Placeholder pods created for the Cluster Autoscaler", ["pool"],
                               registry=registry)
        Gauge("tf_extender_placeholder_pods", "Placeholder pods the expander tracks (one per node asked for)",
              registry=registry).set_function(lambda: len(self._coming))

    def __len__(self) -> int:
        return len(self._coming)

    def provisioner(self, gpupool: Mapping[str, Any] | None) -> Provisioner:
        return pool_provisioner(gpupool, self.config.provisioner)

    def waiting_on(self, uid: str) -> Coming | None:
        for coming in self._coming.values():
            if uid == coming.owner.uid or uid in coming.riders:
                return coming
        return None

    # -- the filter's side (sync, cheap) ------------------------------------------------------------

    def not_capacity_only(self, uid: str) -> None:
        """The pod was filtered again and is no longer a capacity-only failure: its placeholder goes."""
        if uid in self._coming:
            self._release.add(uid)
        elif self._coming:
            for coming in self._coming.values():
                coming.riders.pop(uid, None)

    # -- the worker's side ----------------------------------------------------------------------------

    async def provide(self, pod: dict[str, Any], request: GPURequest, candidates: Sequence[str]) -> None:
        """Make sure a placeholder covers ``pod``: ride on one coming, or create one."""
        ref = PodRef.of(pod)
        if skip_reason(pod, ref.uid) is not None:
            self._forget(ref.uid)
            return
        if self.waiting_on(ref.uid) is not None:
            return
        key = constraints_key(pod, request.pool)
        cpu, memory = pod_cpu_memory(pod)
        for coming in self._coming.values():
            positions = coming.room_for(key, request, cpu, memory)
            if positions is not None:
                coming.count(positions, request, cpu, memory)
                coming.riders[ref.uid] = ref
                self.port.record(pod, REASON_WAITING,
                                 f"placeholder pod {self.config.namespace}/{coming.name} already asks the "
                                 "Cluster Autoscaler for a node with room for this pod: no new placeholder")
                return
        template = self._template(request, candidates)
        if template is None:
            self._forget(ref.uid)
            self.port.record(pod, REASON_FAILED,
                             f"no candidate node would fit {request.describe()} of pool {request.pool} even "
                             "when empty, so no placeholder pod can ask for a node like it", "Warning")
            return
        await self._create(pod, ref, request, key, cpu, memory, template)

    def _template(self, request: GPURequest, candidates: Sequence[str]) -> str | None:
        for name in sorted(set(candidates)):
            devices = self.port.node_gpus(name)
            if devices and empty_copy_fits(devices, request):
                return name
        return None

    async def _create(self, pod: dict[str, Any], ref: PodRef, request: GPURequest, key: str,
                      cpu: Fraction, memory: Fraction, template: str) -> None:
        node = self.port.node(template) or {}
        try:
            owner = await self.port.placeholder_owner()
            body = placeholder_body(
                pod, request, namespace=self.config.namespace, image=self.config.image,
                scheduler_name=self.config.scheduler_name,
                priority_class=self.config.placeholder_priority_class, template_node=template,
                template_labels=(node.get("metadata") or {}).get("labels") or {}, owner=owner)
            created = await self.port.create_pod(self.config.namespace, body)
        except Exception as exc:
            if error_status(exc) == 409:  # already there (made before a restart): adopted by settle()
                return
            self._forget(ref.uid)  # the next rejection tries again
            self.port.record(pod, REASON_FAILED, f"creating a placeholder pod failed: {exc}", "Warning")
            return
        meta = created.get("metadata") or {}
        coming = self._track(str(meta.get("name") or body["metadata"]["name"]), str(meta.get("uid") or ""),
                             ref, key, template)
        positions = coming.room_for(key, request, cpu, memory)
        if positions is not None:
            coming.count(positions, request, cpu, memory)
        self.created.labels(pool=request.pool).inc()
        self.port.record(pod, REASON_COMPLETED,
                         f"created placeholder pod {self.config.namespace}/{coming.name} "
                         f"({describe_requests(body)}, modelled on node {template}) for the Cluster "
                         "Autoscaler; it is deleted once this pod is placed")

    def _track(self, name: str, uid: str, owner: PodRef, key: str, template: str) -> Coming:
        cpu, memory = node_cpu_memory(self.port.node(template))
        coming = Coming(name, uid, owner, key, empty_copy(self.port.node_gpus(template)), cpu, memory,
                        self._clock())
        self._coming[owner.uid] = coming
        return coming

    async def settle(self) -> None:
        """Delete placeholders whose pod no longer needs them; adopt the ones found after a restart."""
        seen: set[str] = set()
        for placeholder in self.port.placeholder_pods():
            meta = placeholder.get("metadata") or {}
            owner = _owner_of(placeholder)
            if meta.get("namespace") != self.config.namespace:
                continue
            if meta.get("deletionTimestamp"):
                continue  # on its way out; forgotten once it is gone
            name, uid = str(meta.get("name") or ""), str(meta.get("uid") or "")
            why = self._obsolete(owner)
            if why is not None or owner is None:
                await self._delete(name, uid, owner, why or "")
                continue
            seen.add(owner.uid)
            coming = self._coming.get(owner.uid)
            if coming is None:  # adopted after a restart
                pod = self.port.gpu_pod(owner.namespace, owner.name) or {}
                template = str((meta.get("annotations") or {}).get(PLACEHOLDER_TEMPLATE) or "")
                coming = self._track(name, uid, owner, constraints_key(pod, _pool_of(pod)), template)
            coming.seen = True
            coming.arrived = bool((placeholder.get("spec") or {}).get("nodeName"))
        now = self._clock()
        for owner_uid in [u for u, c in self._coming.items()
                          if u not in seen and (c.seen or now - c.created_at > UNSEEN_GRACE_SECONDS)]:
            self._drop(owner_uid)
        self._release &= set(self._coming)

    def _obsolete(self, owner: PodRef | None) -> str | None:
        if owner is None:
            return "it names no pod"
        if owner.uid in self._release:
            return "its pod is no longer a capacity-only failure"
        return skip_reason(self.port.gpu_pod(owner.namespace, owner.name), owner.uid)

    async def _delete(self, name: str, uid: str, owner: PodRef | None, why: str) -> None:
        try:
            await self.port.delete_pod(self.config.namespace, name, uid)
            log.info("placeholder deleted", extra={"placeholder": name, "pod": str(owner), "reason": why})
        except Exception as exc:
            log.warning("deleting a placeholder failed", extra={"placeholder": name, "error": str(exc)})
            return
        if owner is not None:
            self._drop(owner.uid)

    def _drop(self, owner_uid: str) -> None:
        coming = self._coming.pop(owner_uid, None)
        self._release.discard(owner_uid)
        self._forget(owner_uid)
        if coming is not None:
            for uid in coming.riders:
                self._forget(uid)


def _pool_of(pod: Mapping[str, Any]) -> str:
    return str(((pod.get("metadata") or {}).get("annotations") or {}).get(GPU_POOL) or "")

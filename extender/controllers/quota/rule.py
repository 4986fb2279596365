"""The quota's part in the verbs (``server/hooks.py``): the filter refuses a pod its namespace's quota does
not admit, the bind checks again against the ledger at the moment of the reservation, and preemption
counts the quota net of its victims (``ClusterState.quota_gate``).

- A single cap breached is unresolvable: every node in ``FailedAndUnresolvableNodes`` (no preemption, no
  expansion). A total breached: every node in ``FailedNodes`` with ``capacity_only`` False, so preemption
  may free the quota and expansion buys nothing. Either records ``GPUQuotaOrCapacityNotEnough`` on the pod.
- ``admit``: usage from the ledger (bound pods, binds in flight, filters' holds, the pod's own left out)
  plus this pod must stay within every total; the reservation follows with no await between, so a burst
  never overshoots. A request whose amounts depend on its GPUs (a percent, a whole GPU) is checked in
  ``admit_reserved``, on the GPUs just reserved.
- Until the quota cache has synced (a restart), the verbs answer an error for pods of any namespace: an
  unread quota must not let a burst through.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, Protocol

from extender.common.contract import GPURequest
from extender.common.pods import pod_key, pod_uid
from extender.controllers.quota.controller import QuotaMetrics
from extender.quota import Refusal
from extender.quota.book import QuotaBook, pod_namespace
from extender.scheduling.state import FilterOutcome, refused_outcome
from extender.server.hooks import FilterHook

log = logging.getLogger(__name__)

EVENT_REASON = "GPUQuotaOrCapacityNotEnough"  # TensorFusion's
EVENT_EVERY_SECONDS = 30.0  # at most one refusal event per pod and message this often


class EventSink(Protocol):
    def record(self, obj: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None: ...


class Synced(Protocol):
    @property
    def synced(self) -> Any: ...


class GPUsOf(Protocol):
    def __call__(self, node: str) -> Sequence[Any]: ...  # GPUView-like: pool, capacity_tflops, capacity_vram


def _no_gpus(node: str) -> Sequence[Any]:
    return ()


class QuotaRule(FilterHook):
    def __init__(self, book: QuotaBook, quotas: Synced, events: EventSink | None = None,
                 metrics: QuotaMetrics | None = None,
                 clock: Callable[[], float] = time.monotonic, node_gpus: GPUsOf | None = None) -> None:
        self.book = book
        # the GPUs of a node (``ClusterState.node_gpus``), for the least capacity a percent request may get
        self.node_gpus: GPUsOf = node_gpus if node_gpus is not None else _no_gpus
        self.quotas = quotas
        self.events = events
        self.clock = clock
        self.refusals = (metrics or QuotaMetrics(None)).refusals
        self._told: dict[str, tuple[str, float]] = {}  # pod uid -> last event message, when

    def _unsynced(self) -> str | None:
        if self.quotas.synced.is_set():
            return None
        return "GPU quotas not read yet (GPUResourceQuota cache not synced)"

    def _refused(self, pod: dict[str, Any], refusal: Refusal, verb: str) -> None:
        self.refusals.labels(refusal.namespace, refusal.dimension.value, verb).inc()
        if self.events is None:
            return
        uid, now = pod_uid(pod), self.clock()
        told = self._told.get(uid)
        if told is not None and told[0] == refusal.message and now - told[1] < EVENT_EVERY_SECONDS:
            return
        if len(self._told) > 10_000:
            self._told.clear()
        self._told[uid] = (refusal.message, now)
        self.events.record(pod, EVENT_REASON, refusal.message, "Warning")

    def before_filter(self, pod: dict[str, Any], node_names: Sequence[str]) -> FilterOutcome | None:
        if (waiting := self._unsynced()) is not None:
            return FilterOutcome([], {}, {}, waiting, False)
        refusal = self.book.blocks(pod, self._smallest(pod, node_names))
        if refusal is None:
            return None
        self._refused(pod, refusal, "filter")
        return refused_outcome(refusal.message, refusal.unresolvable, node_names)

    def _smallest(self, pod: dict[str, Any], node_names: Sequence[str]) -> tuple[Fraction, int] | None:
        """For a request counted on the GPUs it lands on: the least TFLOPS and VRAM of the GPUs of its pool
        on the candidate nodes (a lower bound of what it takes); None for other requests or no GPU."""
        request = self._counted_on_its_gpus(pod)
        if request is None:
            return None
        gpus = [g for name in node_names for g in self.node_gpus(name) if g.pool == request.pool]
        if not gpus:
            return None
        return min(g.capacity_tflops for g in gpus), min(g.capacity_vram for g in gpus)

    def admit(self, pod: dict[str, Any], node: str) -> str | None:
        if (waiting := self._unsynced()) is not None:
            return waiting
        refusal = self.book.blocks(pod)
        if refusal is None:
            return None
        self._refused(pod, refusal, "bind")
        log.info("bind refused by quota", extra={"pod": pod_key(pod), "reason": refusal.message})
        return refusal.message

    def _counted_on_its_gpus(self, pod: dict[str, Any]) -> GPURequest | None:
        """The pod's request when a quota applies to it and it counts in the TFLOPS and VRAM of the GPUs it
        lands on (a percent of a GPU, or a whole one); None otherwise (its amounts are its own)."""
        if not self.book.quotas(pod_namespace(pod)):
            return None
        try:
            request = self.book.state.request_of(pod)
        except Exception:
            return None
        return request if request.takes_whole_gpu or request.uses_percent else None

    def admit_reserved(self, pod: dict[str, Any], node: str, gpu_ids: Sequence[str]) -> str | None:
        book = self.book
        request = self._counted_on_its_gpus(pod)
        if request is None:
            return None  # no quota, or its amounts did not depend on the GPUs: admit has checked it
        capacities = [book.state.gpu_capacity(gpu) or (Fraction(0), 0) for gpu in gpu_ids]
        refusal = book.refusal(pod, request, capacities)
        if refusal is None:
            return None
        self._refused(pod, refusal, "bind")
        return refusal.message

    def blocks(self, pod: Any) -> Refusal | None:
        """``ClusterState.quota_gate``: the pod's refusal now, recording nothing."""
        return self.book.blocks(pod) if self.quotas.synced.is_set() else None

    def refusal_together(self, pods: Sequence[tuple[Any, Any]]) -> Refusal | None:
        """``ClusterState.quota_gate`` for pods placed at once (a gang): see ``QuotaBook.refusal_together``.
        Like ``blocks``, nothing until the quotas are read (each member's ``admit`` at bind waits)."""
        return self.book.refusal_together(pods) if self.quotas.synced.is_set() else None

    def resize_room(self, pod: dict[str, Any], allocation: Any, tflops: Fraction | None,
                    vram: int | None) -> tuple[Fraction | None, int | None, str]:
        """The autoscaler's resizes (``server/resize.py``): see ``QuotaBook.resize_room``."""
        return self.book.resize_room(pod, allocation, tflops, vram)

    def fits_without(self, pod: Any, request: Any) -> Any:
        """``ClusterState.quota_gate``: see ``QuotaBook.fits_without``."""
        return self.book.fits_without(pod, request)

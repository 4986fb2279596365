"""The expander's intake: the filter's rejections (a ``FilterHook``) and the pod watch's Unschedulable pods
become pending pods and, once flagged, queued decisions due after the delay; ``worker.Expander`` reconciles
them. Nothing here awaits or calls the API server (events are recorded through the port's recorder)."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from extender.common.contract import GPURequest, parse_request
from extender.controllers.expansion.config import ExpansionConfig
from extender.controllers.expansion.decide import ClusterView, skip_reason
from extender.controllers.expansion.detect import (
    REASON_CHECK,
    CapacityFailureLog,
    FilterResult,
    expands_pool,
    is_capacity_only,
    unschedulable,
)
from extender.controllers.expansion.inflight import InFlight, PodRef
from extender.controllers.expansion.karpenter import nodepool_admits, pool_nodepools
from extender.controllers.expansion.metrics import ExpansionMetrics
from extender.controllers.expansion.placeholders import Placeholders
from extender.controllers.expansion.provisioner import Provisioner
from extender.controllers.runner import Wake
from extender.scheduling.state import FilterOutcome
from extender.server.hooks import FilterHook

log = logging.getLogger(__name__)

ARRIVAL_GRACE_SECONDS = 15.0
MAX_PENDING = 50_000


class ExpansionPort(ClusterView, Protocol):
    """The expander's I/O: cached reads, the pod re-read, the claim write, events."""

    def nodeclaim(self, name: str) -> Mapping[str, Any] | None: ...

    def gpupool(self, name: str) -> Mapping[str, Any] | None: ...

    def node_arrived(self, node_name: str, provider_id: str) -> bool: ...

    def all_nodes(self) -> Sequence[Mapping[str, Any]]: ...

    def cached_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pod as the watch last showed it (no API call)."""
        ...

    def node_added_at(self) -> float | None:
        """When (monotonic) the last Node was added, None if none since start."""
        ...

    def record(self, obj: Mapping[str, Any], reason: str, message: str, type_: str = "Normal") -> None: ...

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def pod_events(self, namespace: str, uid: str) -> list[dict[str, Any]]: ...

    async def create_nodeclaim(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def delete_nodeclaim(self, name: str) -> None: ...


@dataclass
class Queued:
    pod: PodRef
    request: GPURequest
    candidates: tuple[str, ...]
    announced_wait: bool = False


@dataclass
class Pending:
    """A pending pod the expander may have to grow the cluster for. ``candidates``: the nodes of its last
    filter call (none: kube-scheduler found no node for it and never asked); ``seen_at``: that call's
    time, or when the watch first showed the pod Unschedulable; ``since``: when it was first turned away."""

    pod: PodRef
    candidates: tuple[str, ...]
    since: float
    seen_at: float


RequestOf = Callable[[Mapping[str, Any]], GPURequest]
# The filter on the current picture, without side effects (``ClusterState.filter``).
Refilter = Callable[[dict[str, Any], Sequence[str]], FilterResult]


def parse_annotations(pod: Mapping[str, Any]) -> GPURequest:
    return parse_request((pod.get("metadata") or {}).get("annotations") or {})


def new_expansion_id() -> str:
    return uuid.uuid4().hex[:12]


class Intake(FilterHook):
    """The expander's intake: what the filter (``after_filter``) and the pod watch (``pod_changed``) tell it,
    kept as the pending pods and the queue of flagged pods due for a decision (``Expander`` reconciles them).
    Sync, cheap and never raises: it runs on the filter's path and in watch callbacks."""

    def __init__(self, config: ExpansionConfig, port: ExpansionPort, *,
                 request_of: RequestOf = parse_annotations, metrics: ExpansionMetrics | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 new_id: Callable[[], str] = new_expansion_id, refilter: Refilter | None = None) -> None:
        self.config = config
        self.metrics = metrics or ExpansionMetrics()
        self._request_of = request_of
        self.port = port
        self.inflight = InFlight(config.max_in_flight, config.claim_timeout_seconds)
        self.flagged = CapacityFailureLog()
        self._clock = clock
        self._new_id = new_id
        self._due: list[tuple[float, int, Queued]] = []
        self._order = itertools.count()
        self._slot_waiters: dict[str, Queued] = {}
        # What wakes the reconciles: the in-flight claims' (every replica) and the decisions' (the leader's).
        self.claims_wake = Wake()
        self.decisions_wake = Wake()
        # Placeholder pods for the Cluster Autoscaler (expansion.placeholders); None: Karpenter only.
        self.placeholders: Placeholders | None = None
        # Pods the filter has seen with at least one candidate node (so not "no candidate at all").
        self.filtered = CapacityFailureLog()
        self._warned_nodepools: dict[str, str] = {}
        # Pods whose claim's node arrived: flaggable again only after the grace (uid -> its end). A rejection
        # during the grace is kept (uid -> entry) and acted on at its end if the pod is still pending then.
        self._grace: dict[str, float] = {}
        self._rejected_in_grace: dict[str, Queued] = {}
        self.arrival_grace = max(ARRIVAL_GRACE_SECONDS, config.delay_seconds)
        self._nodepools_checked_at: float | None = None
        # Level triggering: the pods to reconsider, the parked decisions (uid -> what was decided), pods
        # whose expansion failed (uid -> when to try again), and when the last pass ran.
        self._refilter = refilter
        self.pending: OrderedDict[str, Pending] = OrderedDict()
        self._parked: dict[str, str] = {}
        self._retry_at: dict[str, float] = {}
        self._inputs_changed = True
        self._reconsidered_at: float | None = None

    # -- the filter's side: sync, cheap, never raises ----------------------------------------------

    def notice(self, pod: dict[str, Any], outcome: FilterResult, candidate_nodes: list[str]) -> None:
        """Called by the filter handler for every rejected or accepted pod."""
        try:
            self._notice(pod, outcome, candidate_nodes)
        except Exception:
            log.exception("expansion notice failed")

    def after_filter(self, pod: dict[str, Any], outcome: FilterOutcome) -> None:
        """``notice`` as the filter's hook: the candidates are every node the outcome names."""
        self.notice(pod, outcome, [*outcome.fits, *outcome.failed, *outcome.unresolvable])

    def _notice(self, pod: dict[str, Any], outcome: FilterResult, candidate_nodes: list[str]) -> None:
        if not self.config.enabled:
            return
        ref = PodRef.of(pod)
        capacity_only = is_capacity_only(outcome, candidate_nodes)
        if not capacity_only and self.placeholders is not None and len(self.placeholders):
            self.placeholders.not_capacity_only(ref.uid)
        if candidate_nodes:
            self.filtered.first_time(ref.uid)
        if outcome.error or getattr(outcome, "fits", None):
            self._forget_pending(ref.uid)
            return
        self._remember(ref, tuple(candidate_nodes))
        if ref.uid in self._grace and ref.uid not in self._rejected_in_grace:
            with contextlib.suppress(Exception):
                self._rejected_in_grace[ref.uid] = Queued(ref, self._request_of(pod), tuple(candidate_nodes))
        if ref.uid in self.flagged:
            return
        self._consider(pod, ref, capacity_only, candidate_nodes)

    def _consider(self, pod: dict[str, Any], ref: PodRef, capacity_only: bool, candidate_nodes: Sequence[str],
                  since: float | None = None) -> None:
        if capacity_only:
            self._flag(pod, ref, candidate_nodes,
                       "no candidate node has {what} free in pool {pool}, but an empty node would fit it",
                       since)
        elif self._no_gpu_of_pool(pod, list(candidate_nodes)):
            self._flag(pod, ref, candidate_nodes,
                       "no candidate node has GPUs of pool {pool} yet ({what} wanted)", since)

    def _remember(self, ref: PodRef, candidates: tuple[str, ...]) -> None:
        now = self._clock()
        known = self.pending.pop(ref.uid, None)
        self.pending[ref.uid] = Pending(ref, candidates, known.since if known else now, now)
        while len(self.pending) > MAX_PENDING:
            uid, _ = self.pending.popitem(last=False)
            self._parked.pop(uid, None)
            self._retry_at.pop(uid, None)

    def _forget_pending(self, uid: str) -> None:
        self.pending.pop(uid, None)
        self._parked.pop(uid, None)
        self._retry_at.pop(uid, None)

    def _no_gpu_of_pool(self, pod: dict[str, Any], candidate_nodes: list[str]) -> bool:
        """No candidate holds a GPU of the pod's pool, and the pool has NodePools to grow from."""
        try:
            request = self._request_of(pod)
        except Exception:
            return False
        gpupool = self.port.gpupool(request.pool)
        placeholders = self.placeholders
        if placeholders is not None and placeholders.provisioner(gpupool) is Provisioner.CLUSTER_AUTOSCALER:
            return False
        nodepools = pool_nodepools(gpupool, request.pool, self.port.all_nodepools())
        if not any(nodepool_admits(pod, nodepool) for nodepool in nodepools):
            return False
        return not any(d.pool == request.pool for name in candidate_nodes for d in self.port.node_gpus(name))

    def _flag(self, pod: dict[str, Any], ref: PodRef, candidate_nodes: Sequence[str], why: str,
              since: float | None = None) -> None:
        """Flag the pod (once: an event and the metric) and queue it, due ``delay`` after ``since`` (when it
        was first turned away; default now)."""
        try:
            request = self._request_of(pod)
        except Exception:  # a pod the contract rejects was never capacity-only
            return
        if not expands_pool(self.port.gpupool(request.pool)) or not self.flagged.first_time(ref.uid):
            return
        self.metrics.capacity_only_failures.labels(pool=request.pool).inc()
        self.port.record(pod, REASON_CHECK,
                         why.format(what=request.describe(), pool=request.pool)
                         + f": node expansion is considered in {self.config.delay_seconds:g}s")
        now = self._clock()
        self._push(Queued(ref, request, tuple(candidate_nodes)),
                   max(now, (now if since is None else since) + self.config.delay_seconds))

    def pod_changed(self, pod: dict[str, Any]) -> None:
        """A pending GPU pod of the scheduler profile changed. One the scheduler found Unschedulable without
        ever asking the extender (no node passed its own filters) gets the scale-from-zero path."""
        try:
            if not self.config.enabled:
                return
            ref = PodRef.of(pod)
            if not unschedulable(pod, self.config.scheduler_name):
                if skip_reason(pod, ref.uid) is not None:
                    self._forget_pending(ref.uid)
                return
            if ref.uid not in self.pending:
                self._remember(ref, ())
            if ref.uid in self.filtered or ref.uid in self.flagged:
                return
            if self._no_gpu_of_pool(pod, []):
                self._flag(pod, ref, (), "no node passed the scheduler's own filters for this pod and pool "
                                         "{pool} has no GPU node for it ({what} wanted)")
        except Exception:
            log.exception("expansion pod watch failed")

    def wake(self, *_: Any) -> None:
        """Something changed (a claim, a node, a NodePool, a GPUPool): settle the in-flight set now rather
        than at the next pass, and reconsider the pending pods. A watch listener as it is."""
        self._inputs_changed = True
        self.claims_wake()
        self.decisions_wake()

    def _push(self, entry: Queued, due: float) -> None:
        heapq.heappush(self._due, (due, next(self._order), entry))
        self.decisions_wake()

    @property
    def queued(self) -> int:
        return len(self._due) + len(self._slot_waiters)

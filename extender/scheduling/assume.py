"""The assume cache: GPUs counted for pods before the API server shows them bound (kube-scheduler's
``AssumePod`` / ``ForgetPod``).

- A *reservation* is a bind's choice of GPUs, made before the bind's first await and kept until the watch
  shows the pod bound (or gone), or the bind fails and releases it.
- A *hold* is a filter's first choice, kept for the bind that should follow (kube-scheduler pipelines: it
  filters the next pods while earlier binds are still on their way); the bind takes it over, an unused
  hold lapses after ``hold_seconds``.
- A *gang hold* is one member's part of a gang placed whole (``extender.gang``): explicit node and GPUs,
  kept until the member's bind takes it or the gang releases all its holds at once (``release_gang``);
  it never lapses by itself. A member's failed bind gives its GPUs back to the gang hold, not to the pool.

Both are ledger reservations on the picture (``Cluster``); this module keeps what they are for.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from extender.common.contract import GPURequest
from extender.common.pods import TERMINAL_PHASES, pod_index, pod_key, pod_priority, pod_uid
from extender.scheduling.cluster import Cluster, PodRecord
from extender.scheduling.ledger import Allocation
from extender.scheduling.placement import Fit, Slot, choose_gpus, evaluate, tier_of, topology_settings
from extender.scheduling.requests import Parsed, PlacementError

HOLD_SECONDS = 10.0  # a filter's first choice is held this long for the bind that should follow
_NOT_WAITING_PHASES = frozenset({"Running", *TERMINAL_PHASES})


@dataclass(frozen=True)
class Reservation:
    pod_key: str
    pod_uid: str
    node: str
    gpu_ids: tuple[str, ...]
    request: GPURequest
    tier: int | None = None  # a multi-GPU pod: the GPU topology tier of its GPUs (docs/topology.md)


class AssumeCache:
    def __init__(self, cluster: Cluster, *, clock: Callable[[], float] = time.monotonic,
                 hold_seconds: float = HOLD_SECONDS) -> None:
        self._cluster = cluster
        self._ledger = cluster.ledger
        self._clock = clock
        self._hold_seconds = hold_seconds
        self._reservations: dict[str, tuple[Reservation, Allocation]] = {}
        self._reserved_pods: dict[str, PodRecord] = {}
        self._reserved_by_node: dict[str | None, set[str]] = {}  # node -> uids in _reserved_pods
        self._holds: dict[str, Allocation] = {}
        self._hold_queue: deque[tuple[float, Allocation]] = deque()
        self._gang_holds: dict[str, tuple[str, Allocation]] = {}  # uid -> (gang, allocation)
        self._gang_reserved: dict[str, str] = {}  # uid -> gang, for reservations taken from a gang hold

    def copy_onto(self, cluster: Cluster) -> AssumeCache:
        """An independent copy for a what-if copy of the picture (whose ledger holds the same allocations)."""
        other = copy.copy(self)
        other._cluster, other._ledger = cluster, cluster.ledger
        other._reservations = dict(self._reservations)
        other._reserved_pods = dict(self._reserved_pods)
        other._reserved_by_node = {node: set(uids) for node, uids in self._reserved_by_node.items()}
        other._holds = dict(self._holds)
        other._hold_queue = deque(self._hold_queue)
        other._gang_holds = dict(self._gang_holds)
        other._gang_reserved = dict(self._gang_reserved)
        return other

    # --- reservations -----------------------------------------------------------------------------

    def reserve(self, pod: Mapping[str, Any], node: str, request: GPURequest) -> Reservation:
        cluster, ledger = self._cluster, self._ledger
        uid, key = pod_uid(pod), pod_key(pod)
        bound = ledger.bound(uid)
        if bound is not None:
            raise PlacementError(f"pod {key} already holds GPUs {','.join(bound.gpu_ids)} on {bound.node}")
        # the filter's hold for this bind: its GPUs were chosen when only the pods before this one were
        # counted, so they are kept while they still fit (re-choosing now would also count the holds of
        # pods filtered since, and a burst would pack differently from one-by-one submission)
        hold = self._take_hold(uid)
        if uid in self._gang_holds:
            return self._reserve_gang_hold(pod, node, request)
        # A retry replaces the pod's earlier reservation, which is restored if the new one fails.
        previous = self._reservations.pop(uid, None)
        if previous is not None:
            cluster.touch(ledger.release(previous[1]))
        verdict = evaluate(cluster.slots(node), request, ledger.pods_on(node), cluster.max_pods,
                           topology=cluster.topology_for(request.pool))
        if verdict.fit is not Fit.FITS:
            if previous is not None:
                self._reservations[uid] = previous
                cluster.touch(ledger.reserve(previous[1]))
            raise PlacementError(f"node {node}: {verdict.message}")
        gpu_ids = _held_gpus(hold, node, request, verdict.fitting) or choose_gpus(
            verdict.fitting, request, cluster.mode_for(request.pool), cluster.topology_for(request.pool))
        priority = pod_priority(pod)
        allocation = Allocation(uid, key, node, gpu_ids, request, priority)
        reservation = Reservation(key, uid, node, gpu_ids, request, _tier(cluster, node, gpu_ids, request))
        self._reservations[uid] = (reservation, allocation)
        self._add_reserved_pod(PodRecord(uid, key, node, "", pod_index(pod), priority))
        cluster.touch(ledger.reserve(allocation))
        return reservation

    def _reserve_gang_hold(self, pod: Mapping[str, Any], node: str, request: GPURequest) -> Reservation:
        """The bind of a gang member: exactly the node and GPUs its gang chose (already counted)."""
        uid = pod_uid(pod)
        gang, held = self._gang_holds[uid]
        if held.node != node:
            raise PlacementError(f"its gang {gang} holds GPUs {','.join(held.gpu_ids)} for it on node "
                                 f"{held.node}, not {node}")
        del self._gang_holds[uid]
        reservation = Reservation(held.pod_key, uid, node, held.gpu_ids, held.request,
                                  _tier(self._cluster, node, held.gpu_ids, held.request))
        self._reservations[uid] = (reservation, held)
        self._gang_reserved[uid] = gang
        self._add_reserved_pod(PodRecord(uid, held.pod_key, node, "", pod_index(pod), held.priority))
        return reservation

    def reservation(self, uid: str) -> Reservation | None:
        held = self._reservations.get(uid)
        return held[0] if held is not None else None

    def release(self, reservation: Reservation) -> None:
        held = self._reservations.get(reservation.pod_uid)
        if held is None or held[0] != reservation:
            return
        del self._reservations[reservation.pod_uid]
        self._pop_reserved_pod(reservation.pod_uid)
        gang = self._gang_reserved.pop(reservation.pod_uid, None)
        if gang is not None:  # a member's bind failed: its GPUs stay its gang's, for the retry
            self._gang_holds[reservation.pod_uid] = (gang, held[1])
            return
        self._cluster.freed(self._ledger.release(held[1]))

    def forget(self, uid: str) -> None:
        """The pod is bound as the watch shows it, or gone: what was assumed for it is spent (the ledger
        has already settled its count)."""
        self._reservations.pop(uid, None)
        self._pop_reserved_pod(uid)
        self._holds.pop(uid, None)
        self._gang_holds.pop(uid, None)
        self._gang_reserved.pop(uid, None)

    def _add_reserved_pod(self, pod: PodRecord) -> None:
        self._pop_reserved_pod(pod.uid)  # a retry may reserve on another node
        self._reserved_pods[pod.uid] = pod
        self._reserved_by_node.setdefault(pod.node, set()).add(pod.uid)

    def _pop_reserved_pod(self, uid: str) -> None:
        pod = self._reserved_pods.pop(uid, None)
        if pod is not None:
            on_node = self._reserved_by_node[pod.node]
            on_node.discard(uid)
            if not on_node:
                del self._reserved_by_node[pod.node]

    # --- holds ------------------------------------------------------------------------------------

    def hold(self, pod: Mapping[str, Any], parsed: Parsed, node: str) -> None:
        """Hold the GPUs the bind of ``pod`` on ``node`` would take, so that the filters of the pods
        scheduled before that bind arrives do not count the same room free."""
        cluster, ledger = self._cluster, self._ledger
        uid = pod_uid(pod)
        if uid in self._reservations or uid in self._gang_holds or ledger.bound(uid) is not None:
            return
        previous = self._holds.pop(uid, None)
        if previous is not None:
            cluster.touch(ledger.release(previous))
        verdict = evaluate(cluster.slots(node), parsed.request, ledger.pods_on(node), cluster.max_pods,
                           parsed.demand, cluster.topology_for(parsed.request.pool))
        if verdict.fit is not Fit.FITS:
            return
        gpu_ids = choose_gpus(verdict.fitting, parsed.request, cluster.mode_for(parsed.request.pool),
                              cluster.topology_for(parsed.request.pool))
        allocation = Allocation(uid, pod_key(pod), node, gpu_ids, parsed.request, pod_priority(pod))
        self._holds[uid] = allocation
        self._hold_queue.append((self._clock() + self._hold_seconds, allocation))
        cluster.touch(ledger.reserve(allocation))

    def _take_hold(self, uid: str) -> Allocation | None:
        allocation = self._holds.pop(uid, None)
        if allocation is not None:
            self._cluster.touch(self._ledger.release(allocation))
        return allocation

    def lapse_holds(self) -> None:
        """Release the holds whose time is up."""
        queue = self._hold_queue
        if not queue:
            return
        now = self._clock()
        while queue and queue[0][0] <= now:
            _, allocation = queue.popleft()
            if self._holds.get(allocation.uid) is allocation:
                del self._holds[allocation.uid]
                self._cluster.freed(self._ledger.release(allocation))

    def held_node(self, pod: Mapping[str, Any]) -> str | None:
        """The node of the pod's own reservation (its bind is in flight, or done and not yet watched) or
        of its hold (a filter chose that node, the bind has not come yet)."""
        if not self._reservations and not self._holds and not self._gang_holds:
            return None
        uid = pod_uid(pod)
        held = self._reservations.get(uid)
        if held is not None:
            return held[0].node
        if (gang_hold := self._gang_holds.get(uid)) is not None:
            return gang_hold[1].node
        hold = self._holds.get(uid)
        return hold.node if hold is not None else None

    # --- gang holds -------------------------------------------------------------------------------

    def hold_gang(self, gang: str, allocations: Iterable[Allocation]) -> None:
        """Hold each member's node and GPUs for gang ``gang`` (chosen together by the caller), replacing
        what the gang held before. No lapse: the holds stay until the members bind or ``release_gang``."""
        self.release_gang(gang)
        for allocation in allocations:
            self._take_hold(allocation.uid)
            self._gang_holds[allocation.uid] = (gang, allocation)
            self._cluster.touch(self._ledger.reserve(allocation))

    def release_gang(self, gang: str) -> list[str]:
        """Give back every GPU the gang holds for members not bound yet (their binds in flight keep
        theirs); the uids released."""
        released = [uid for uid, (group, _) in self._gang_holds.items() if group == gang]
        freed: set[str] = set()
        for uid in released:
            freed |= self._ledger.release(self._gang_holds.pop(uid)[1])
        if freed:
            self._cluster.freed(freed)
        return released

    def gang_holds(self) -> dict[str, list[Allocation]]:
        """Gang -> the holds of its members not yet binding."""
        out: dict[str, list[Allocation]] = {}
        for gang, allocation in self._gang_holds.values():
            out.setdefault(gang, []).append(allocation)
        return out

    def gang_binding(self, uid: str) -> str | None:
        """The gang of a member whose bind took its gang hold and is still in flight."""
        return self._gang_reserved.get(uid)

    # --- pod indices ------------------------------------------------------------------------------

    def pending_index_holder(self, node: str, index: int, pod_uid: str) -> str | None:
        """The first (by name) other pod on ``node``, watched or assumed, that waits with pod index
        ``index``."""
        def waits_with_index(pod: PodRecord) -> bool:
            return pod.uid != pod_uid and pod.index == index and pod.phase not in _NOT_WAITING_PHASES

        records = self._cluster.pods
        on_node = self._cluster.pods_by_node.get(node, set())
        reserved = self._reserved_by_node.get(node, set()) - on_node
        pods = [*map(records.__getitem__, on_node), *map(self._reserved_pods.__getitem__, reserved)]
        holders = [pod.key for pod in pods if waits_with_index(pod)]
        return min(holders) if holders else None  # the first by name, whatever the order of the sets


def _tier(cluster: Cluster, node: str, gpu_ids: tuple[str, ...], request: GPURequest) -> int | None:
    """The topology tier of a multi-GPU pod's GPUs (what its bind event and the placements metric name)."""
    if len(gpu_ids) < 2:
        return None
    source = topology_settings(request, cluster.topology_for(request.pool)).source
    return int(tier_of(cluster.slots(node), gpu_ids, source))


def _held_gpus(hold: Allocation | None, node: str, request: GPURequest,
               fitting: tuple[Slot, ...]) -> tuple[str, ...] | None:
    """The hold's GPUs when it is for this node and request and every one of them still fits."""
    if hold is None or hold.node != node or hold.request != request:
        return None
    names = {slot.name for slot in fitting}
    return hold.gpu_ids if all(gpu in names for gpu in hold.gpu_ids) else None

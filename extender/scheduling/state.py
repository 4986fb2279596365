"""The extender's scheduling verbs over its picture of the cluster (DESIGN §4, §5): a thin facade.

``ClusterState`` is fed API objects (from watches, or a file in the simulator) and answers filter,
prioritize, bind-time reservation and preemption. It does no I/O and never awaits, so a caller on an
event loop sees every verb as atomic. It is composed of:

- ``cluster.Cluster``: the picture (event intake, per-node aggregates, the change log, the ledger);
- ``requests.RequestCache``: pods' requests, parsed once;
- ``verdicts.Verdicts``: filter verdicts per request shape, re-judged only for the nodes changed since;
- ``assume.AssumeCache``: reservations of binds in flight and holds of filters' first choices;
- ``preemption`` and ``views``: functions over the picture.

Planners try placements on ``what_if()``, a copy that fires no callbacks, never on the live instance.
"""

from __future__ import annotations

import gc
import heapq
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from itertools import compress, filterfalse, repeat
from typing import Any

from extender.common.contract import GPU_IDS, ContractError, GPURequest
from extender.common.pods import TERMINAL_PHASES, pod_index, pod_key, pod_priority, pod_uid
from extender.scheduling import preemption, views
from extender.scheduling.assume import HOLD_SECONDS, AssumeCache, Reservation
from extender.scheduling.cluster import Cluster, InventorySource, Kind, PodChange
from extender.scheduling.instance_topology import Shape
from extender.scheduling.ledger import Allocation, RefusalSink, Resized, ResizeOutcome
from extender.scheduling.placement import (
    MAX_SCORE,
    MIN_FIT_SCORE,
    Fit,
    Mode,
    node_order_value,
    parse_mode,
    tier_of,
    topology_settings,
)
from extender.scheduling.preemption import PdbCheck, QuotaGate, Victim
from extender.scheduling.requests import PlacementError, RequestCache
from extender.scheduling.topology import Settings as TopologySettings
from extender.scheduling.topology import Tier
from extender.scheduling.verdicts import UNKNOWN_NODE, Verdicts
from extender.scheduling.views import GPUView, UsageFigures, Utilisation

__all__ = [
    "HOLD_SECONDS", "TERMINAL_PHASES", "UNKNOWN_NODE", "ClusterState", "FilterOutcome", "GPUView",
    "InventorySource", "Kind", "PdbCheck", "PlacementError", "Reservation", "UsageFigures", "Utilisation",
    "Victim", "pod_index", "pod_key", "pod_priority", "pod_uid",
]

_SCORE_LEVELS = MAX_SCORE - MIN_FIT_SCORE + 1


@dataclass(frozen=True)
class FilterOutcome:
    fits: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    error: str | None
    capacity_only: bool


def refused_outcome(message: str, unresolvable: bool, node_names: Sequence[str]) -> FilterOutcome:
    """Every node refused for one reason that holds wherever the pod goes (a namespace's quota):
    unresolvable (no preemption or new node helps), or failed with ``capacity_only`` False."""
    answer = dict.fromkeys(node_names, message)
    return FilterOutcome([], {}, answer, None, False) if unresolvable else FilterOutcome([], answer, {}, None,
                                                                                          False)


class ClusterState:
    def __init__(self, *, inventory: InventorySource = InventorySource.AUTO, max_pods_per_node: int = 256,
                 mode_override: str | None = None, on_refused: RefusalSink | None = None,
                 clock: Callable[[], float] = time.monotonic, hold_seconds: float = HOLD_SECONDS,
                 on_room: Callable[[Iterable[str]], None] | None = None) -> None:
        override = parse_mode(mode_override)
        if mode_override and override is None:
            allowed = ", ".join(m.value for m in Mode)
            raise ValueError(f"unknown placement mode {mode_override!r}; allowed: {allowed}")
        requests = RequestCache()
        cluster = Cluster(requests, inventory=inventory, max_pods_per_node=max_pods_per_node,
                          mode_override=override, on_refused=on_refused, on_room=on_room)
        self._assemble(cluster, AssumeCache(cluster, clock=clock, hold_seconds=hold_seconds))

    def _assemble(self, cluster: Cluster, assume: AssumeCache) -> None:
        # a rule that lets preemption count quota room (controllers/quota sets it on the live state)
        self.quota_gate: QuotaGate | None = None
        self._cluster = cluster
        self._assume = assume
        self._verdicts = Verdicts(cluster)
        self._parse = cluster.requests.parse

    @contextmanager
    def what_if(self) -> Iterator[ClusterState]:
        """A copy to try placements on (``reserve``, ``release``, ``filter`` ...): the live tables stay as
        they are, and the copy fires no callbacks (no room reported, no refusal, nothing that reaches the
        API server). Only what was true when it was made: later events do not reach it."""
        # Copying makes many small containers at once, which sets off full collections of the whole heap
        # (at 5,000 nodes: ~50 ms for the copy with the collector paused, up to several times that without).
        collecting = gc.isenabled()
        gc.disable()
        try:
            cluster = self._cluster.quiet_copy()
            assume = self._assume.copy_onto(cluster)
        finally:
            if collecting:
                gc.enable()
        sim = type(self).__new__(type(self))
        sim._assemble(cluster, assume)
        sim.vector_min = self.vector_min
        sim.quota_gate = self.quota_gate
        yield sim

    # --- events -----------------------------------------------------------------------------------

    def apply(self, kind: Kind, event: str, obj: dict[str, Any]) -> None:
        if self._cluster.apply(kind, event, obj) is not PodChange.UNCHANGED:
            self._assume.forget(pod_uid(obj))

    def set_shapes(self, shapes: Mapping[str, Shape]) -> None:
        """The instance-type topology table (built-in plus a ConfigMap's entries)."""
        self._cluster.set_shapes(shapes)

    def confirm(self, pod: dict[str, Any]) -> None:
        """A pod read from the API server shows it bound with its GPUs: count that allocation now
        instead of when the watch delivers it (the watch later brings the same or a newer state)."""
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if (pod.get("spec") or {}).get("nodeName") and annotations.get(GPU_IDS):
            self.apply(Kind.POD, "MODIFIED", pod)

    # --- requests and settings --------------------------------------------------------------------

    def request_of(self, pod: Mapping[str, Any]) -> GPURequest:
        """The pod's effective request; raises ``PlacementError`` with the contract's message."""
        return self._cluster.requests.request_of(pod, self._cluster.default_pool)

    def mode_for(self, pool: str | None) -> Mode:
        return self._cluster.mode_for(pool)

    def topology_for(self, pool: str | None) -> TopologySettings:
        return self._cluster.topology_for(pool)

    def topology_error(self, template: str) -> str | None:
        """Why a SchedulingConfigTemplate's ``placement.gpuTopology`` was not read (its pools then have
        TensorFusion's defaults), if it was not."""
        return self._cluster.topology_errors.get(template)

    def gpu_tier(self, node: str, gpu_ids: Iterable[str], request: GPURequest) -> Tier:
        """The topology tier of a pod's GPUs on ``node``, judged with the pod's topology source."""
        settings = topology_settings(request, self._cluster.topology_for(request.pool))
        return tier_of(self._cluster.slots(node), gpu_ids, settings.source)

    @property
    def default_pool(self) -> str | None:
        return self._cluster.default_pool

    @property
    def max_pods_per_node(self) -> int:
        return self._cluster.max_pods

    @property
    def vector_min(self) -> int:
        """From this many nodes to judge at once, the columnar fit check is used."""
        return self._verdicts.vector_min

    @vector_min.setter
    def vector_min(self, value: int) -> None:
        self._verdicts.vector_min = value

    def nodes(self) -> list[str]:
        """Every node with at least one GPU known to the extender, by name."""
        return self._cluster.nodes()

    # --- filter and prioritize --------------------------------------------------------------------

    def filter(self, pod: dict[str, Any], node_names: Sequence[str]) -> FilterOutcome:
        assume = self._assume
        assume.lapse_holds()
        if (held := assume.held_node(pod)) is not None:
            # A scheduler retry of a pod whose bind is under way: only that node, so the retried bind joins
            # the one in flight instead of taking a second share elsewhere.
            message = f"the pod's bind to node {held} is in progress"
            return FilterOutcome([n for n in node_names if n == held],
                                 {n: message for n in node_names if n != held}, {}, None, False)
        parsed = self._parse(pod, self._cluster.default_pool)
        if isinstance(parsed, ContractError):
            return FilterOutcome([], {}, {}, str(parsed), False)
        table = self._verdicts.for_nodes(parsed, node_names)
        fits = list(filter(table.fit_load.__contains__, node_names))
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        if len(fits) < len(node_names):
            for name in filterfalse(table.fit_load.__contains__, node_names):
                verdict = table.verdicts[name]
                (failed if verdict.fit is Fit.FAILED else unresolvable)[name] = verdict.message
        return FilterOutcome(fits, failed, unresolvable, None, not fits and bool(failed))

    def filter_with_quota(self, pod: dict[str, Any], node_names: Sequence[str]) -> FilterOutcome:
        """``filter`` with the pod's namespace quota judged first (``quota_gate``), as the verb answers, but
        recording nothing: for the planners and the expander's second look, so that a pod its quota holds
        is never taken for one that lacks capacity."""
        if self.quota_gate is not None and (refusal := self.quota_gate.blocks(pod)) is not None:
            return refused_outcome(refusal.message, refusal.unresolvable, node_names)
        return self.filter(pod, node_names)

    def prioritize(self, pod: dict[str, Any], node_names: Sequence[str]) -> list[tuple[str, int]]:
        if (held := self._assume.held_node(pod)) is not None:
            return [(name, MAX_SCORE if name == held else 0) for name in node_names]
        parsed = self._parse(pod, self._cluster.default_pool)
        if isinstance(parsed, ContractError):
            return [(name, 0) for name in node_names]
        lowest_first = node_order_value(self._cluster.mode_for(parsed.request.pool), 1.0) > 0
        fit_load = self._verdicts.for_nodes(parsed, node_names).fit_load
        fitting = list(map(fit_load.__getitem__, filter(fit_load.__contains__, node_names)))
        pick = heapq.nsmallest if lowest_first else heapq.nlargest
        # The first choice (ties by name) alone gets 10; the other fitting nodes get 9 .. 1 by distinct
        # load, so kube-scheduler never picks at random among nodes the mode ranks equal.
        best = pick(_SCORE_LEVELS, set(fitting))
        shift = 1 if best and fitting.count(best[0]) > 1 else 0  # nodes tied with the first choice get 9
        best = best[: _SCORE_LEVELS - shift]
        score_of: dict[float | None, int] = {v: MAX_SCORE - shift - rank for rank, v in enumerate(best)}
        score_of[None] = 0
        scores = list(map(score_of.get, map(fit_load.get, node_names), repeat(MIN_FIT_SCORE)))
        if shift:  # without ties the first choice already scores 10; with them, the first by name does
            first = min(compress(node_names, map((MAX_SCORE - 1).__eq__, scores)))
            scores[node_names.index(first)] = MAX_SCORE
        return list(zip(node_names, scores, strict=False))

    def first_choice(self, pod: dict[str, Any], outcome: FilterOutcome, *,
                     hold: bool = True) -> FilterOutcome:
        """``outcome`` with the fitting nodes narrowed to the one prioritize would score 10 (the mode's
        order, ties by name). With a single feasible node kube-scheduler skips scoring, so the pod costs
        one extender call instead of two; the shipped weight makes that node the scheduler's choice anyway.
        Being the scheduler's choice, its GPUs are held for the bind that follows (``hold``)."""
        fits = outcome.fits
        parsed = self._parse(pod, self._cluster.default_pool)
        if not fits or isinstance(parsed, ContractError):
            return outcome
        if len(fits) > 1:
            fit_load = self._verdicts.for_nodes(parsed, fits).fit_load
            loads = list(map(fit_load.__getitem__, fits))
            lowest_first = node_order_value(self._cluster.mode_for(parsed.request.pool), 1.0) > 0
            best = min(loads) if lowest_first else max(loads)
            outcome = FilterOutcome([min(compress(fits, map(best.__eq__, loads)))], outcome.failed,
                                    outcome.unresolvable, outcome.error, outcome.capacity_only)
        if hold:
            self._assume.hold(pod, parsed, outcome.fits[0])
        return outcome

    def rank(self, pod: dict[str, Any], node_names: Sequence[str]) -> list[str]:
        """The fitting nodes in the mode's order (ties by name): the order prioritize scores."""
        parsed = self._parse(pod, self._cluster.default_pool)
        if isinstance(parsed, ContractError):
            return []
        sign = node_order_value(self._cluster.mode_for(parsed.request.pool), 1.0)
        fit_load = self._verdicts.for_nodes(parsed, node_names).fit_load
        return sorted({n for n in node_names if n in fit_load}, key=lambda n: (sign * fit_load[n], n))

    # --- bind -------------------------------------------------------------------------------------

    def reserve(self, pod: dict[str, Any], node: str) -> Reservation:
        return self._assume.reserve(pod, node, self.request_of(pod))

    def reservation(self, uid: str) -> Reservation | None:
        """The reservation of a bind that has not been seen in the watched pod yet, if any."""
        return self._assume.reservation(uid)

    def release(self, reservation: Reservation) -> None:
        self._assume.release(reservation)

    def pending_index_holder(self, node: str, index: int, pod_uid: str) -> str | None:
        return self._assume.pending_index_holder(node, index, pod_uid)

    # --- gangs (extender.gang decides; these keep its choice) --------------------------------------

    def hold_gang(self, gang: str,
                  placements: Iterable[tuple[Mapping[str, Any], str, tuple[str, ...]]]) -> None:
        """Hold, for the members of ``gang`` only, each ``(pod, node, gpu_ids)`` chosen together (see
        ``AssumeCache.hold_gang``); replaces what the gang held before."""
        self._assume.hold_gang(gang, [
            Allocation(pod_uid(pod), pod_key(pod), node, gpu_ids, self.request_of(pod), pod_priority(pod))
            for pod, node, gpu_ids in placements])

    def release_gang(self, gang: str) -> list[str]:
        """Release every GPU the gang holds for members not binding yet; the uids released."""
        return self._assume.release_gang(gang)

    def gang_holds(self) -> dict[str, list[Allocation]]:
        return self._assume.gang_holds()

    def gang_binding(self, uid: str) -> str | None:
        return self._assume.gang_binding(uid)

    def held_node(self, pod: Mapping[str, Any]) -> str | None:
        """The node the pod's bind in flight, its gang hold or its filter hold is on."""
        return self._assume.held_node(pod)

    def resize(self, uid: str, tflops: Fraction | None, vram: int | None) -> ResizeOutcome:
        """Resize a bound pod's share of its GPUs in the ledger (see ``Ledger.resize``); the room a
        scale-down frees is offered to waiting pods at once."""
        outcome = self._cluster.ledger.resize(uid, tflops, vram)
        if outcome.outcome is not Resized.REFUSED:
            self._cluster.freed(set(outcome.touched))
        return outcome

    def bound_allocation(self, uid: str) -> Allocation | None:
        """The allocation the ledger counts for a bound pod (None: none counted)."""
        return self._cluster.ledger.bound(uid)

    # --- preemption -------------------------------------------------------------------------------

    def preempt(self, pod: dict[str, Any], nodes: Sequence[str],
                pdb: PdbCheck | None = None) -> dict[str, list[Victim]]:
        """Per node, the victims whose release lets the pod fit; with ``pdb``, pods a PodDisruptionBudget
        protects are chosen only when no other set will do."""
        parsed = self._parse(pod, self._cluster.default_pool)
        if isinstance(parsed, ContractError):
            return {}
        quota = self.quota_gate.fits_without(pod, parsed.request) if self.quota_gate is not None else None
        return preemption.preempt(self._cluster, parsed.request, pod_priority(pod), pod_uid(pod), nodes, pdb,
                                  quota)

    def find_preemption(self, pod: dict[str, Any],
                        pdb: PdbCheck | None = None) -> tuple[str, list[Victim]] | None:
        """The node and victims to preempt for: the fewest PodDisruptionBudget violations, then the fewest
        victims, then the lowest highest priority among them, then the node name."""
        parsed = self._parse(pod, self._cluster.default_pool)
        if isinstance(parsed, ContractError):
            return None
        quota = self.quota_gate.fits_without(pod, parsed.request) if self.quota_gate is not None else None
        namespace = pod_key(pod).partition("/")[0]
        return preemption.find_preemption(self._cluster, parsed.request, pod_priority(pod), pod_uid(pod), pdb,
                                          quota, namespace)

    def holds(self, uid: str) -> bool:
        """Whether the pod still holds GPU capacity (bound, reserved, or terminating but not gone)."""
        return self._cluster.ledger.allocation(uid) is not None

    # --- views ------------------------------------------------------------------------------------

    def node_gpus(self, node: str) -> list[GPUView]:
        return views.node_gpus(self._cluster, node)

    def gpu_capacity(self, gpu: str) -> tuple[Fraction, int] | None:
        """A known GPU's TFLOPS and VRAM bytes."""
        capacity = self._cluster.ledger.capacity(gpu)
        return (Fraction(capacity[0], 10**9), capacity[1]) if capacity is not None else None

    def gpu_holders(self, gpu: str) -> list[Allocation]:
        """The allocations holding a share of one GPU, by pod uid."""
        return self._cluster.ledger.holders(gpu)

    def changed_since(self, tick: int) -> tuple[set[str] | None, int]:
        """The nodes whose GPUs or allocations changed after ``tick`` (None: too long ago to tell, so
        treat every node as changed), and the current tick to ask from next time."""
        return self._cluster.changed_since(tick)

    def pool_occupancy(self, pool: str) -> dict[str, tuple[int, int, float]]:
        """Per node with GPUs of ``pool``: how many it has, how many hold an allocation, their mean load."""
        return views.pool_occupancy(self._cluster, pool)

    def allocations(self) -> list[Allocation]:
        """Every allocation that counts (bound pods, then reservations of binds in flight)."""
        return self._cluster.ledger.allocations()

    @property
    def version(self) -> int:
        """Moves whenever a node's allocations or GPUs change (to notice changes without diffing)."""
        return self._cluster.tick

    def held_gpus(self) -> dict[str, str]:
        """GPU name -> node, for every GPU that a bound pod (not a bind in flight) holds a share of."""
        return views.held_gpus(self._cluster)

    def gpu_usage(self) -> dict[str, tuple[Fraction, int]]:
        """Allocated TFLOPS and VRAM per known GPU."""
        return views.gpu_usage(self._cluster)

    def utilisation(self) -> Utilisation:
        return views.utilisation(self._cluster)

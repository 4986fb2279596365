"""Victim choice for preemption (DESIGN §5): the fewest lower-priority GPU pods whose release fits the pod.

Finding the true minimum is a bin-packing search, so the choice is a bounded heuristic:

1. no victim when the pod already fits;
2. else a single victim if one suffices (the lowest priority such pod);
3. else release pods in ascending priority until the pod fits, then drop again every victim that is not
   needed, trying the highest priority first. The result is irreducible (no victim can be spared) and
   prefers low priorities; it is the minimum in the common cases of equal-sized shares.

``preempt`` and ``find_preemption`` apply that choice to the picture (kube-scheduler's PostFilter): the
victims per candidate node, and the one node to preempt on, with PodDisruptionBudgets taken into account.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any, Protocol

from extender.common.contract import GPURequest
from extender.scheduling.cluster import Cluster
from extender.scheduling.ledger import Allocation, Usage
from extender.scheduling.placement import Fit, Slot, evaluate, node_fits
from extender.scheduling.topology import Settings

QuotaFits = Callable[[Sequence[Allocation]], bool]  # whether the pod's quota admits it once these are gone


class QuotaRefusal(Protocol):
    @property
    def message(self) -> str: ...
    @property
    def unresolvable(self) -> bool: ...


class QuotaGate(Protocol):
    """Namespace quotas as the core sees them (controllers/quota): whether a pod's quota refuses it now; for
    preemption a test of whether it admits the pod once some allocations are released (None when no quota
    applies to it); for a resize, its per-GPU figures clamped to what the quota leaves, with a note."""

    def blocks(self, pod: Mapping[str, Any]) -> QuotaRefusal | None: ...
    def refusal_together(self, pods: Sequence[tuple[Mapping[str, Any], GPURequest]],
                         ) -> QuotaRefusal | None: ...
    def fits_without(self, pod: Mapping[str, Any], request: GPURequest) -> QuotaFits | None: ...
    def resize_room(self, pod: dict[str, Any], allocation: Allocation, tflops: Fraction | None,
                    vram: int | None) -> tuple[Fraction | None, int | None, str]: ...


class PdbCheck(Protocol):
    """PodDisruptionBudgets as preemption sees them (pdb.py)."""

    def protected(self, pod_key: str) -> bool: ...
    def violations(self, pod_keys: Sequence[str]) -> int: ...


@dataclass(frozen=True)
class Victim:
    uid: str
    namespace: str
    name: str
    priority: int


@dataclass(frozen=True)
class Candidate:
    allocation: Allocation
    shares: Mapping[str, Usage]  # per GPU name: what releasing this pod frees

    @property
    def priority(self) -> int:
        return self.allocation.priority


def _fits_without(slots: Sequence[Slot], request: GPURequest, pods_on_node: int, max_pods: int,
                  released: Sequence[Candidate], topology: Settings | None = None,
                  quota: QuotaFits | None = None) -> bool:
    if quota is not None and not quota([c.allocation for c in released]):
        return False
    names = {s.name for s in slots}
    freed: dict[str, list[int]] = {}
    here = 0  # victims on this node (a quota may take victims anywhere in the namespace)
    for victim in released:
        here += any(gpu in names for gpu in victim.shares)
        for gpu, share in victim.shares.items():
            total = freed.setdefault(gpu, [0, 0, 0, 0])
            total[0] += share.tflops
            total[1] += share.vram
            total[2] += share.whole
            total[3] += 1
    trial = [
        replace(s, used_tflops=s.used_tflops - f[0], used_vram=s.used_vram - f[1],
                whole_holders=s.whole_holders - f[2], holders=s.holders - f[3])
        if (f := freed.get(s.name)) else s
        for s in slots
    ]
    return node_fits(trial, request, pods_on_node - here, max_pods, topology)


def choose_victims(slots: Sequence[Slot], request: GPURequest, pods_on_node: int, max_pods: int,
                   candidates: Sequence[Candidate],
                   protected: Callable[[Candidate], bool] | None = None,
                   topology: Settings | None = None,
                   quota: QuotaFits | None = None) -> list[Candidate] | None:
    """Victims (lowest priority first) whose release makes the pod fit, or None when none exist. Pods for
    which ``protected`` holds (a PodDisruptionBudget allows no disruption of them) are taken last and
    spared first, so a set that breaks no budget is chosen whenever one exists. With ``quota``, the pod
    must also fit its namespace's quota once the victims are gone (the total net of the victims)."""
    def fits(released: Sequence[Candidate]) -> bool:
        return _fits_without(slots, request, pods_on_node, max_pods, released, topology, quota)

    if fits(()):
        return []
    guarded = {id(c) for c in candidates if protected is not None and protected(c)}
    ordered = sorted(candidates, key=lambda c: (id(c) in guarded, c.priority, c.allocation.pod_key,
                                                c.allocation.uid))
    for victim in ordered:
        if fits((victim,)):
            return [victim]
    released: list[Candidate] = []
    for victim in ordered:
        released.append(victim)
        if fits(released):
            break
    else:
        return None
    for victim in sorted(released, key=lambda c: (id(c) not in guarded, -c.priority, c.allocation.pod_key)):
        trial = [c for c in released if c is not victim]
        if fits(trial):
            released = trial
    return released


def victims(cluster: Cluster, node: str, request: GPURequest, priority: int, uid: str,
            pdb: PdbCheck | None = None, quota: QuotaFits | None = None,
            elsewhere: Sequence[Allocation] = ()) -> list[Victim] | None:
    """The bound pods of lower priority on ``node`` whose release lets the pod fit (none needed: an empty
    list), or None when no such set exists or nothing could help. With ``quota`` the pod must fit its
    quota too, and the allocations of ``elsewhere`` (pods of its namespace on other nodes) may be victims
    as well: they free quota, not room on this node."""
    ledger, max_pods = cluster.ledger, cluster.max_pods
    slots = cluster.slots(node)
    pods = ledger.pods_on(node)
    topology = cluster.topology_for(request.pool)
    if not slots or evaluate(slots, request, pods, max_pods, topology=topology).fit is Fit.UNRESOLVABLE:
        return None
    pool = ledger.allocations_on(node)
    if quota is not None and elsewhere:
        pool = [*pool, *(a for a in elsewhere if a.node != node)]
    candidates = [
        Candidate(a, {gpu: ledger.share(a, gpu) for gpu in a.gpu_ids})
        for a in pool
        if a.priority < priority and a.uid != uid and ledger.bound(a.uid) is a
    ]
    protected = (lambda c: pdb.protected(c.allocation.pod_key)) if pdb is not None else None
    chosen = choose_victims(slots, request, pods, max_pods, candidates, protected, topology, quota)
    if chosen is None:
        return None
    out = []
    for victim in chosen:
        namespace, _, name = victim.allocation.pod_key.partition("/")
        out.append(Victim(victim.allocation.uid, namespace, name, victim.priority))
    return out


def preempt(cluster: Cluster, request: GPURequest, priority: int, uid: str, nodes: Sequence[str],
            pdb: PdbCheck | None = None, quota: QuotaFits | None = None,
            anywhere_in: str | None = None) -> dict[str, list[Victim]]:
    """Per node, the victims whose release lets the pod fit; with ``pdb``, pods a PodDisruptionBudget
    protects are chosen only when no other set will do; with ``quota``, the pod's quota must admit it
    once they are gone (victims on the node alone, unless ``anywhere_in`` names the pod's namespace: then
    its lower-priority pods on any node too)."""
    elsewhere: list[Allocation] = []
    if quota is not None and anywhere_in is not None:
        prefix = f"{anywhere_in}/"
        elsewhere = [a for a in cluster.ledger.allocations()
                     if a.priority < priority and a.pod_key.startswith(prefix)]
    out: dict[str, list[Victim]] = {}
    for node in nodes:
        found = victims(cluster, node, request, priority, uid, pdb, quota, elsewhere)
        if found is not None:
            out[node] = found
    return out


def find_preemption(cluster: Cluster, request: GPURequest, priority: int, uid: str,
                    pdb: PdbCheck | None = None, quota: QuotaFits | None = None,
                    namespace: str | None = None) -> tuple[str, list[Victim]] | None:
    """The node and victims to preempt for, among the nodes with GPUs of the request's pool: the fewest
    PodDisruptionBudget violations, then the fewest victims, then the lowest highest priority among them,
    then the node name. With ``quota``, victims anywhere in the pod's ``namespace`` may free its quota."""
    loads = cluster.load_table()
    nodes = [n for n in cluster.nodes() if request.pool in loads.get(n, {})]
    options = preempt(cluster, request, priority, uid, nodes, pdb, quota, anywhere_in=namespace)
    if not options:
        return None

    def broken(chosen: list[Victim]) -> int:
        return pdb.violations([f"{v.namespace}/{v.name}" for v in chosen]) if pdb is not None else 0

    best = min(options.items(), key=lambda item: (
        broken(item[1]), len(item[1]), max((v.priority for v in item[1]), default=-(2**63)), item[0]))
    return best[0], best[1]

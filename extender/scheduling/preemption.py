"""Victim choice for preemption (DESIGN §5): the fewest lower-priority GPU pods whose release fits the pod.

Finding the true minimum is a bin-packing search, so the choice is a bounded heuristic:

1. no victim when the pod already fits;
2. else a single victim if one suffices (the lowest priority such pod);
3. else release pods in ascending priority until the pod fits, then drop again every victim that is not
   needed, trying the highest priority first. The result is irreducible (no victim can be spared) and
   prefers low priorities; it is the minimum in the common cases of equal-sized shares.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from extender.common.contract import GPURequest
from extender.scheduling.ledger import Allocation, Usage
from extender.scheduling.placement import Slot, node_fits


@dataclass(frozen=True)
class Candidate:
    allocation: Allocation
    shares: Mapping[str, Usage]  # per GPU name: what releasing this pod frees

    @property
    def priority(self) -> int:
        return self.allocation.priority


def _fits_without(slots: Sequence[Slot], request: GPURequest, pods_on_node: int, max_pods: int,
                  released: Sequence[Candidate]) -> bool:
    freed: dict[str, list[int]] = {}
    for victim in released:
        for gpu, share in victim.shares.items():
            total = freed.setdefault(gpu, [0, 0, 0])
            total[0] += share.tflops
            total[1] += share.vram
            total[2] += share.whole
    trial = [
        replace(s, used_tflops=s.used_tflops - f[0], used_vram=s.used_vram - f[1],
                whole_holders=s.whole_holders - f[2])
        if (f := freed.get(s.name)) else s
        for s in slots
    ]
    return node_fits(trial, request, pods_on_node - len(released), max_pods)


def choose_victims(slots: Sequence[Slot], request: GPURequest, pods_on_node: int, max_pods: int,
                   candidates: Sequence[Candidate],
                   protected: Callable[[Candidate], bool] | None = None) -> list[Candidate] | None:
    """Victims (lowest priority first) whose release makes the pod fit, or None when none exist. Pods for
    which ``protected`` holds (a PodDisruptionBudget allows no disruption of them) are taken last and
    spared first, so a set that breaks no budget is chosen whenever one exists."""
    if _fits_without(slots, request, pods_on_node, max_pods, ()):
        return []
    guarded = {id(c) for c in candidates if protected is not None and protected(c)}
    ordered = sorted(candidates, key=lambda c: (id(c) in guarded, c.priority, c.allocation.pod_key,
                                                c.allocation.uid))
    for victim in ordered:
        if _fits_without(slots, request, pods_on_node, max_pods, (victim,)):
            return [victim]
    released: list[Candidate] = []
    for victim in ordered:
        released.append(victim)
        if _fits_without(slots, request, pods_on_node, max_pods, released):
            break
    else:
        return None
    for victim in sorted(released, key=lambda c: (id(c) not in guarded, -c.priority, c.allocation.pod_key)):
        trial = [c for c in released if c is not victim]
        if _fits_without(slots, request, pods_on_node, max_pods, trial):
            released = trial
    return released

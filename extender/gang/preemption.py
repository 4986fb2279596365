"""Preemption for a gang: lower-priority GPU pods are evicted only when the whole gang then fits.

On a what-if copy, each member that fits nowhere takes the node and victims ``find_preemption`` chooses for
it (the fewest lower-priority pods, PodDisruptionBudgets first), those victims are taken out of the copy and
the member placed there; the members after it see that. The answer is every victim, only when the members
needed all found a place; otherwise None, and nothing is evicted.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from extender.gang.placement import largest_first
from extender.scheduling.state import ClusterState, Kind, PdbCheck, PlacementError, Victim


def may_preempt(pod: dict[str, Any]) -> bool:
    return (pod.get("spec") or {}).get("preemptionPolicy") != "Never"


def preempt_for_gang(state: ClusterState, members: Sequence[dict[str, Any]], needed: int,
                     pdb: PdbCheck | None = None,
                     protected: AbstractSet[str] = frozenset()) -> list[Victim] | None:
    """The pods to evict so that ``needed`` of ``members`` fit together, or None (evict nothing).
    ``protected``: uids never evicted (members of gangs, this one's included: evicting one member of a
    running gang breaks it); a member whose only victim sets include one cannot be placed this way."""
    victims: dict[str, Victim] = {}
    placed = 0
    with state.what_if() as sim:
        for pod in largest_first(sim, members):
            ranked = sim.rank(pod, sim.nodes())
            if ranked:
                sim.reserve(pod, ranked[0])
                placed += 1
                continue
            choice = sim.find_preemption(pod, pdb) if may_preempt(pod) else None
            if choice is None or not choice[1]:
                continue
            node, chosen = choice
            if any(victim.uid in protected for victim in chosen):
                continue
            for victim in chosen:
                sim.apply(Kind.POD, "DELETED", {"metadata": {"uid": victim.uid, "namespace": victim.namespace,
                                                             "name": victim.name}})
                victims[victim.uid] = victim
            try:
                sim.reserve(pod, node)
            except PlacementError:
                return None
            placed += 1
    if placed < needed or not victims:
        return None
    return sorted(victims.values(), key=lambda v: (v.namespace, v.name))

"""A gang placed whole: every waiting member's node and GPUs chosen together, or none.

The members are tried on a what-if copy of the cluster state, one after the other, each on the node its
pool's placement mode ranks first among those that still fit after the members before it (the same filter,
ranking and GPU choice a single pod gets, so topology and every other placement rule apply unchanged).
Larger members go first (more GPUs, then more VRAM and TFLOPS), so small ones fill what the large ones
leave; ties by name. The result is all the members' choices, or the first member that does not fit and
why; nothing of the live state changes either way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extender.common.pods import pod_key, pod_uid
from extender.scheduling.state import ClusterState, PlacementError

AdmitGang = Callable[[Sequence[Mapping[str, Any]]], str | None]


def admit_none(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """The default ``AdmitGang``: every gang may hold its GPUs (a namespace quota plugs in here)."""
    return None


def admit_by_quota(state: ClusterState) -> AdmitGang:
    """The ``AdmitGang`` of the namespace quotas: the whole quorum at once against the state's quota gate
    (``ClusterState.quota_gate``, read at each call: the quota package may be built after the gang's)."""
    def admit(pods: Sequence[Mapping[str, Any]]) -> str | None:
        gate = state.quota_gate
        if gate is None or not pods:
            return None
        refusal = gate.refusal_together([(pod, state.request_of(pod)) for pod in pods])
        return refusal.message if refusal is not None else None

    return admit


@dataclass(frozen=True)
class Placed:
    pod: Mapping[str, Any]
    node: str
    gpu_ids: tuple[str, ...]


@dataclass(frozen=True)
class GangPlan:
    """Every member's node and GPUs (``placed``), or why the gang does not fit (``reason``)."""

    placed: tuple[Placed, ...] = ()
    reason: str = ""
    capacity_only: bool = False  # the member that did not fit would fit on an emptied candidate node
    unplaced: tuple[Mapping[str, Any], ...] = ()  # the members that did not fit (for scale-up)

    @property
    def fits(self) -> bool:
        return not self.reason


def _size(state: ClusterState, pod: Mapping[str, Any]) -> tuple[int, int, int]:
    try:
        request = state.request_of(pod)
    except PlacementError:
        return (0, 0, 0)
    tflops = int(request.tflops_request or 0)
    return (request.gpu_count, request.vram_request or 0, tflops)


def largest_first(state: ClusterState, members: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """More GPUs first, then more VRAM, then more TFLOPS; ties by name."""
    return sorted(members, key=lambda p: (tuple(-x for x in _size(state, p)), pod_key(p)))


def place_gang(state: ClusterState, members: Sequence[dict[str, Any]],
               candidates: Mapping[str, Sequence[str]], *, needed: int | None = None) -> GangPlan:
    """Choose every member's node and GPUs together on a copy of ``state``. ``candidates``: pod uid -> the
    nodes kube-scheduler found feasible for it (a member with none listed gets the union of the others').
    ``needed``: how many members must fit (default all); members past that which do not fit are left out.
    """
    needed = len(members) if needed is None else needed
    union = sorted({n for nodes in candidates.values() for n in nodes})
    order = largest_first(state, members)
    placed: list[Placed] = []
    missed: list[tuple[dict[str, Any], str, bool]] = []
    with state.what_if() as sim:
        for pod in order:
            nodes = list(candidates.get(pod_uid(pod)) or union)
            outcome = sim.filter(pod, nodes)
            ranked = sim.rank(pod, outcome.fits) if outcome.fits else []
            if not ranked:
                why = outcome.error or _best_reason(outcome.failed, outcome.unresolvable, nodes)
                missed.append((pod, why, outcome.capacity_only))
                continue
            try:
                reservation = sim.reserve(pod, ranked[0])
            except PlacementError as exc:
                missed.append((pod, str(exc), False))
                continue
            placed.append(Placed(pod, reservation.node, reservation.gpu_ids))
    if len(placed) >= needed:
        return GangPlan(tuple(placed))
    first, why, _ = missed[0]
    reason = (f"the gang's {needed} members do not fit together ({len(placed)} would); "
              f"member {pod_key(first)}: {why}")
    return GangPlan(reason=reason, capacity_only=all(m[2] for m in missed),
                    unplaced=tuple(m[0] for m in missed))


def _best_reason(failed: Mapping[str, str], unresolvable: Mapping[str, str], nodes: Sequence[str]) -> str:
    if not nodes:
        return "no candidate node"
    for reasons in (failed, unresolvable):
        if reasons:
            node = min(reasons)
            return f"node {node}: {reasons[node]}"
    return "no node fits"

"""Which empty nodes of a pool may go (TensorFusion's compaction rules, shared by both modes).

An empty node (no GPU allocation) is *surplus* when removing it still leaves the pool at least
``minResources`` in total and ``warmResources`` available; otherwise it is *needed*. Empty nodes are
considered oldest-eligible first, then most expensive, then largest, then by name, so that the nodes
kept are the young and cheap ones. A surplus node is released only when it is older than the
protection time (5 minutes) and not labelled ``tensor-fusion.ai/do-not-disrupt: "true"``; a labelled
node is never released and never counted as removable.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction

from extender.common.labels import SCHEDULING_DO_NOT_DISRUPT
from extender.common.timefmt import format_age, format_duration
from extender.planning.amounts import ZERO, Amount
from extender.planning.pool import PoolConfig

DEFAULT_PROTECTION_SECONDS = 300.0


class NodeVerdict(StrEnum):
    BUSY = "busy"  # holds GPU allocations
    PINNED = "pinned"  # labelled tensor-fusion.ai/do-not-disrupt
    NEEDED_MIN = "needed-min"  # removing it would leave less than minResources
    NEEDED_WARM = "needed-warm"  # removing it would leave less than warmResources available
    YOUNG = "young"  # surplus, but inside the protection time
    RELEASE = "release"  # surplus and old enough: remove it


@dataclass(frozen=True)
class PoolNode:
    name: str
    capacity: Amount  # the node's GPUs in this pool
    used: Amount  # allocated on them
    created: dt.datetime | None
    pinned: bool = False  # labelled tensor-fusion.ai/do-not-disrupt: "true"
    price: Fraction | None = None  # hourly price when known (Karpenter mode)

    @property
    def empty(self) -> bool:
        return self.used.is_zero


@dataclass(frozen=True)
class Decision:
    node: PoolNode
    verdict: NodeVerdict
    reason: str

    @property
    def needed(self) -> bool:
        return self.verdict in (NodeVerdict.NEEDED_MIN, NodeVerdict.NEEDED_WARM)


def _old_enough(node: PoolNode, now: dt.datetime, protection: float) -> bool:
    return node.created is not None and (now - node.created).total_seconds() >= protection


def removal_decisions(config: PoolConfig, nodes: Sequence[PoolNode], now: dt.datetime,
           protection_seconds: float = DEFAULT_PROTECTION_SECONDS) -> list[Decision]:
    """One decision per node of the pool, in name order."""
    total = sum((n.capacity for n in nodes), ZERO)
    available = sum((n.capacity - n.used for n in nodes), ZERO)
    minimum = config.min or ZERO
    warm = config.warm or ZERO
    out: dict[str, Decision] = {}
    empties = []
    for node in nodes:
        if not node.empty:
            out[node.name] = Decision(node, NodeVerdict.BUSY, "holds GPU allocations")
        elif node.pinned:
            out[node.name] = Decision(node, NodeVerdict.PINNED, f"labelled {SCHEDULING_DO_NOT_DISRUPT}")
        else:
            empties.append(node)
    empties.sort(key=lambda n: (not _old_enough(n, now, protection_seconds), -(n.price or 0),
                                -n.capacity.tflops, -n.capacity.vram, n.name))
    for node in empties:
        after_total, after_available = total - node.capacity, available - node.capacity
        if not after_total.covers(minimum):
            out[node.name] = Decision(node, NodeVerdict.NEEDED_MIN, (
                f"kept for minResources ({minimum.describe()}): the pool would have "
                f"{after_total.describe()} without it"))
            continue
        if not after_available.covers(warm):
            out[node.name] = Decision(node, NodeVerdict.NEEDED_WARM, (
                f"kept for warmResources ({warm.describe()}): the pool would have "
                f"{after_available.describe()} available without it"))
            continue
        total, available = after_total, after_available
        if _old_enough(node, now, protection_seconds):
            age = (now - node.created).total_seconds() if node.created else 0.0
            out[node.name] = Decision(node, NodeVerdict.RELEASE, (
                f"empty for the pool's targets, {format_age(age)} old; min and warm capacity hold "
                "without it"))
        else:
            out[node.name] = Decision(node, NodeVerdict.YOUNG, (
                f"surplus but younger than the protection time ({format_duration(protection_seconds)})"))
    return [out[name] for name in sorted(out)]

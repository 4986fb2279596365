"""Which filter rejections are capacity-only failures that may start node expansion (pure)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

AUTOSELECT = "AutoSelect"
EXPANDING_MODES = (None, "", AUTOSELECT)

REASON_CHECK = "NodeExpansionCheck"
REASON_COMPLETED = "NodeExpansionCompleted"
REASON_FAILED = "NodeExpansionFailed"


class FilterResult(Protocol):
    """What detection needs from the filter's outcome (``extender.scheduling.state.FilterOutcome``)."""

    @property
    def capacity_only(self) -> bool: ...

    @property
    def error(self) -> str | None: ...


def is_capacity_only(outcome: FilterResult, candidates: Sequence[str]) -> bool:
    """No candidate fits, and at least one would if its GPU allocations were released."""
    return bool(candidates) and not outcome.error and bool(outcome.capacity_only)


def provisioning_mode(gpupool: Mapping[str, Any] | None) -> str | None:
    if gpupool is None:
        return None
    mode = ((gpupool.get("spec") or {}).get("nodeManagerConfig") or {}).get("provisioningMode")
    return str(mode) if mode is not None else None


def expands_pool(gpupool: Mapping[str, Any] | None) -> bool:
    """Pools whose nodes Karpenter owns through the NodePools (AutoSelect, the default) expand here."""
    return provisioning_mode(gpupool) in EXPANDING_MODES


class CapacityFailureLog:
    """Pods (by uid) already flagged, so a pod is flagged once and not on every scheduler retry.

    Bounded: the oldest entries are dropped past ``limit``.
    """

    def __init__(self, limit: int = 50_000) -> None:
        self._limit = limit
        self._seen: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, uid: object) -> bool:
        return uid in self._seen

    def __len__(self) -> int:
        return len(self._seen)

    def first_time(self, uid: str) -> bool:
        """Remember ``uid``; True only the first time."""
        if not uid or uid in self._seen:
            return False
        self._seen[uid] = None
        while len(self._seen) > self._limit:
            self._seen.popitem(last=False)
        return True

    def forget(self, uid: str) -> None:
        """Let the pod be flagged again (it was placed, went away, or its claim left without it)."""
        self._seen.pop(uid, None)


def unschedulable(pod: Mapping[str, Any], scheduler_name: str) -> bool:
    """A pending pod of the scheduler profile that the scheduler marked Unschedulable."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    if spec.get("schedulerName") != scheduler_name or spec.get("nodeName") or status.get("nominatedNodeName"):
        return False
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False"
               and c.get("reason") == "Unschedulable" for c in status.get("conditions") or [])

"""Which members of a gang are here, and whether enough are to place it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from extender.common.pods import TERMINAL_PHASES, pod_key


def is_live(pod: Mapping[str, Any]) -> bool:
    """A member that counts: not finished, not being deleted."""
    metadata = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase")
    return not metadata.get("deletionTimestamp") and phase not in TERMINAL_PHASES


def is_bound(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


@dataclass(frozen=True)
class Quorum:
    """A gang's members as they are now."""

    key: str
    required: int
    bound: tuple[str, ...]  # pod keys, by name
    waiting: tuple[Mapping[str, Any], ...]  # pods, by name

    @property
    def here(self) -> int:
        return len(self.bound) + len(self.waiting)

    @property
    def missing(self) -> int:
        return max(self.required - self.here, 0)

    @property
    def met(self) -> bool:
        """Enough members exist to place the gang."""
        return self.here >= self.required

    @property
    def running(self) -> bool:
        """The quorum is bound already: later members (a restarted one, extras) place alone."""
        return len(self.bound) >= self.required

    @property
    def still_needed(self) -> int:
        """How many waiting members must be placed for the quorum to be bound."""
        return max(self.required - len(self.bound), 0)

    def waiting_message(self) -> str:
        return (f"gang {self.key}: waiting for {self.missing} of {self.required} members "
                f"({self.here} here, {len(self.bound)} bound)")


def quorum(key: str, required: int, pods: Iterable[Mapping[str, Any]]) -> Quorum:
    live = sorted((p for p in pods if is_live(p)), key=pod_key)
    return Quorum(key, required, tuple(pod_key(p) for p in live if is_bound(p)),
                  tuple(p for p in live if not is_bound(p)))


def waiting_gangs(pods: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The gangs whose quorum is not bound, from their members' pods alone (``tf-extender status``): key,
    members required (0: a PodGroup's, not known from the pods), here, bound, and one waiting member."""
    from extender.common.gang import membership

    gangs: dict[str, tuple[int, list[Mapping[str, Any]]]] = {}
    for pod in pods:
        member = membership(pod)
        if member is not None and is_live(pod):
            required, members = gangs.setdefault(member.group_key, (member.required, []))
            members.append(pod)
    out = []
    for key in sorted(gangs):
        required, members = gangs[key]
        bound = sum(1 for p in members if is_bound(p))
        if required and bound >= required:
            continue
        waiting = sorted((p for p in members if not is_bound(p)), key=pod_key)
        if not waiting:
            continue
        out.append({"gang": key, "required": required, "here": len(members), "bound": bound,
                    "example": pod_key(waiting[0])})
    return out

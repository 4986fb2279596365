"""Scale-up for a gang as one demand (pure): the unmet members' decisions are made together on a copy of the
in-flight claims, each member counted against the claims planned for the members before it (every GPU of a
multi-GPU member on one claim), so a gang that needs three nodes plans three claims in one batch, or none
when the batch does not fit ``--max-inflight-nodes`` or one member cannot be grown for at all."""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from extender.common.gang import membership
from extender.common.timefmt import parse_time
from extender.controllers.expansion.decide import ClusterView, Create, Skip, WaitForClaim, WaitForSlot, decide
from extender.controllers.expansion.inflight import InFlight, PodRef
from extender.controllers.expansion.intake import Queued

PLANNED_PREFIX = "(planned for the gang) "


def gang_of(pod: Mapping[str, Any] | None) -> str | None:
    """The gang key of a pod, None outside gangs."""
    member = membership(pod) if pod is not None else None
    return member.group_key if member is not None else None


def gang_timed_out(pods: Sequence[Mapping[str, Any]], now: dt.datetime) -> bool:
    """The gang's ``gang-timeout`` has passed since its oldest member was created (False without one)."""
    member = membership(pods[0]) if pods else None
    created = [t for p in pods if (t := parse_time((p.get("metadata") or {}).get("creationTimestamp")))]
    if member is None or member.timeout is None or not created:
        return False
    return now - min(created) >= member.timeout


@dataclass
class GangBatch:
    """What one pass does for a gang: wait on claims already in flight (``waits``: entry -> claim) and
    create ``creates`` (entry, decision, planned name), all of it, or nothing (``blocked``: why)."""

    waits: list[tuple[Queued, dict[str, Any], str]] = field(default_factory=list)
    creates: list[tuple[Queued, dict[str, Any], Create, str]] = field(default_factory=list)
    blocked: str = ""
    slot_wait: bool = False  # blocked only by --max-inflight-nodes: try again when a claim leaves


def plan_gang(gang: str, members: Sequence[tuple[Queued, dict[str, Any]]], view: ClusterView,
              inflight: InFlight, new_id: Callable[[], str], now: float) -> GangBatch:
    """Decide every member's scale-up on a copy of ``inflight``; nothing of ``inflight`` changes."""
    sim = copy.deepcopy(inflight)
    batch = GangBatch()
    for entry, pod in members:
        decision = decide(pod, entry.pod.uid, entry.request, entry.candidates, view, sim, new_id())
        if isinstance(decision, Skip):
            continue  # bound, deleted or no longer waiting: the others are still one demand
        if isinstance(decision, WaitForClaim):
            sim.assign(decision.claim, pod, entry.request)
            batch.waits.append((entry, pod, decision.claim))
        elif isinstance(decision, Create):
            planned = f"{PLANNED_PREFIX}{len(batch.creates)}"
            sim.add(planned, decision.body, list(decision.devices), now)
            sim.assign(planned, pod, entry.request)
            batch.creates.append((entry, pod, decision, planned))
        elif isinstance(decision, WaitForSlot):
            return GangBatch(blocked=(
                f"gang {gang} needs {len(batch.creates) + 1} or more new nodes at once and "
                f"{inflight.own} of at most {inflight.max_in_flight} NodeClaims are in flight: the whole "
                "gang waits for room to buy all of them"), slot_wait=True)
        else:
            return GangBatch(blocked=f"gang {gang}: member {PodRef.of(pod)} cannot be grown for: "
                                     f"{getattr(decision, 'reason', '') or getattr(decision, 'message', '')}")
    return batch

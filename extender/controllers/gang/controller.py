"""The gang keeper: answers its members' filters, holds a gang's GPUs whole, times gangs out.

- A member's filter (``before_filter``) answers no node, naming ``waiting for N of M members``, until the
  quorum exists; then the whole gang is placed at once on a what-if copy (``extender.gang.placement``) and
  each member's node and GPUs are held (``ClusterState.hold_gang``): other pods cannot count that room free,
  and each member's filter answers exactly its held node, so its bind takes exactly its held GPUs.
- Either the required members all hold GPUs or none do: a placement that does not fit holds nothing; a
  gang whose holds are not all bound within ``reserve_seconds``, or that lost a member (deleted) or a
  member's node, is released whole and placed again when its members ask next.
- ``gang-timeout`` counts from the first member seen: a gang not bound by then is ``TimedOut``, releases
  everything, and its members' filters say so until the gang's pods are recreated.
- A member that fits nowhere is answered with an error (``hold_back``) so kube-scheduler retries it with
  backoff instead of parking it: the quorum forming, or a peer's hold, is no event it would wake for.

Preemption never runs for one member alone (gang members' "no node" answers are unresolvable): for a gang
that does not fit, lower-priority pods are evicted only when the whole gang then fits (``_preempt``).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from extender.common.gang import Membership, membership, pod_group_min_count
from extender.common.pods import pod_key, pod_uid
from extender.gang.placement import AdmitGang, admit_none, place_gang
from extender.gang.preemption import preempt_for_gang
from extender.gang.quorum import Quorum, is_bound, is_live, quorum
from extender.scheduling.state import ClusterState, FilterOutcome, Victim
from extender.server.hooks import FilterHook

log = logging.getLogger(__name__)

RESERVE_SECONDS = 60.0  # a placed gang whose members are not all bound by then is released and placed again
EventSink = Callable[[dict[str, Any], str, str, str], None]  # (object, reason, message, type)
PodGroupLookup = Callable[[str, str], Mapping[str, Any] | None]  # (namespace, name) -> PodGroup


class Phase(StrEnum):
    """TensorFusion's ``status.gang.phase`` values."""

    PENDING = "Pending"
    WAITING = "Waiting"
    SCHEDULING = "Scheduling"
    RUNNING = "Running"
    TIMED_OUT = "TimedOut"
    FAILED = "Failed"


@dataclass
class Gang:
    key: str
    first_seen: float
    phase: Phase = Phase.PENDING
    placed_at: float | None = None
    reason: str = ""
    required: int = 0
    desired: int = 0
    timeout: dt.timedelta | None = None
    members: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> latest pod
    candidates: dict[str, tuple[str, ...]] = field(default_factory=dict)  # uid -> nodes the scheduler sent
    time_to_place: float | None = None
    preempting: tuple[str, ...] = ()  # uids of the pods being evicted so that the whole gang fits


class GangKeeper(FilterHook):
    def __init__(self, state: ClusterState, *, clock: Callable[[], float] = time.monotonic,
                 reserve_seconds: float = RESERVE_SECONDS, admit_gang: AdmitGang = admit_none,
                 events: EventSink | None = None, pod_groups: PodGroupLookup | None = None,
                 on_placed: Callable[[float], None] | None = None,
                 evict: Callable[[str, list[Victim]], None] | None = None) -> None:
        self.state = state
        self.clock = clock
        self.reserve_seconds = reserve_seconds
        self.admit_gang = admit_gang
        self._events = events or (lambda obj, reason, message, type_: None)
        self._pod_groups = pod_groups or (lambda namespace, name: None)
        self._on_placed = on_placed or (lambda seconds: None)
        self._evict = evict  # None: no preemption for gangs
        self.gangs: dict[str, Gang] = {}
        self._gang_of: dict[str, str] = {}  # uid -> gang key
        # gang -> since when part of its quorum is bound and nothing is held for the rest
        self._half_since: dict[str, float] = {}

    # --- the pods watch ---------------------------------------------------------------------------

    def observe(self, event_type: str, pod: dict[str, Any]) -> None:
        """A watch listener on the GPU pods: keeps each gang's members."""
        uid = pod_uid(pod)
        member = membership(pod)
        if event_type == "DELETED" or member is None or not is_live(pod):
            key = self._gang_of.pop(uid, None)
            gang = self.gangs.get(key) if key else None
            if gang is not None and gang.members.pop(uid, None) is not None and not is_bound(pod):
                if self.state.gang_holds().get(gang.key):
                    self._release(gang, f"member {pod_key(pod)} is gone")
                if not gang.members:
                    del self.gangs[gang.key]
            return
        self._gang(member).members[uid] = pod
        self._gang_of[uid] = member.group_key

    def _gang(self, member: Membership) -> Gang:
        gang = self.gangs.get(member.group_key)
        if gang is None:
            gang = self.gangs[member.group_key] = Gang(member.group_key, self.clock())
        if not member.native:
            gang.required, gang.desired, gang.timeout = member.required, member.desired, member.timeout
        return gang

    def _required(self, gang: Gang, pod: Mapping[str, Any], member: Membership) -> int | str:
        if not member.native:
            return member.required
        namespace, _, name = member.group_key.partition("/")
        name = name.partition(":")[2]
        group = self._pod_groups(namespace, name)
        count = pod_group_min_count(group) if group is not None else None
        if count is None:
            return f"gang {member.group_key}: PodGroup {namespace}/{name} " + (
                "not found" if group is None else "has no gang policy (spec.schedulingPolicy.gang.minCount)")
        gang.required = gang.desired = count
        return count

    # --- the filter -------------------------------------------------------------------------------

    def before_filter(self, pod: dict[str, Any], node_names: Sequence[str]) -> FilterOutcome | None:
        member = membership(pod)
        if member is None:
            return None
        uid = pod_uid(pod)
        gang = self._gang(member)
        gang.members.setdefault(uid, pod)
        self._gang_of[uid] = gang.key
        gang.candidates[uid] = tuple(node_names)
        held = self.state.held_node(pod)
        if held is not None and self.state.gang_binding(uid) is None and uid not in self._held_uids(gang):
            held = None  # a filter hold of a placement run alone (after the quorum ran): not the gang's
        if held is not None:
            message = f"gang {gang.key} holds this pod's GPUs on node {held}"
            return FilterOutcome([n for n in node_names if n == held],
                                 {}, {n: message for n in node_names if n != held}, None, False)
        if gang.phase is Phase.TIMED_OUT:
            return _no(node_names, gang.reason)
        required = self._required(gang, pod, member)
        if isinstance(required, str):
            gang.phase, gang.reason = Phase.WAITING, required
            return _no(node_names, required)
        q = self._quorum(gang, required)
        if q.running:
            gang.phase = Phase.RUNNING
            return None  # the quorum runs: a later member (restarted, extra) places alone
        if not q.met:
            gang.phase, gang.reason = Phase.WAITING, q.waiting_message()
            return _no(node_names, gang.reason)
        return self._place(gang, q, pod, node_names)

    def _quorum(self, gang: Gang, required: int) -> Quorum:
        pods = []
        for uid, member in gang.members.items():
            if not is_bound(member) and self.state.gang_binding(uid) is not None:
                member = {**member, "spec": {**(member.get("spec") or {}), "nodeName": "(binding)"}}
            pods.append(member)
        return quorum(gang.key, required, pods)

    def _held_uids(self, gang: Gang) -> set[str]:
        return {a.uid for a in self.state.gang_holds().get(gang.key, ())}

    def _place(self, gang: Gang, q: Quorum, pod: dict[str, Any],
               node_names: Sequence[str]) -> FilterOutcome | None:
        self.state.release_gang(gang.key)  # what it held before (a partial set) is chosen again with the rest
        waiting = [dict(p) for p in q.waiting]
        plan = place_gang(self.state, waiting, gang.candidates, needed=q.still_needed)
        if not plan.fits:
            gang.phase, gang.reason = Phase.WAITING, f"gang {gang.key}: {plan.reason}"
            self._preempt(gang, waiting, q.still_needed)
            return FilterOutcome([], {}, {n: gang.reason for n in node_names}, None, plan.capacity_only)
        if reason := self.admit_gang([p.pod for p in plan.placed]):
            gang.phase, gang.reason = Phase.WAITING, f"gang {gang.key}: {reason}"
            return _no(node_names, gang.reason)
        self.state.hold_gang(gang.key, [(p.pod, p.node, p.gpu_ids) for p in plan.placed])
        now = self.clock()
        gang.phase, gang.placed_at, gang.reason = Phase.SCHEDULING, now, ""
        if gang.time_to_place is None:
            gang.time_to_place = now - gang.first_seen
            self._on_placed(gang.time_to_place)
        for placed in plan.placed:
            self._events(dict(placed.pod), "GangPlaced",
                         f"gang {gang.key}: {len(plan.placed)} members placed together; this one on node "
                         f"{placed.node}, GPUs {','.join(placed.gpu_ids)}", "Normal")
        log.info("gang placed", extra={"gang": gang.key, "members": len(plan.placed),
                                       "nodes": sorted({p.node for p in plan.placed})})
        mine = next((p.node for p in plan.placed if pod_uid(p.pod) == pod_uid(pod)), None)
        if mine is None:
            return None  # an extra member the quorum did not need: it places alone
        message = f"gang {gang.key} holds this pod's GPUs on node {mine}"
        return FilterOutcome([n for n in node_names if n == mine], {},
                             {n: message for n in node_names if n != mine}, None, False)

    def _preempt(self, gang: Gang, waiting: list[dict[str, Any]], needed: int) -> None:
        """Evict lower-priority pods when, and only when, the whole gang then fits
        (``extender.gang.preemption``); once per victim set, while its pods still hold GPUs."""
        if self._evict is None:
            return
        still = [uid for uid in gang.preempting if self.state.holds(uid)]
        if still:
            gang.reason = f"gang {gang.key}: waiting for {len(still)} preempted GPU pods to terminate"
            return
        victims = preempt_for_gang(self.state, waiting, needed, protected=self._gang_of.keys())
        gang.preempting = tuple(v.uid for v in victims or ())
        if victims:
            names = ", ".join(f"{v.namespace}/{v.name}" for v in victims)
            gang.reason = (f"gang {gang.key}: evicting lower-priority GPU pods {names} so that the whole "
                           "gang fits")
            for pod in waiting:
                self._events(pod, "PreemptingGPUPods", gang.reason, "Normal")
            self._evict(gang.key, victims)

    def hold_back(self, pod: dict[str, Any]) -> str | None:
        member = membership(pod)
        if member is None:
            return None
        gang = self.gangs.get(member.group_key)
        if gang is None or gang.phase is Phase.TIMED_OUT:
            return None
        return gang.reason or f"gang {member.group_key} is waiting"

    # --- the reconcile: timeouts, stale holds -----------------------------------------------------

    def sweep(self) -> None:
        """Release gangs that timed out or whose placement did not all bind in time; mark running ones."""
        now = self.clock()
        holds = self.state.gang_holds()
        for gang in list(self.gangs.values()):
            if gang.phase is Phase.TIMED_OUT:
                continue
            bound = sum(1 for p in gang.members.values() if is_bound(p))
            if gang.required and bound >= gang.required:
                if gang.phase is not Phase.RUNNING:
                    gang.phase, gang.reason = Phase.RUNNING, ""
                    self.state.release_gang(gang.key)  # extras that did not bind: they place alone
                continue
            if gang.timeout is not None and now - gang.first_seen >= gang.timeout.total_seconds():
                gang.phase = Phase.TIMED_OUT
                gang.reason = (f"gang {gang.key}: timed out after {gang.timeout.total_seconds():g}s with "
                               f"{bound} of {gang.required} members bound; recreate its pods to try again")
                self.state.release_gang(gang.key)
                for pod in gang.members.values():
                    self._events(pod, "GangTimedOut", gang.reason, "Warning")
                log.warning("gang timed out", extra={"gang": gang.key, "bound": bound})
                continue
            if gang.key in holds and gang.placed_at is not None and \
                    now - gang.placed_at >= self.reserve_seconds:
                self._release(gang, f"its members did not all bind within {self.reserve_seconds:g}s")
            elif gang.key in holds and any(not self._node_known(a.node) for a in holds[gang.key]):
                self._release(gang, "a node it was placed on is gone")

    def half_bound(self) -> list[tuple[Gang, list[dict[str, Any]]]]:
        """Gangs left with part of their quorum bound and nothing held for the rest (an extender restart, a
        member's bind that failed for good) for ``reserve_seconds``: their bound members, to release (the
        leader deletes them; their controllers recreate them, and the gang is placed whole again)."""
        now = self.clock()
        holds = self.state.gang_holds()
        out = []
        for gang in self.gangs.values():
            members = [p for p in gang.members.values() if is_live(p)]
            bound = [p for p in members if is_bound(p)]
            binding = any(self.state.gang_binding(pod_uid(p)) is not None for p in members)
            if not (gang.required and 0 < len(bound) < gang.required) or gang.key in holds or binding:
                self._half_since.pop(gang.key, None)
                continue
            since = self._half_since.setdefault(gang.key, now)
            if now - since >= self.reserve_seconds:
                del self._half_since[gang.key]
                gang.reason = (f"gang {gang.key}: released: {len(bound)} of {gang.required} members were "
                               f"bound and the rest could not be placed for {self.reserve_seconds:g}s")
                out.append((gang, bound))
        return out

    def _node_known(self, node: str) -> bool:
        return bool(self.state.node_gpus(node))

    def _release(self, gang: Gang, why: str) -> None:
        released = self.state.release_gang(gang.key)
        gang.phase, gang.placed_at = Phase.WAITING, None
        gang.reason = f"gang {gang.key}: released ({why}); placing it again"
        log.info("gang released", extra={"gang": gang.key, "members": len(released), "reason": why})

    # --- views ------------------------------------------------------------------------------------

    def waiting(self) -> list[Gang]:
        return sorted((g for g in self.gangs.values() if g.phase is not Phase.RUNNING), key=lambda g: g.key)


def _no(node_names: Sequence[str], message: str) -> FilterOutcome:
    """No node, and nothing on any node can help (no preemption for one member alone)."""
    return FilterOutcome([], {}, {n: message for n in node_names}, None, False)

"""Preemption the scheduler cannot see: GPU shares.

kube-scheduler only asks an extender to refine victims on nodes where its own filters found some;
a pod that fails only on GPU capacity never gets there. So when filter finds no node for a pod that
may preempt, this worker asks the core for a node and the fewest lower-priority GPU pods whose
release makes room, and evicts them. The scheduler retries the pod once they are gone.

PodDisruptionBudgets: the core prefers victim sets that break no budget (extender/pdb.py), and victims are
evicted through the Eviction API, so the API server refuses an eviction a budget does not allow (the pod
then waits, and a later retry may find another set or the budget's room).
"""

from __future__ import annotations

import argparse
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from extender.controllers.runner import KeyedQueue, KeyedReconciler
from extender.server.hooks import FilterHook

if TYPE_CHECKING:
    from extender.controllers.wiring import Built, Deps
    from extender.kube.pods import PodApi
    from extender.server.binder import EventSink
    from extender.server.metrics import Metrics

log = logging.getLogger(__name__)


class VictimLike(Protocol):
    @property
    def uid(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def priority(self) -> int: ...


class PreemptState(Protocol):
    def find_preemption(self, pod: dict[str, Any],
                        pdb: Any = None) -> tuple[str, Sequence[VictimLike]] | None: ...
    def holds(self, uid: str) -> bool: ...


class OutcomeLike(Protocol):
    @property
    def fits(self) -> list[str]: ...
    @property
    def failed(self) -> dict[str, str]: ...
    @property
    def error(self) -> str | None: ...


def may_preempt(pod: dict[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    terminating = (pod.get("metadata") or {}).get("deletionTimestamp")
    return spec.get("preemptionPolicy") != "Never" and not terminating


def _key(pod: dict[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


def _uid(pod: dict[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid", ""))


NAME = "preemptor"
DEFAULT = True  # whether the preemptor runs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("preemption")
    group.add_argument("--preemptor", action=argparse.BooleanOptionalAction, default=True,
                       help="evict lower-priority GPU pods for pods that fit nowhere else (default on)")


def from_args(args: argparse.Namespace) -> bool:
    """Whether the preemptor runs."""
    return bool(args.preemptor)


class Preemptor(FilterHook):
    """Evicts for the pods the filter found no room for (``after_filter``), one pod at a time
    (``reconcile``), and holds those pods back meanwhile (``hold_back``)."""

    def __init__(self, state: PreemptState, api: PodApi, events: EventSink, metrics: Metrics | None = None,
                 *, max_remembered: int = 10_000, pdb: Any = None) -> None:
        self.state = state
        self.pdb = pdb  # a PdbCheck (extender/pdb.py), or None to ignore PodDisruptionBudgets
        self.api = api
        self.events = events
        self.metrics = metrics
        self.max_remembered = max_remembered
        # the pods to preempt for, by key (the latest copy of a pod queued twice wins), worked by the runner
        self.queue: KeyedQueue[dict[str, Any]] = KeyedQueue()
        self._done: OrderedDict[str, set[frozenset[str]]] = OrderedDict()  # pod uid -> victim sets
        # pod uid -> victims deleted for it; until they are gone their shares still count (a terminating pod
        # keeps its GPUs), so the scheduler's retries must not pick further victims meanwhile
        self._deleted: OrderedDict[str, dict[str, str]] = OrderedDict()  # pod uid -> {victim uid: key}

    def after_filter(self, pod: dict[str, Any], outcome: OutcomeLike) -> None:
        """Queue the pod when no node fits but evicting pods could help."""
        if outcome.fits or outcome.error or not outcome.failed or not may_preempt(pod):
            return
        self.queue.add(_key(pod), pod)

    async def reconcile(self, key: str, pod: dict[str, Any]) -> None:
        await self.preempt_for(pod)

    def waiting_on(self, pod: dict[str, Any]) -> list[str]:
        """The victims deleted for ``pod`` that still hold GPU capacity (terminating), by key."""
        deleted = self._deleted.get(_uid(pod)) or {}
        return sorted(key for uid, key in deleted.items() if self.state.holds(uid))

    def hold_back(self, pod: dict[str, Any]) -> str | None:
        """For a pod that fits nowhere: an error to answer instead, while preemption is making room for it.

        "No node fits" would park the pod in the scheduler's unschedulable queue, and the victims'
        deletions do not bring it back (the scheduler has no plugin of its own that rejected it, and it may
        see the deletions before this extender does): it would wait minutes. An error makes the scheduler
        retry with backoff until the room is there."""
        waiting = self.waiting_on(pod)
        if waiting:
            return f"waiting for preempted GPU pods {', '.join(waiting)} to terminate"
        if _key(pod) in self.queue:
            choice = self.state.find_preemption(pod, self.pdb)
            if choice is not None and choice[1]:
                names = ", ".join(f"{v.namespace}/{v.name}" for v in choice[1])
                return f"preempting lower-priority GPU pods {names} on node {choice[0]}"
        return None

    async def preempt_for(self, pod: dict[str, Any]) -> list[str]:
        """Evict the victims the core chooses for ``pod``; returns the evicted pods' keys."""
        from extender.kube.client import error_message, error_status  # here: the flags import this module

        if self.state.holds(_uid(pod)):
            return []  # a stale queue entry: the pod has been placed (or is being bound) meanwhile
        if self.waiting_on(pod):
            return []  # earlier victims are still terminating: their release may be all the pod needs
        self._deleted.pop(_uid(pod), None)
        choice = self.state.find_preemption(pod, self.pdb)
        if choice is None:
            return []
        node, victims = choice
        victim_set = frozenset(v.uid for v in victims)
        done = self._done.setdefault(_uid(pod), set())
        self._done.move_to_end(_uid(pod))
        if not victims or victim_set in done:
            return []  # this set is already being deleted: the retry must not delete again
        done.add(victim_set)
        while len(self._done) > self.max_remembered:
            self._done.popitem(last=False)
        gone_for_pod = self._deleted.setdefault(_uid(pod), {})
        self._deleted.move_to_end(_uid(pod))
        while len(self._deleted) > self.max_remembered:
            self._deleted.popitem(last=False)
        names = ", ".join(f"{v.namespace}/{v.name}" for v in victims)
        self.events.record(pod, "PreemptingGPUPods",
                           f"evicting lower-priority GPU pods {names} on node {node} to free GPU capacity")
        deleted = []
        for victim in victims:
            victim_ref = {"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": victim.name, "namespace": victim.namespace, "uid": victim.uid}}
            try:
                await self.api.evict(victim.namespace, victim.name, victim.uid)
            except Exception as exc:
                status = error_status(exc)
                if status in (404, 409):  # already gone, or replaced by a new pod
                    continue
                done.discard(victim_set)  # let a later retry try again
                victim_key = f"{victim.namespace}/{victim.name}"
                if status == 429:  # a PodDisruptionBudget does not allow it now
                    log.info("eviction refused by a PodDisruptionBudget",
                             extra={"pod": _key(pod), "victim": victim_key, "error": error_message(exc)})
                    self.events.record(pod, "PreemptionBlockedByPDB",
                                       f"a PodDisruptionBudget does not allow evicting {victim_key} now",
                                       "Warning")
                else:
                    log.warning("could not evict victim",
                                extra={"pod": _key(pod), "error": error_message(exc), "victim": victim_key})
                if self.metrics is not None:
                    self.metrics.preemptions.labels("blocked" if status == 429 else "error").inc()
                continue
            deleted.append(f"{victim.namespace}/{victim.name}")
            gone_for_pod[victim.uid] = f"{victim.namespace}/{victim.name}"
            self.events.record(victim_ref, "Preempted",
                               f"Preempted by {_key(pod)} on node {node} to free GPU capacity", "Warning")
            if self.metrics is not None:
                self.metrics.preemptions.labels("evicted").inc()
        log.info("preempted", extra={"pod": _key(pod), "node": node, "victims": deleted})
        return deleted


def build(deps: Deps, enabled: bool) -> Built | None:
    """The preemptor on every replica (each answers its own scheduler's filter calls): one pod at a time,
    and a failed preemption is not retried from its queued copy (the pod may be gone or placed by then;
    the scheduler's next filter call queues it afresh)."""
    from extender.controllers.wiring import Built

    if not enabled:
        return None
    preemptor = Preemptor(deps.state, deps.pod_api, deps.recorder, deps.metrics, pdb=deps.pdb)
    controller = KeyedReconciler("preemptor", preemptor.reconcile, preemptor.queue, caches=deps.core.all,
                                 retry_errors=False)
    return Built(controllers=(controller,), hooks=(preemptor,), part=preemptor)

"""Prompting kube-scheduler to retry the GPU pods the extender turned away, once room appears.

kube-scheduler parks a pod that failed scheduling until a cluster event might help it: a node added or
updated, a pod deleted. A pod the extender rejected carries no plugin to blame, so any such event sends it
back to be scheduled. The extender learns of the same change through its own watch, which can be later
than kube-scheduler's: the retry then meets the extender's old inventory (a node whose GPU labels it has
not seen yet, a finished pod still counted), is rejected again, and waits for the next event. On a quiet
cluster that next event is kube-scheduler's periodic flush of parked pods, five minutes later.

So when the extender's own view gains room on a node (GPUs appear or grow, a pod's allocation is freed)
after a filter turned a pod away, it updates one annotation on that node. kube-scheduler treats a node
annotation change as a node update (``UpdateNodeAnnotation``), and retries the parked pods that pass its
quick pre-check for that node, now against an extender that knows the room.

Bounds: a node is nudged only when a pod was rejected since its last nudge, at most once per
``node_interval`` seconds, and at most ``max_per_round`` nodes per round, one round a second (the rest
wait for the next round): one nudge already sends kube-scheduler every parked pod that could use that
node, so a cluster with churn on every node still sees a few node writes a second, not one per node.
Memory is bounded by the number of nodes.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from extender.common.labels import NUDGE_ANNOTATION
from extender.controllers.runner import Reconciler
from extender.server.hooks import FilterHook

if TYPE_CHECKING:
    from extender.controllers.wiring import Built, Deps
    from extender.scheduling.state import FilterOutcome

log = logging.getLogger(__name__)

ROUND_SECONDS = 1.0  # at least this long between two rounds of nudges
SETTLE_SECONDS = 0.2  # after room appears, before the round

PatchNode = Callable[[str, dict[str, Any]], Awaitable[Any]]


class Nudges:
    """Which nodes to nudge and when: pure bookkeeping, driven by a clock."""

    def __init__(self, *, node_interval: float = 5.0, max_per_round: int = 5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node_interval = node_interval
        self.max_per_round = max_per_round
        self._clock = clock
        self._rejections = 0  # filters that turned a pod away; a counter, so "since" is a comparison
        self._nudged: dict[str, tuple[int, float]] = {}  # node -> (rejections counted, time) at last nudge
        self._due: dict[str, None] = {}  # nodes that gained room, in order of arrival

    def rejected(self) -> None:
        self._rejections += 1

    def gained(self, nodes: Iterable[str]) -> bool:
        """Room appeared on ``nodes``; answers whether any of them became due for a nudge."""
        added = False
        for node in nodes:
            if node not in self._due and self._nudged.get(node, (0, 0.0))[0] < self._rejections:
                self._due[node] = None
                added = True
        return added

    def forget(self, node: str) -> None:
        self._due.pop(node, None)
        self._nudged.pop(node, None)

    def take(self) -> tuple[list[str], float | None]:
        """The nodes to nudge now (marked as nudged), and in how many seconds the next is due (None: no
        node waits)."""
        now = self._clock()
        chosen: list[str] = []
        wait: float | None = None
        for node in list(self._due):
            last = self._nudged.get(node)
            ready_in = 0.0 if last is None else last[1] + self.node_interval - now
            if ready_in > 0:
                wait = ready_in if wait is None else min(wait, ready_in)
                continue
            if len(chosen) >= self.max_per_round:
                wait = 0.0
                break
            del self._due[node]
            chosen.append(node)
            self._nudged[node] = (self._rejections, now)
        self._prune(now)
        return chosen, wait

    def _prune(self, now: float) -> None:
        # A record older than the last rejection and past its rate limit says what no record says (a
        # rejection since the last nudge, nudging allowed), so it goes: the records stay as few as the
        # nodes nudged since the last rejection.
        stale = [node for node, (seen, at) in self._nudged.items()
                 if seen < self._rejections and at + self.node_interval <= now]
        for node in stale:
            del self._nudged[node]

    def __len__(self) -> int:
        return len(self._due)

    def records(self) -> set[str]:
        """The nodes it keeps a record of (their last nudge)."""
        return set(self._nudged)


def nudge_patch(now: dt.datetime) -> dict[str, Any]:
    stamp = now.astimezone(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    return {"metadata": {"annotations": {NUDGE_ANNOTATION: stamp}}}


NAME = "nudge"
DEFAULT = True  # whether kube-scheduler is nudged


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("scheduler nudges")
    group.add_argument("--nudge-scheduler", action=argparse.BooleanOptionalAction, default=True,
                       help="when room appears on a node after a GPU pod was turned away, update the node's "
                            f"{NUDGE_ANNOTATION} annotation so kube-scheduler retries the pod "
                            "now rather than at its next periodic retry, up to 5 minutes later (default on)")


def from_args(args: argparse.Namespace) -> bool:
    return bool(args.nudge_scheduler)


class SchedulerNudger(FilterHook):
    """The I/O around ``Nudges``: a filter hook (a pod turned away), a sink for the cluster state's "room
    appeared" (``gained``), and a reconcile that patches the nodes due."""

    def __init__(self, patch_node: PatchNode, nudges: Nudges | None = None, *,
                 on_nudge: Callable[[str, str], None] | None = None) -> None:
        self.nudges = nudges or Nudges()
        self._patch_node = patch_node
        self._on_nudge = on_nudge or (lambda node, outcome: None)
        # rounds start when room appears, after the events of one change (a node's several GPUs, a burst of
        # finished pods) have gathered, and at most one a second
        self.controller = Reconciler("scheduler-nudge", self.reconcile, settle=SETTLE_SECONDS,
                                     min_gap=ROUND_SECONDS)

    def after_filter(self, pod: dict[str, Any], outcome: FilterOutcome) -> None:
        if outcome.error is None and not outcome.fits and (outcome.failed or outcome.unresolvable):
            self.nudges.rejected()

    def gained(self, nodes: Iterable[str]) -> None:
        if self.nudges.gained(nodes):
            self.controller.wake()

    async def reconcile(self, now: dt.datetime) -> float | None:
        """One round: nudge the nodes due now; run again when the next one is due."""
        nodes, wait = self.nudges.take()
        for node in nodes:
            await self._nudge(node)
        return wait

    async def _nudge(self, node: str) -> None:
        from extender.kube.client import error_message, not_found  # here: the flags import this module

        try:
            await self._patch_node(node, nudge_patch(dt.datetime.now(dt.UTC)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not_found(exc):
                self.nudges.forget(node)
                self._on_nudge(node, "gone")
                return
            log.warning("scheduler nudge failed", extra={"node": node, "error": error_message(exc)})
            self._on_nudge(node, "error")
            return
        log.info("nudged kube-scheduler", extra={"node": node})
        self._on_nudge(node, "sent")


def build(deps: Deps, enabled: bool) -> Built | None:
    """The nudger on every replica: each replica's own filter answers are what it nudges for."""
    from extender.controllers.wiring import Built
    from extender.kube import resources

    if not enabled:
        return None

    async def patch_node(node: str, patch: dict[str, Any]) -> None:
        await deps.kube.request("PATCH", resources.object_path(resources.NODES, node), body=patch,
                                content_type="application/merge-patch+json", timeout=10.0)

    counter = deps.metrics.scheduler_nudges
    nudger = SchedulerNudger(patch_node, on_nudge=lambda node, outcome: counter.labels(outcome).inc())
    return Built(controllers=(nudger.controller,), hooks=(nudger,), room_sinks=(nudger.gained,), part=nudger)

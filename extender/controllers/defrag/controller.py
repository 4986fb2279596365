"""The live defragmentation of ``tf-extender serve``: two leader-only controllers.

``defrag`` (a ``Reconciler``, every ``tick_seconds``) looks at each GPUPool: a run is due when the pool's cron
schedule fired since the last look (on the pool's time zone), or at once when the pool carries the
manual-trigger annotation with a fresh timestamp; a due run is queued under the pool's name.
``defrag-runs`` (a ``KeyedReconciler``) runs each queued pool's run, every pool's at once and never two of one
pool; the runner cancels them when leadership is lost.

A run plans with ``plan.plan_pool`` and then moves one worker at a time: evict it through the Eviction API
(a PodDisruptionBudget that refuses is retried until it allows), wait until the evicted pod is gone and its
controller's replacement is bound (bounded), re-plan the nodes it set out to empty with what the cluster
looks like now, and go on until they are empty or ``maxDuration`` is reached.

While a run is active the extender's filter keeps the pool's GPU pods off the run's fenced nodes (the
candidates and the empty nodes) whenever another node fits, so replacements land on fuller nodes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Protocol

from extender.common.contract import GPU_POOL
from extender.common.labels import MANUAL_DEFRAG
from extender.common.timefmt import parse_time
from extender.controllers.capacity.config import DEFAULT_MANUAL_WINDOW
from extender.controllers.defrag.config import (
    DEFAULT_REPLACEMENT_TIMEOUT_SECONDS,
    DEFAULT_TICK_SECONDS,
    DefragConfig,
    DefragConfigError,
    parse_config,
)
from extender.controllers.defrag.metrics import DefragMetrics
from extender.controllers.defrag.plan import (
    Move,
    Plan,
    Skip,
    SkipReason,
    Snapshot,
    candidate_nodes,
    plan_pool,
    pool_nodes,
)
from extender.controllers.isolation import Isolation
from extender.controllers.runner import KeyedQueue, KeyedReconciler, Reconciler, Synced
from extender.scheduling.state import ClusterState, FilterOutcome
from extender.server.hooks import FilterHook

log = logging.getLogger(__name__)

MANUAL_TRIGGER_WINDOW = dt.timedelta(seconds=DEFAULT_MANUAL_WINDOW)  # as compaction's manual trigger
EVICTION_RETRY_SECONDS = 2.0
POLL_SECONDS = 0.5
PER_NODE_LISTS = 20  # more candidate nodes than this: one cluster-wide pod list per plan
FENCED_MESSAGE = "node is being emptied by defragmentation of pool {pool}"


class Eviction(StrEnum):
    EVICTED = "evicted"
    BLOCKED = "blocked"  # 429: a PodDisruptionBudget does not allow it now
    GONE = "gone"  # 404 or a different pod of that name
    FAILED = "failed"


class DefragPort(Protocol):
    """What a run reads and writes besides the extender's own state."""

    async def pods_on(self, node: str) -> list[dict[str, Any]]: ...

    async def all_pods(self) -> list[dict[str, Any]]: ...

    async def pdbs(self) -> list[dict[str, Any]]: ...

    async def evict(self, namespace: str, name: str, uid: str) -> tuple[Eviction, str]: ...

    def node(self, name: str) -> dict[str, Any] | None: ...

    def worker_pods(self) -> list[dict[str, Any]]: ...

    def pools(self) -> list[dict[str, Any]]: ...


class Recorder(Protocol):
    def record(self, obj: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None: ...


class Trigger(StrEnum):
    SCHEDULE = "schedule"
    MANUAL = "manual"


@dataclass
class RunResult:
    pool: str
    trigger: Trigger
    moved: list[Move] = field(default_factory=list)
    emptied: list[str] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)
    stopped: str | None = None  # why the run ended early (maxDuration, a replacement that did not bind ...)
    seconds: float = 0.0


@dataclass(frozen=True)
class DueRun:
    """A run that is due: the pool as it was seen, its settings, and what started it."""

    pool: dict[str, Any]
    config: DefragConfig
    trigger: Trigger


def manual_trigger(pool: Mapping[str, Any], now: dt.datetime, window: dt.timedelta = MANUAL_TRIGGER_WINDOW
                   ) -> str | None:
    """The manual-trigger annotation's value when it holds a timestamp within ``window`` of now."""
    raw = ((pool.get("metadata") or {}).get("annotations") or {}).get(MANUAL_DEFRAG)
    stamp = parse_time(raw)
    return str(raw) if stamp is not None and abs(now - stamp) <= window else None


def pod_pool(pod: Mapping[str, Any]) -> str | None:
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(GPU_POOL)
    return str(value) if value else None


def controller_uid(pod: Mapping[str, Any]) -> str | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return str(ref.get("uid") or "")
    return None


def _pool_name(pool: Mapping[str, Any]) -> str:
    return str((pool.get("metadata") or {}).get("name") or "")


def _format_seconds(seconds: float) -> str:
    return f"{seconds:.1f}s"


class Defragmenter(FilterHook):
    """The pools' defragmentation: which runs are due (``reconcile``), the runs (``run_queued``), and the
    filter's fence around the nodes a run is emptying (``narrow``)."""

    def __init__(self, state: ClusterState, port: DefragPort, recorder: Recorder, metrics: DefragMetrics,
                 *, tick_seconds: float = DEFAULT_TICK_SECONDS,
                 replacement_timeout: float = DEFAULT_REPLACEMENT_TIMEOUT_SECONDS,
                 caches: Sequence[Synced] = (),
                 now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.state = state
        self.port = port
        self.recorder = recorder
        self.metrics = metrics
        self.tick_seconds = tick_seconds
        self.replacement_timeout = replacement_timeout
        self.now = now
        self.sleep = sleep
        self._last_look: dt.datetime | None = None
        self._last_fired: dict[str, dt.datetime] = {}
        self._manual_seen: dict[str, str] = {}
        self._config_errors: dict[str, str] = {}
        self._fences: dict[str, frozenset[str]] = {}
        self.runs: dict[str, Trigger] = {}  # the pools whose run is in progress
        self.queue: KeyedQueue[DueRun] = KeyedQueue()  # runs due, by pool name
        self.isolation = Isolation("defrag", "GPUPool", recorder)
        # looks at the pools every tick and queues the runs that are due
        self.looker = Reconciler("defrag", self.reconcile, interval=tick_seconds, leader_only=True,
                                 caches=caches, on_demoted=self.demoted)
        # one run per pool at a time, every pool's at once; a failed run waits for its next trigger
        self.mover: KeyedReconciler[DueRun] = KeyedReconciler(
            "defrag-runs", self.run_queued, queue=self.queue, leader_only=True, caches=caches, workers=0,
            retry_errors=False)

    # --- the filter hook ------------------------------------------------------------------------------

    def narrow(self, pod: dict[str, Any], outcome: FilterOutcome) -> FilterOutcome:
        """Keep a pod of a pool being defragmented off the run's fenced nodes, when any other node fits."""
        if not self._fences or not outcome.fits:
            return outcome
        pool = pod_pool(pod)
        fence = self._fences.get(pool or "")
        if not fence:
            return outcome
        kept = [n for n in outcome.fits if n not in fence]
        if not kept or len(kept) == len(outcome.fits):
            return outcome
        message = FENCED_MESSAGE.format(pool=pool)
        failed = {**outcome.failed, **{n: message for n in outcome.fits if n in fence}}
        return replace(outcome, fits=kept, failed=failed)

    # --- the controllers ------------------------------------------------------------------------------

    def due(self, pools: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], DefragConfig, Trigger]]:
        """The pools whose run starts now (a manual trigger first, then a schedule that fired)."""
        now = self.now()
        last_look, self._last_look = self._last_look or now, now
        # one pool at a time: a pool that raises is named (once per change) and the later pools are looked at
        looked = self.isolation.each(sorted(pools, key=_pool_name), lambda p: self._due(p, last_look, now))
        return [(pool, due[0], due[1]) for pool, due in looked if due is not None]

    def _due(self, pool: dict[str, Any], last_look: dt.datetime, now: dt.datetime
             ) -> tuple[DefragConfig, Trigger] | None:
        name = _pool_name(pool)
        try:
            config = parse_config(pool)
        except DefragConfigError as exc:
            self._config_invalid(pool, str(exc))
            return None
        self._config_errors.pop(name, None)
        manual = manual_trigger(pool, now)
        if manual is not None and self._manual_seen.get(name) != manual:
            self._manual_seen[name] = manual
            return config, Trigger.MANUAL
        if config.scheduled and config.timezone is not None:
            fired = config.schedule.fire_between(last_look, now, config.timezone)
            if fired is not None and self._last_fired.get(name) != fired:
                self._last_fired[name] = fired
                return config, Trigger.SCHEDULE
        return None

    async def reconcile(self, now: dt.datetime) -> None:
        """One look at the pools (on the defragmenter's own clock): queue the runs that are due, each pool's
        on its own (one run per pool at a time, so a long run in one pool does not make another pool's
        trigger go stale)."""
        for pool, config, trigger in self.due(self.port.pools()):
            name = _pool_name(pool)
            if name in self.runs or name in self.queue:
                log.info("defrag run already in progress", extra={"pool": name, "trigger": trigger.value})
                continue
            self.queue.add(name, DueRun(pool, config, trigger))

    def demoted(self) -> None:
        """Leadership was lost: a new leader does not catch up on the old one's schedule."""
        self._last_look = None

    async def run_queued(self, name: str, run: DueRun) -> None:
        """Run one pool's queued run; a run that fails says so (log, metric, event on the pool) and waits for
        the pool's next trigger. The pool's fence is lifted however the run ends."""
        self.runs[name] = run.trigger
        try:
            await self.run_pool(run.pool, run.config, run.trigger)
        except asyncio.CancelledError:
            log.info("defrag run cancelled", extra={"pool": name})
            raise
        except Exception as exc:
            log.exception("defrag run failed", extra={"pool": name})
            self.metrics.runs.labels(name, run.trigger.value, "failed").inc()
            self.recorder.record(run.pool, "DefragFailed", f"defragmentation run failed: {exc}", "Warning")
        finally:
            self._fences.pop(name, None)
            self.runs.pop(name, None)

    def _config_invalid(self, pool: dict[str, Any], message: str) -> None:
        name = _pool_name(pool)
        if self._config_errors.get(name) != message:
            self._config_errors[name] = message
            log.warning("defrag settings invalid", extra={"pool": name, "error": message})
            self.recorder.record(pool, "DefragConfigInvalid", message, "Warning")

    # --- one run --------------------------------------------------------------------------------------

    async def snapshot(self, pool: str, config: DefragConfig, only: Sequence[str] | None = None) -> Snapshot:
        """Node objects of the pool, the pods on its candidate nodes (those in ``only`` when given), PDBs."""
        uses = pool_nodes(self.state, pool)
        nodes = {n: obj for n in uses if (obj := self.port.node(n)) is not None}
        wanted = [n for n in candidate_nodes(uses, config.threshold_percent) if only is None or n in only]
        if len(wanted) > PER_NODE_LISTS:  # one list of every pod beats hundreds of per-node lists
            wanted_set = set(wanted)
            pods: dict[str, list[dict[str, Any]]] = {n: [] for n in wanted}
            for pod in await self.port.all_pods():
                node = (pod.get("spec") or {}).get("nodeName")
                if node in wanted_set:
                    pods[node].append(pod)
        else:
            pods = {n: await self.port.pods_on(n) for n in wanted}
        return Snapshot(nodes, pods, await self.port.pdbs())

    async def plan(self, pool: str, config: DefragConfig, only: Sequence[str] | None = None,
                   simulate: bool = True) -> Plan:
        snapshot = await self.snapshot(pool, config, only)
        return plan_pool(self.state, pool, config, snapshot, self.now(), only, simulate)

    async def run_pool(self, pool_obj: dict[str, Any], config: DefragConfig, trigger: Trigger) -> RunResult:
        """One run: the overview (candidates, the nodes left as they are), then node by node, emptiest
        first, plan that node from the cluster as it is and move its workers one at a time."""
        pool = _pool_name(pool_obj)
        started = self.now()
        deadline = started + config.max_duration
        result = RunResult(pool, trigger)
        overview = await self.plan(pool, config, simulate=False)
        log.info("defrag run started", extra={"pool": pool, "trigger": trigger.value,
                                              "candidates": list(overview.candidates),
                                              "eligible": list(overview.eligible)})
        self.recorder.record(pool_obj, "DefragStarted", (
            f"defragmentation started ({trigger.value}): {len(overview.candidates)} candidate nodes, "
            f"{len(overview.eligible)} to empty if their workers fit elsewhere "
            f"({', '.join(overview.eligible) or 'none'}), {len(overview.skips)} left as they are, "
            f"maxDuration {config.max_duration}"))
        for skip in overview.skips:
            self._report_skip(pool_obj, skip, result)
        self._fences[pool] = overview.fenced
        sources: list[str] = []
        try:
            for node in overview.eligible:
                if await self._empty_node(pool_obj, config, node, deadline, result):
                    sources.append(node)
                if result.stopped:
                    break
        finally:
            self._fences.pop(pool, None)
        remaining = {a.node for a in self.state.allocations()}
        result.emptied = [n for n in sources if n not in remaining]
        result.seconds = (self.now() - started).total_seconds()
        self._finish(pool_obj, result)
        return result

    async def _empty_node(self, pool_obj: dict[str, Any], config: DefragConfig, node: str,
                          deadline: dt.datetime, result: RunResult) -> bool:
        """Move the node's workers one at a time, planning the node again before each eviction; whether
        any moved. Sets ``result.stopped`` when the run has to end."""
        pool = _pool_name(pool_obj)
        moved = False
        while self.now() < deadline:
            plan = await self.plan(pool, config, only=[node])
            for skip in plan.skips:  # no room (or something changed since the overview): say why
                self._report_skip(pool_obj, skip, result)
            if plan.skips or not plan.moves:
                return moved
            move = plan.moves[0]
            owner, before = self._siblings_before(move)
            outcome = await self._evict(move, deadline)
            if outcome is None:
                result.stopped = f"maxDuration {config.max_duration} reached"
                return moved
            if outcome is not Eviction.EVICTED:
                result.stopped = f"could not evict pod {move.pod}: {outcome.value}"
                return moved
            moved = True
            result.moved.append(move)
            self.metrics.evictions.labels(pool).inc()
            self.recorder.record(pool_obj, "DefragPodEvicted", f"evicted pod {move.pod} from node "
                                 f"{move.source} (planned onto {move.target})")
            log.info("defrag evicted pod", extra={"pool": pool, "pod": move.pod, "node": move.source,
                                                  "target": move.target})
            problem = await self._await_replacement(move, owner, before, deadline)
            if problem is not None:
                result.stopped = problem
                return moved
        result.stopped = f"maxDuration {config.max_duration} reached"
        return moved

    async def _evict(self, move: Move, deadline: dt.datetime) -> Eviction | None:
        """Evict, retrying while a PodDisruptionBudget refuses; None when the deadline comes first."""
        namespace, _, name = move.pod.partition("/")
        outcome, message = await self.port.evict(namespace, name, move.uid)
        while outcome is Eviction.BLOCKED:
            log.debug("eviction refused by a PodDisruptionBudget", extra={"pod": move.pod, "error": message})
            if self.now() + dt.timedelta(seconds=EVICTION_RETRY_SECONDS) >= deadline:
                await self.sleep(max(0.0, (deadline - self.now()).total_seconds()))
                return None
            await self.sleep(EVICTION_RETRY_SECONDS)
            outcome, message = await self.port.evict(namespace, name, move.uid)
        if outcome is not Eviction.EVICTED:
            log.warning("defrag eviction failed", extra={"pod": move.pod, "outcome": outcome.value,
                                                         "error": message})
        return outcome

    def _siblings_before(self, move: Move) -> tuple[str | None, int]:
        """The evicted pod's controller and how many of its pods are bound, before the eviction."""
        owner = None
        for pod in self.port.worker_pods():
            if str((pod.get("metadata") or {}).get("uid")) == move.uid:
                owner = controller_uid(pod)
        return owner, self._bound_siblings(owner, exclude=None) if owner else 0

    async def _await_replacement(self, move: Move, owner: str | None, before: int,
                                 deadline: dt.datetime) -> str | None:
        """Until the evicted pod is gone and its controller has as many bound pods as before; a message
        when that takes longer than the replacement timeout or the run's deadline."""
        limit = min(deadline, self.now() + dt.timedelta(seconds=self.replacement_timeout))
        while not self._replaced(move, owner, before):
            if self.now() >= limit:
                what = "to be gone" if self.state.holds(move.uid) else "to get a bound replacement"
                return f"waited too long for pod {move.pod} {what}"
            await self.sleep(POLL_SECONDS)
        return None

    def _replaced(self, move: Move, owner: str | None, before: int) -> bool:
        """Whether the evicted pod is gone and its controller has as many bound pods as before."""
        gone = not self.state.holds(move.uid)
        return gone and (owner is None or self._bound_siblings(owner, exclude=move.uid) >= before)

    def _bound_siblings(self, owner: str | None, exclude: str | None) -> int:
        count = 0
        for pod in self.port.worker_pods():
            meta = pod.get("metadata") or {}
            if controller_uid(pod) != owner or meta.get("deletionTimestamp"):
                continue
            if str(meta.get("uid")) == exclude:
                continue
            if (pod.get("spec") or {}).get("nodeName"):
                count += 1
        return count

    def _report_skip(self, pool_obj: dict[str, Any], skip: Skip, result: RunResult) -> None:
        pool = _pool_name(pool_obj)
        result.skips.append(skip)
        self.metrics.skips.labels(pool, skip.reason.value).inc()
        if skip.reason is SkipReason.MISSING_PDB:
            self.recorder.record(pool_obj, "DefragSkipMissingPDB", skip.message, "Warning")
        else:
            self.recorder.record(pool_obj, "DefragSkipNode", f"{skip.message} ({skip.reason.value})")
        log.info("defrag skips node", extra={"pool": pool, "node": skip.node, "reason": skip.reason.value,
                                             "detail": skip.message})

    def _finish(self, pool_obj: dict[str, Any], result: RunResult) -> None:
        outcome = "stopped" if result.stopped else "completed"
        self.metrics.runs.labels(result.pool, result.trigger.value, outcome).inc()
        self.metrics.nodes_emptied.labels(result.pool).inc(len(result.emptied))
        message = (f"defragmentation finished: {len(result.emptied)} nodes emptied "
                   f"({', '.join(result.emptied) or 'none'}), {len(result.moved)} pods moved in "
                   f"{_format_seconds(result.seconds)}")
        if result.stopped:
            message += f"; stopped early: {result.stopped}"
        self.recorder.record(pool_obj, "DefragFinished", message)
        log.info("defrag run finished", extra={"pool": result.pool, "emptied": result.emptied,
                                               "moved": len(result.moved), "seconds": result.seconds,
                                               "stopped": result.stopped})

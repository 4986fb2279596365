"""The live defragmentation against a fake cluster and a fake clock: triggers, one eviction at a time,
PDB refusals, maxDuration, events and metrics, the filter fence, and its two controllers on the runner."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from extender.common.labels import MANUAL_DEFRAG
from extender.common.tasks import cancel_and_wait
from extender.controllers import runner as runner_module
from extender.controllers.defrag.config import parse_config
from extender.controllers.defrag.controller import Defragmenter, Eviction, Trigger, manual_trigger
from extender.controllers.defrag.metrics import DefragMetrics
from extender.controllers.runner import Leader, Runner
from extender.scheduling.state import ClusterState, FilterOutcome, Kind
from extender.simulate_cmd import load_cluster
from tests.unit.fixtures.defrag import NOW_TEXT, four_nodes, pool

NOW = dt.datetime.fromisoformat(NOW_TEXT)


class Clock:
    def __init__(self, now: dt.datetime) -> None:
        self.value = now

    def now(self) -> dt.datetime:
        return self.value

    async def sleep(self, seconds: float) -> None:
        self.value += dt.timedelta(seconds=seconds)
        await asyncio.sleep(0)


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def record(self, obj: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        self.events.append((reason, message, type_))

    def reasons(self) -> list[str]:
        return [e[0] for e in self.events]


class FakeCluster:
    """Pods, PDBs and pools in memory. An allowed eviction plays the ReplicaSet controller and the
    scheduler: the pod goes, and a replacement with the same owner is bound to the node the extender's
    state ranks first among the nodes its filter (with the defragmenter's fence) lets through."""

    def __init__(self, objects: list[dict[str, Any]], state: ClusterState) -> None:
        self.objects = objects
        self.state = state
        self.defragmenter: Defragmenter | None = None
        self.blocked: set[str] = set()  # pods whose eviction a PDB refuses
        self.evictions: list[str] = []
        self.replace = True

    def _pods(self) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == "Pod"]

    async def pods_on(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self._pods() if p["spec"].get("nodeName") == node]

    async def all_pods(self) -> list[dict[str, Any]]:
        return [p for p in self._pods() if p["spec"].get("nodeName")]

    async def pdbs(self) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == "PodDisruptionBudget"]

    def node(self, name: str) -> dict[str, Any] | None:
        return next((o for o in self.objects if o["kind"] == "Node" and o["metadata"]["name"] == name), None)

    def worker_pods(self) -> list[dict[str, Any]]:
        return self._pods()

    def pools(self) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == "GPUPool"]

    async def evict(self, namespace: str, name: str, uid: str) -> tuple[Eviction, str]:
        pod = next((p for p in self._pods() if p["metadata"]["uid"] == uid), None)
        if pod is None:
            return Eviction.GONE, "not found"
        if name in self.blocked:
            return Eviction.BLOCKED, "Cannot evict pod as it would violate the pod's disruption budget."
        self.evictions.append(f"{namespace}/{name}")
        self.objects.remove(pod)
        self.state.apply(Kind.POD, "DELETED", pod)
        if self.replace:
            self._replace(pod)
        return Eviction.EVICTED, ""

    def _replace(self, old: dict[str, Any]) -> None:
        new = copy.deepcopy(old)
        new["metadata"]["name"] += "-r"
        new["metadata"]["uid"] += "-r"
        new["metadata"]["creationTimestamp"] = NOW_TEXT
        del new["metadata"]["annotations"]["tensor-fusion.ai/gpu-ids"]
        new["spec"] = {}
        nodes = self.state.nodes()
        outcome = self.state.filter(new, nodes)
        assert self.defragmenter is not None
        outcome = self.defragmenter.narrow(new, outcome)
        node = self.state.rank(new, outcome.fits)[0]
        reservation = self.state.reserve(new, node)
        new["metadata"]["annotations"]["tensor-fusion.ai/gpu-ids"] = ",".join(reservation.gpu_ids)
        new["spec"] = {"nodeName": node}
        self.objects.append(new)
        self.state.apply(Kind.POD, "ADDED", new)


def setup(objects: list[dict[str, Any]], **kw: Any) -> tuple[Defragmenter, FakeCluster, Recorder, Clock,
                                                             DefragMetrics]:
    state = ClusterState()
    load_cluster(state, objects)
    cluster = FakeCluster(objects, state)
    clock, recorder = Clock(NOW), Recorder()
    metrics = DefragMetrics(CollectorRegistry())
    defragmenter = Defragmenter(state, cluster, recorder, metrics, now=clock.now, sleep=clock.sleep, **kw)
    cluster.defragmenter = defragmenter
    return defragmenter, cluster, recorder, clock, metrics


class Lease:
    is_leader = True


@contextlib.asynccontextmanager
async def running(defragmenter: Defragmenter, leader: Leader | None = None) -> AsyncIterator[Runner]:
    """The defragmenter's two controllers on a runner, as ``serve`` runs them."""
    runner = Runner(leader)
    tasks = [asyncio.create_task(runner.run(c)) for c in (defragmenter.looker, defragmenter.mover)]
    try:
        yield runner
    finally:
        await cancel_and_wait(tasks)


async def until(check: Callable[[], object], seconds: float = 5.0) -> None:
    async with asyncio.timeout(seconds):
        while not check():
            await asyncio.sleep(0.001)


def sample(metrics: DefragMetrics, counter: str, **labels: str) -> float:
    for metric in getattr(metrics, counter).collect():
        for s in metric.samples:
            if s.name.endswith("_total") and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


async def test_a_run_moves_the_light_nodes_workers_one_at_a_time_onto_the_fullest_node():
    defragmenter, cluster, recorder, _, metrics = setup(four_nodes())
    pool_obj = cluster.pools()[0]
    result = await defragmenter.run_pool(pool_obj, parse_config(pool_obj), Trigger.MANUAL)
    assert cluster.evictions == ["ml/light-a-w0", "ml/light-b-w0"]
    assert [(m.pod, m.source, m.target) for m in result.moved] == [
        ("ml/light-a-w0", "light-a", "heavy-b"), ("ml/light-b-w0", "light-b", "heavy-b")]
    assert result.emptied == ["light-a", "light-b"] and result.stopped is None
    placed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in cluster.worker_pods()}
    assert placed["light-a-w0-r"] == "heavy-b" and placed["light-b-w0-r"] == "heavy-b"
    assert recorder.reasons() == ["DefragStarted", "DefragPodEvicted", "DefragPodEvicted", "DefragFinished"]
    assert recorder.events[1][1] == "evicted pod ml/light-a-w0 from node light-a (planned onto heavy-b)"
    assert recorder.events[-1][1].startswith(
        "defragmentation finished: 2 nodes emptied (light-a, light-b), 2 pods moved in ")
    assert sample(metrics, "evictions", pool="p") == 2
    assert sample(metrics, "nodes_emptied", pool="p") == 2
    assert sample(metrics, "runs", pool="p", trigger="manual", outcome="completed") == 1
    assert defragmenter._fences == {}  # the fence is lifted after the run


async def test_skips_are_reported_as_events_and_metrics():
    objects = [o for o in four_nodes() if o["metadata"]["name"] != "light-a-w0-pdb"]
    defragmenter, cluster, recorder, _, metrics = setup(objects)
    pool_obj = cluster.pools()[0]
    result = await defragmenter.run_pool(pool_obj, parse_config(pool_obj), Trigger.SCHEDULE)
    assert cluster.evictions == ["ml/light-b-w0"]
    assert ("DefragSkipMissingPDB", "no PodDisruptionBudget covers pod ml/light-a-w0 on node light-a",
            "Warning") in recorder.events
    assert result.emptied == ["light-b"]
    assert sample(metrics, "skips", pool="p", reason="missing-pdb") == 1


async def test_a_refusing_pdb_is_retried_until_max_duration_and_the_run_stops():
    defragmenter, cluster, recorder, clock, metrics = setup(four_nodes(maxDuration="90s"))
    cluster.blocked = {"light-a-w0"}
    pool_obj = cluster.pools()[0]
    result = await defragmenter.run_pool(pool_obj, parse_config(pool_obj), Trigger.MANUAL)
    assert cluster.evictions == []
    assert result.stopped == "maxDuration 0:01:30 reached"
    assert clock.value - NOW == dt.timedelta(seconds=90)  # it waited out the window, not longer
    assert recorder.reasons() == ["DefragStarted", "DefragFinished"]
    assert "0 pods moved" in recorder.events[-1][1] and "stopped early: maxDuration" in recorder.events[-1][1]
    assert sample(metrics, "runs", pool="p", trigger="manual", outcome="stopped") == 1


async def test_a_replacement_that_never_binds_stops_the_run_at_the_bound():
    defragmenter, cluster, _, clock, _ = setup(four_nodes(), replacement_timeout=60)
    cluster.replace = False
    pool_obj = cluster.pools()[0]
    result = await defragmenter.run_pool(pool_obj, parse_config(pool_obj), Trigger.MANUAL)
    assert cluster.evictions == ["ml/light-a-w0"]  # one at a time: the second waits for the first
    assert result.stopped == "waited too long for pod ml/light-a-w0 to get a bound replacement"
    assert dt.timedelta(seconds=60) <= clock.value - NOW < dt.timedelta(seconds=62)


async def test_the_run_stops_at_max_duration_between_moves():
    defragmenter, cluster, _, clock, _ = setup(four_nodes(maxDuration="1s"), replacement_timeout=60)
    cluster.replace = False  # waiting for the first replacement runs into the deadline
    pool_obj = cluster.pools()[0]
    config = parse_config(pool_obj)
    # workers must be older than maxDuration: they are (created long ago)
    result = await defragmenter.run_pool(pool_obj, config, Trigger.MANUAL)
    assert cluster.evictions == ["ml/light-a-w0"]
    assert result.stopped is not None
    assert clock.value - NOW <= dt.timedelta(seconds=2)


def test_manual_trigger_needs_a_fresh_timestamp():
    fresh = {"metadata": {"annotations": {MANUAL_DEFRAG: "2026-06-01T11:59:55Z"}}}
    stale = {"metadata": {"annotations": {MANUAL_DEFRAG: "2026-06-01T11:00:00Z"}}}
    junk = {"metadata": {"annotations": {MANUAL_DEFRAG: "now please"}}}
    assert manual_trigger(fresh, NOW) == "2026-06-01T11:59:55Z"
    assert manual_trigger(stale, NOW) is None
    assert manual_trigger(junk, NOW) is None
    assert manual_trigger({"metadata": {}}, NOW) is None


def test_due_runs_a_manual_trigger_once_and_the_schedule_at_its_minute():
    objects = four_nodes(schedule="0 3 * * *", timezone="Asia/Shanghai")
    objects[0]["metadata"]["annotations"] = {MANUAL_DEFRAG: "2026-06-01T11:59:59Z"}
    defragmenter, cluster, _, clock, _ = setup(objects)
    assert [t for _, _, t in defragmenter.due(cluster.pools())] == [Trigger.MANUAL]
    clock.value += dt.timedelta(seconds=5)
    assert defragmenter.due(cluster.pools()) == []  # same annotation value: once
    # 03:00 in Shanghai is 19:00 UTC: look every 5 seconds from 18:58 to 19:02
    clock.value = NOW.replace(hour=18, minute=58)
    defragmenter.due(cluster.pools())
    fired = []
    for _ in range(48):
        clock.value += dt.timedelta(seconds=5)
        fired += [(clock.value.strftime("%H:%M:%S"), t) for _, _, t in defragmenter.due(cluster.pools())]
    assert fired == [("19:00:00", Trigger.SCHEDULE)]


def test_due_reports_a_bad_setting_once():
    defragmenter, cluster, recorder, _, _ = setup([pool(timezone="Nowhere/Special")])
    assert defragmenter.due(cluster.pools()) == []
    assert defragmenter.due(cluster.pools()) == []
    assert [(r, t) for r, _, t in recorder.events] == [("DefragConfigInvalid", "Warning")]


def test_disabled_pools_run_only_on_a_manual_trigger():
    objects = four_nodes(enabled=False, schedule="* * * * *")
    defragmenter, cluster, _, clock, _ = setup(objects)
    defragmenter.due(cluster.pools())
    clock.value += dt.timedelta(minutes=5)
    assert defragmenter.due(cluster.pools()) == []


def test_fence_keeps_pool_pods_off_fenced_nodes_while_another_fits():
    defragmenter, *_ = setup(four_nodes())
    defragmenter._fences["p"] = frozenset({"light-a", "light-b"})
    pod = {"metadata": {"annotations": {"tensor-fusion.ai/gpupool": "p"}}}
    outcome = FilterOutcome(["heavy-a", "light-a", "light-b"], {}, {}, None, False)
    narrowed = defragmenter.narrow(pod, outcome)
    assert narrowed.fits == ["heavy-a"]
    assert narrowed.failed == {"light-a": "node is being emptied by defragmentation of pool p",
                               "light-b": "node is being emptied by defragmentation of pool p"}
    # only fenced nodes fit: the pod is not kept waiting for the run to end
    only_fenced = FilterOutcome(["light-a"], {}, {}, None, False)
    assert defragmenter.narrow(pod, only_fenced) is only_fenced
    other_pool = {"metadata": {"annotations": {"tensor-fusion.ai/gpupool": "q"}}}
    assert defragmenter.narrow(other_pool, outcome) is outcome


async def test_many_candidates_are_read_with_one_pod_list(monkeypatch):
    import extender.controllers.defrag.controller as controller

    monkeypatch.setattr(controller, "PER_NODE_LISTS", 0)
    defragmenter, cluster, _, _, _ = setup(four_nodes())
    calls: list[str] = []
    original_all, original_on = cluster.all_pods, cluster.pods_on

    async def all_pods() -> list[dict[str, Any]]:
        calls.append("all")
        return await original_all()

    async def pods_on(node: str) -> list[dict[str, Any]]:
        calls.append(node)
        return await original_on(node)

    cluster.all_pods, cluster.pods_on = all_pods, pods_on  # type: ignore[method-assign]
    pool_obj = cluster.pools()[0]
    result = await defragmenter.run_pool(pool_obj, parse_config(pool_obj), Trigger.MANUAL)
    assert result.emptied == ["light-a", "light-b"]
    assert set(calls) == {"all"}


async def test_a_node_whose_room_the_previous_node_took_is_reported_no_room():
    from tests.unit.fixtures.defrag import room_for_one

    objects = room_for_one()
    defragmenter, cluster, recorder, _, metrics = setup(objects)
    pool_obj = cluster.pools()[0]
    result = await defragmenter.run_pool(pool_obj, parse_config(pool_obj), Trigger.MANUAL)
    assert cluster.evictions == ["ml/light-a-w0"] and result.emptied == ["light-a"]
    assert ("DefragSkipNode", "pod ml/light-b-w0 fits on no node of the pool that is at least as full "
            "(no-room)", "Normal") in recorder.events
    assert "2 candidate nodes, 2 to empty if their workers fit elsewhere" in recorder.events[0][1]
    assert sample(metrics, "skips", pool="p", reason="no-room") == 1


async def test_tick_runs_each_due_pool_as_its_own_task(caplog: pytest.LogCaptureFixture) -> None:
    from extender.common.labels import MANUAL_DEFRAG as MANUAL

    objects = four_nodes()
    other = pool("q")
    stamp = "2026-06-01T11:59:59Z"
    objects[0]["metadata"]["annotations"] = {MANUAL: stamp}
    other["metadata"]["annotations"] = {MANUAL: stamp}
    defragmenter, cluster, recorder, _, _ = setup([*objects, other])
    gate = asyncio.Event()  # the runs wait here, so both are seen in progress at once
    original_pdbs = cluster.pdbs

    async def pdbs() -> list[dict[str, Any]]:
        await gate.wait()
        return await original_pdbs()

    cluster.pdbs = pdbs  # type: ignore[method-assign]
    await defragmenter.reconcile(NOW)
    assert list(defragmenter.queue) == ["p", "q"]
    async with running(defragmenter):
        await until(lambda: len(defragmenter.runs) == 2)
        assert sorted(defragmenter.runs) == ["p", "q"]
        await defragmenter.reconcile(NOW)  # nothing new is due, and each pool has one run at a time
        # a new trigger for a pool whose run is in progress is said, not queued
        objects[0]["metadata"]["annotations"] = {MANUAL: "2026-06-01T12:00:00Z"}
        with caplog.at_level(logging.INFO, logger="extender.controllers.defrag.controller"):
            await defragmenter.reconcile(NOW)
        assert list(defragmenter.queue) == []
        assert [r.pool for r in caplog.records if r.message == "defrag run already in progress"] == ["p"]
        gate.set()
        await until(lambda: not defragmenter.runs)
    assert defragmenter.runs == {}
    assert cluster.evictions == ["ml/light-a-w0", "ml/light-b-w0"]
    assert recorder.reasons().count("DefragFinished") == 2


async def test_losing_the_lease_cancels_a_run_and_lifts_its_fence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_module, "LEADER_POLL_SECONDS", 0.01)
    lease = Lease()
    objects = four_nodes()
    objects[0]["metadata"]["annotations"] = {MANUAL_DEFRAG: "2026-06-01T11:59:59Z"}
    defragmenter, cluster, recorder, _, _ = setup(objects)
    cluster.blocked = {"light-a-w0"}  # the run waits on the PDB
    async with running(defragmenter, lease):
        await until(lambda: defragmenter._fences)
        lease.is_leader = False
        await until(lambda: not defragmenter.runs)
        await asyncio.sleep(0.01)
        assert defragmenter.runs == {} and defragmenter._fences == {}
    assert "DefragFinished" not in recorder.reasons()  # cancelled, not finished


async def test_the_look_at_the_pools_is_leader_only_and_a_demotion_forgets_the_last_look(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_module, "LEADER_POLL_SECONDS", 0.01)
    lease = Lease()
    lease.is_leader = False
    defragmenter, _, _, _, _ = setup(four_nodes(), tick_seconds=0.01)
    assert defragmenter.looker.leader_only and defragmenter.looker.interval == 0.01
    assert defragmenter.mover.leader_only and defragmenter.mover.workers == 0
    assert not defragmenter.mover.retry_errors
    async with running(defragmenter, lease):
        await asyncio.sleep(0.05)
        assert defragmenter._last_look is None  # a follower does not look
        lease.is_leader = True
        await until(lambda: defragmenter._last_look is not None)
        lease.is_leader = False  # a new leader does not catch up on this one's schedule
        await until(lambda: defragmenter._last_look is None)


async def test_a_run_that_fails_says_so() -> None:
    objects = four_nodes()
    objects[0]["metadata"]["annotations"] = {MANUAL_DEFRAG: "2026-06-01T11:59:59Z"}
    defragmenter, cluster, recorder, _, metrics = setup(objects)

    async def broken() -> list[dict[str, Any]]:
        raise RuntimeError("API server unreachable")

    cluster.pdbs = broken  # type: ignore[method-assign]
    async with running(defragmenter):
        await until(lambda: recorder.events)
        await until(lambda: not defragmenter.runs)
    assert recorder.events == [
        ("DefragFailed", "defragmentation run failed: API server unreachable", "Warning")]
    assert sample(metrics, "runs", pool="p", trigger="manual", outcome="failed") == 1


@pytest.mark.parametrize("bad", [
    {"maxDuration": "99999999999999h"},  # once an OverflowError at the first pool in name order
    {"nodeCompaction": "10m"},
    {"spec": [1]},
])
def test_a_bad_pool_first_in_name_order_does_not_hide_the_later_pools_triggers(bad: dict[str, Any]):
    first = pool("a-bad", maxDuration=bad.get("maxDuration", "2h"))
    if "nodeCompaction" in bad:
        first["spec"]["nodeManagerConfig"]["nodeCompaction"] = bad["nodeCompaction"]
    if "spec" in bad:
        first["spec"] = bad["spec"]
    later = pool("z-good")
    later["metadata"]["annotations"] = {MANUAL_DEFRAG: "2026-06-01T11:59:59Z"}
    defragmenter, cluster, recorder, _, _ = setup([first, later])
    assert [(p["metadata"]["name"], t) for p, _, t in defragmenter.due(cluster.pools())] == [
        ("z-good", Trigger.MANUAL)]
    defragmenter.due(cluster.pools())
    assert [(r, t) for r, _, t in recorder.events] == [("DefragConfigInvalid", "Warning")]

"""GPU preemption the scheduler cannot do itself: victims evicted once, with events; PDBs respected."""

from __future__ import annotations

from typing import Any

from kubernetes.client import ApiException

from extender.controllers.preemptor import Preemptor
from extender.scheduling.pdb import PdbGuard, budgets_from, violations
from extender.scheduling.state import ClusterState, FilterOutcome, Kind
from tests.unit.fixtures.fakes import POOL, Events, FakeApi, Pods, gpu, pod


def prioritised(name: str, uid: str, priority: int, **kw: Any) -> dict[str, Any]:
    p = pod(name, uid, **kw)
    p["spec"]["priority"] = priority
    return p


def world() -> tuple[ClusterState, FakeApi, Events, Preemptor]:
    state = ClusterState()
    state.apply(Kind.POOL, "ADDED", {"metadata": {"name": POOL}, "spec": {}})
    state.apply(Kind.GPU, "ADDED", gpu("g1", "n1"))
    state.apply(Kind.POD, "ADDED", prioritised("low", "u-low", 1, tflops="90", node="n1", gpu_ids="g1",
                                               phase="Running"))
    api, events = FakeApi(Pods()), Events()
    return state, api, events, Preemptor(state, api, events)


async def test_deletes_the_victims_once_with_events_on_both_sides() -> None:
    _, api, events, preemptor = world()
    vip = prioritised("vip", "u-vip", 1000, tflops="50")
    assert await preemptor.preempt_for(vip) == ["ml/low"]
    assert api.calls == [("evict", ("low", "u-low"))]
    assert ("vip", "PreemptingGPUPods") in [(e[0], e[1]) for e in events.recorded]
    assert ("low", "Preempted") in [(e[0], e[1]) for e in events.recorded]
    assert await preemptor.preempt_for(vip) == []  # the scheduler's retry does not delete again
    assert len(api.calls) == 1


async def test_nothing_lower_priority_means_nothing_deleted() -> None:
    _, api, _, preemptor = world()
    assert await preemptor.preempt_for(prioritised("peer", "u-p", 1, tflops="50")) == []
    assert api.calls == []


async def test_a_failed_delete_may_be_retried() -> None:
    _, api, _, preemptor = world()
    api.fail["evict"] = ApiException(status=500, reason="boom")
    vip = prioritised("vip", "u-vip", 1000, tflops="50")
    assert await preemptor.preempt_for(vip) == []
    del api.fail["evict"]
    assert await preemptor.preempt_for(vip) == ["ml/low"]


def test_only_pods_that_fit_nowhere_but_could_after_eviction_are_queued() -> None:
    _, _, _, preemptor = world()
    vip = prioritised("vip", "u-vip", 1000)
    preemptor.after_filter(vip, FilterOutcome(["n1"], {}, {}, None, False))
    preemptor.after_filter(vip, FilterOutcome([], {}, {"n1": "no GPUs"}, None, False))
    never = prioritised("never", "u-n", 1000)
    never["spec"]["preemptionPolicy"] = "Never"
    preemptor.after_filter(never, FilterOutcome([], {"n1": "busy"}, {}, None, True))
    assert not preemptor.queue
    preemptor.after_filter(vip, FilterOutcome([], {"n1": "busy"}, {}, None, True))
    assert list(preemptor.queue) == ["ml/vip"]


async def test_no_further_victims_while_the_first_ones_are_still_terminating() -> None:
    # Three pods of 30 on a 100 TFLOPS GPU; vip needs 50: two victims. Until both are gone (a terminating
    # pod keeps its share), the scheduler's retries must not make the preemptor pick the third pod too.
    state = ClusterState()
    state.apply(Kind.POOL, "ADDED", {"metadata": {"name": POOL}, "spec": {}})
    state.apply(Kind.GPU, "ADDED", gpu("g1", "n1"))

    def victim(name: str) -> dict[str, Any]:
        return prioritised(name, f"u-{name}", 1, tflops="30", node="n1", gpu_ids="g1", phase="Running")

    for name in ("a", "b", "c"):
        state.apply(Kind.POD, "ADDED", victim(name))
    api, events = FakeApi(Pods()), Events()
    preemptor = Preemptor(state, api, events)
    vip = prioritised("vip", "u-vip", 1000, tflops="50")
    assert await preemptor.preempt_for(vip) == ["ml/a", "ml/b"]
    state.apply(Kind.POD, "DELETED", victim("a"))
    terminating = victim("b")
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    state.apply(Kind.POD, "MODIFIED", terminating)
    assert await preemptor.preempt_for(vip) == []  # a retry while "b" terminates
    assert preemptor.hold_back(vip) == "waiting for preempted GPU pods ml/b to terminate"
    state.apply(Kind.POD, "DELETED", terminating)
    assert await preemptor.preempt_for(vip) == []  # now it fits: nothing more to delete
    assert preemptor.hold_back(vip) is None
    assert api.calls == [("evict", ("a", "u-a")), ("evict", ("b", "u-b"))]


async def test_a_pod_placed_meanwhile_preempts_nobody() -> None:
    # A filter call queued the pod before its victims were gone; by the time the queue gets to it, the
    # scheduler has placed it. Its own share must not make the preemptor look for more victims.
    state, api, _, preemptor = world()
    state.apply(Kind.POD, "DELETED", prioritised("low", "u-low", 1, tflops="90", node="n1", gpu_ids="g1",
                                                 phase="Running"))
    state.apply(Kind.POD, "ADDED", prioritised("other", "u-other", 1, tflops="40", node="n1", gpu_ids="g1",
                                               phase="Running"))
    state.apply(Kind.POD, "ADDED", prioritised("vip", "u-vip", 1000, tflops="50", node="n1", gpu_ids="g1",
                                               phase="Running"))
    assert await preemptor.preempt_for(prioritised("vip", "u-vip", 1000, tflops="50")) == []
    assert api.calls == []


# --- PodDisruptionBudgets --------------------------------------------------------------------------------

class Cache:
    def __init__(self, *objects: dict[str, Any]) -> None:
        self.objects = list(objects)

    def list(self) -> list[dict[str, Any]]:
        return self.objects

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return next((o for o in self.objects if o["metadata"]["name"] == name
                     and o["metadata"].get("namespace") == namespace), None)


def budget(name: str, app: str, allowed: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml"},
            "spec": {"selector": {"matchLabels": {"app": app}}}, "status": {"disruptionsAllowed": allowed}}


def two_victims_world(*budgets: dict[str, Any]) -> tuple[ClusterState, FakeApi, Events, Preemptor, PdbGuard]:
    """One GPU holding two 45-TFLOPS pods of priority 1: ``guarded`` (app=db) and ``free`` (app=web)."""
    state = ClusterState()
    state.apply(Kind.POOL, "ADDED", {"metadata": {"name": POOL}, "spec": {}})
    state.apply(Kind.GPU, "ADDED", gpu("g1", "n1"))
    pods = []
    for name, app in (("guarded", "db"), ("free", "web")):
        p = prioritised(name, f"u-{name}", 1, tflops="45", node="n1", gpu_ids="g1", phase="Running")
        p["metadata"]["labels"]["app"] = app
        state.apply(Kind.POD, "ADDED", p)
        pods.append(p)
    guard = PdbGuard(Cache(*pods), Cache(*budgets))
    api, events = FakeApi(Pods()), Events()
    return state, api, events, Preemptor(state, api, events, pdb=guard), guard


async def test_a_victim_set_that_breaks_no_budget_is_preferred() -> None:
    _, _, _, preemptor, guard = two_victims_world(budget("db", "db", 0))
    # either pod alone makes room for 50; by name "free" < "guarded", but that is not why it is chosen
    assert await preemptor.preempt_for(prioritised("vip", "u-vip", 1000, tflops="50")) == ["ml/free"]
    assert guard.violations(["ml/free"]) == 0 and guard.violations(["ml/guarded"]) == 1
    _, _, _, preemptor, _ = two_victims_world(budget("web", "web", 0))
    assert await preemptor.preempt_for(prioritised("vip", "u-vip", 1000, tflops="50")) == ["ml/guarded"]


async def test_an_unavoidable_violation_is_reported_and_left_to_the_eviction_api() -> None:
    state, api, events, preemptor, guard = two_victims_world(budget("all-db", "db", 0),
                                                             budget("all-web", "web", 0))
    node, victims = state.find_preemption(prioritised("vip", "u-vip", 1000, tflops="90"), guard) or ("", [])
    assert node == "n1" and guard.violations([f"ml/{v.name}" for v in victims]) == 2
    api.fail["evict"] = ApiException(status=429, reason="Too Many Requests")  # the API server enforces it
    assert await preemptor.preempt_for(prioritised("vip", "u-vip", 1000, tflops="90")) == []
    assert ("vip", "PreemptionBlockedByPDB") in [(e[0], e[1]) for e in events.recorded]
    del api.fail["evict"]  # the budget allows it later: a retry evicts
    assert sorted(await preemptor.preempt_for(prioritised("vip", "u-vip", 1000, tflops="90"))) == [
        "ml/free", "ml/guarded"]


def test_violations_count_like_kube_scheduler() -> None:
    budgets = budgets_from([budget("db", "db", 1), {**budget("other-ns", "db", 0),
                                                     "metadata": {"name": "x", "namespace": "other"}}])
    db = ("ml", {"app": "db"})
    assert violations([db], budgets) == 0
    assert violations([db, db, db], budgets) == 2  # the first uses up the one disruption allowed
    assert violations([("ml", {"app": "web"})], budgets) == 0
    fresh = {"metadata": {"name": "n", "namespace": "ml"}, "spec": {"selector": {}}}  # no status yet
    assert violations([("ml", {"app": "db"})], budgets_from([fresh])) == 1

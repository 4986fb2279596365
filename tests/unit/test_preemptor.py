"""GPU preemption the scheduler cannot do itself: victims deleted once, with events."""

from __future__ import annotations

from typing import Any

from extender_fakes import POOL, Events, FakeApi, Pods, gpu, pod
from kubernetes.client import ApiException

from extender.preemptor import Preemptor
from extender.state import ClusterState, FilterOutcome, Kind


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
    assert api.calls == [("delete", ("low", "u-low"))]
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
    api.fail["delete"] = ApiException(status=500, reason="boom")
    vip = prioritised("vip", "u-vip", 1000, tflops="50")
    assert await preemptor.preempt_for(vip) == []
    del api.fail["delete"]
    assert await preemptor.preempt_for(vip) == ["ml/low"]


def test_only_pods_that_fit_nowhere_but_could_after_eviction_are_queued() -> None:
    _, _, _, preemptor = world()
    vip = prioritised("vip", "u-vip", 1000)
    preemptor.consider(vip, FilterOutcome(["n1"], {}, {}, None, False))
    preemptor.consider(vip, FilterOutcome([], {}, {"n1": "no GPUs"}, None, False))
    never = prioritised("never", "u-n", 1000)
    never["spec"]["preemptionPolicy"] = "Never"
    preemptor.consider(never, FilterOutcome([], {"n1": "busy"}, {}, None, True))
    assert not preemptor._pending
    preemptor.consider(vip, FilterOutcome([], {"n1": "busy"}, {}, None, True))
    assert list(preemptor._pending) == ["ml/vip"]


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
    assert preemptor.filter_gate(vip) == "waiting for preempted GPU pods ml/b to terminate"
    state.apply(Kind.POD, "DELETED", terminating)
    assert await preemptor.preempt_for(vip) == []  # now it fits: nothing more to delete
    assert preemptor.filter_gate(vip) is None
    assert api.calls == [("delete", ("a", "u-a")), ("delete", ("b", "u-b"))]


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

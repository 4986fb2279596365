"""The gang keeper: a gang is placed whole or holds nothing, members bind where it chose, timeouts release."""

from __future__ import annotations

from typing import Any

import pytest

from extender.controllers.gang.controller import GangKeeper, Phase
from extender.gang.placement import admit_by_quota
from extender.quota.book import QuotaBook
from extender.scheduling.state import ClusterState, Kind
from tests.unit.fixtures.scheduling import bound, gpu, make, pod

NODES = ["n1", "n2"]


def cluster(gpus_per_node: int = 2) -> ClusterState:
    return make(*(gpu(f"{n}-g{i}", n, index=i) for n in NODES for i in range(gpus_per_node)))


def member(name: str, gang: str = "train", *, required: int = 4, desired: int = 4, timeout: str = "",
           vram: str = "40Gi", **kw: Any) -> dict[str, Any]:
    annotations = {"tensor-fusion.ai/gang-group-key": f"ml/{gang}",
                   "tensor-fusion.ai/gang-required-members": str(required),
                   "tensor-fusion.ai/gang-desired-members": str(desired)}
    if timeout:
        annotations["tensor-fusion.ai/gang-timeout"] = timeout
    return pod(name, "10", vram, annotations=annotations, **kw)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def keeper(state: ClusterState, clock: Clock | None = None, **kw: Any) -> GangKeeper:
    k = GangKeeper(state, clock=clock or Clock(), **kw)
    return k


def arrive(k: GangKeeper, state: ClusterState, p: dict[str, Any]) -> None:
    state.apply(Kind.POD, "ADDED", p)
    k.observe("ADDED", p)


def held(state: ClusterState) -> dict[str, int]:
    return {gang: len(holds) for gang, holds in state.gang_holds().items()}


def test_members_wait_for_the_quorum_then_the_gang_is_placed_whole() -> None:
    state = cluster()
    k = keeper(state)
    pods = [member(f"w{i}") for i in range(4)]
    for p in pods[:3]:
        arrive(k, state, p)
        outcome = k.before_filter(p, NODES)
        assert outcome is not None and outcome.fits == []
        assert f"waiting for {3 - pods.index(p)} of 4 members" in outcome.unresolvable["n1"]
    assert held(state) == {}
    arrive(k, state, pods[3])
    outcome = k.before_filter(pods[3], NODES)
    assert outcome is not None and len(outcome.fits) == 1
    assert held(state) == {"ml/train": 4}
    nodes = {}
    for p in pods:
        answer = k.before_filter(p, NODES)
        assert answer is not None and len(answer.fits) == 1
        nodes[p["metadata"]["name"]] = answer.fits[0]
    assert sorted(nodes.values()) == ["n1", "n1", "n2", "n2"]
    # a pod outside the gang cannot take the held GPUs
    assert state.filter(pod("other", "10", "40Gi"), NODES).fits == []


def test_waiting_names_how_many_members_are_missing() -> None:
    state = cluster()
    k = keeper(state)
    p = member("w0")
    arrive(k, state, p)
    outcome = k.before_filter(p, NODES)
    assert outcome is not None
    assert "gang ml/train: waiting for 3 of 4 members" in outcome.unresolvable["n1"]
    assert k.hold_back(p) is not None  # retried with backoff, not parked


def test_a_bind_takes_exactly_the_held_gpus() -> None:
    state = cluster()
    k = keeper(state)
    pods = [member(f"w{i}") for i in range(4)]
    for p in pods:
        arrive(k, state, p)
        k.before_filter(p, NODES)
    holds = {a.uid: a for a in state.gang_holds()["ml/train"]}
    reservation = state.reserve(pods[0], holds["uid-w0"].node)
    assert reservation.gpu_ids == holds["uid-w0"].gpu_ids
    state.release(reservation)  # a failed bind: the GPUs go back to the gang, not the pool
    assert len(state.gang_holds()["ml/train"]) == 4
    wrong = "n2" if holds["uid-w1"].node == "n1" else "n1"
    with pytest.raises(Exception, match="holds GPUs"):
        state.reserve(pods[1], wrong)


@pytest.mark.parametrize("order", ["interleaved", "a-first", "b-first"])
def test_two_gangs_racing_for_room_for_one_never_split(order: str) -> None:
    state = cluster()  # 4 GPUs, each member takes one whole (40Gi)
    k = keeper(state)
    a = [member(f"a{i}", "a") for i in range(4)]
    b = [member(f"b{i}", "b") for i in range(4)]
    sequence = {"interleaved": [p for pair in zip(a, b, strict=True) for p in pair],
                "a-first": a + b, "b-first": b + a}[order]
    for p in sequence:
        arrive(k, state, p)
        k.before_filter(p, NODES)
    for p in sequence:  # the scheduler's retries
        k.before_filter(p, NODES)
    assert list(held(state).values()) == [4]
    loser = "ml/b" if "ml/a" in held(state) else "ml/a"
    assert k.gangs[loser].phase is Phase.WAITING
    assert "do not fit together" in k.gangs[loser].reason


def test_a_gang_that_does_not_fit_holds_nothing() -> None:
    state = make(*(gpu(f"n1-g{i}", "n1", index=i) for i in range(3)))
    k = keeper(state)
    pods = [member(f"w{i}") for i in range(4)]
    for p in pods:
        arrive(k, state, p)
        outcome = k.before_filter(p, ["n1"])
        assert outcome is not None and outcome.fits == []
    assert held(state) == {}
    assert state.filter(pod("other", "10", "40Gi"), ["n1"]).fits == ["n1"]


def test_the_timeout_releases_everything_and_says_so() -> None:
    state = cluster()
    clock = Clock()
    k = keeper(state, clock, reserve_seconds=1e9)
    pods = [member(f"w{i}", timeout="30s") for i in range(4)]
    for p in pods:
        arrive(k, state, p)
        k.before_filter(p, NODES)
    assert held(state) == {"ml/train": 4}
    clock.now += 31
    k.sweep()
    assert held(state) == {}
    assert k.gangs["ml/train"].phase is Phase.TIMED_OUT
    outcome = k.before_filter(pods[0], NODES)
    assert outcome is not None and outcome.fits == [] and "timed out after 30s" in outcome.unresolvable["n1"]


def test_holds_not_bound_in_time_are_released_whole_and_placed_again() -> None:
    state = cluster()
    clock = Clock()
    k = keeper(state, clock, reserve_seconds=60)
    pods = [member(f"w{i}") for i in range(4)]
    for p in pods:
        arrive(k, state, p)
        k.before_filter(p, NODES)
    clock.now += 61
    k.sweep()
    assert held(state) == {}
    assert k.before_filter(pods[0], NODES).fits  # type: ignore[union-attr]
    assert held(state) == {"ml/train": 4}


def test_a_deleted_member_releases_the_gang() -> None:
    state = cluster()
    k = keeper(state)
    pods = [member(f"w{i}") for i in range(4)]
    for p in pods:
        arrive(k, state, p)
        k.before_filter(p, NODES)
    state.apply(Kind.POD, "DELETED", pods[2])
    k.observe("DELETED", pods[2])
    assert held(state) == {}


def test_after_a_restart_a_half_bound_gang_is_finished() -> None:
    state = cluster()
    first = [member(f"w{i}", node="n1", gpu_ids=f"n1-g{i}", phase="Running") for i in range(2)]
    rest = [member(f"w{i}") for i in range(2, 4)]
    k = keeper(state)
    for p in first + rest:
        arrive(k, state, p)
    outcome = k.before_filter(rest[0], NODES)
    assert outcome is not None and outcome.fits == ["n2"]
    assert held(state) == {"ml/train": 2}


def test_once_the_quorum_runs_a_restarted_member_places_alone() -> None:
    state = cluster()
    running = [member(f"w{i}", required=2, node="n1", gpu_ids=f"n1-g{i}", phase="Running")
               for i in range(2)]
    k = keeper(state)
    for p in running:
        arrive(k, state, p)
    late = member("w2", required=2)
    arrive(k, state, late)
    assert k.before_filter(late, NODES) is None


def test_a_native_pod_group_is_a_gang_of_its_min_count() -> None:
    state = cluster()
    group = {"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
             "metadata": {"name": "job", "namespace": "ml"},
             "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}}
    groups = {("ml", "job"): group}
    k = keeper(state, pod_groups=lambda ns, name: groups.get((ns, name)))
    pods = [pod(f"g{i}", "10", "40Gi") for i in range(2)]
    for p in pods:
        p["spec"]["schedulingGroup"] = {"podGroupName": "job"}
    arrive(k, state, pods[0])
    assert "waiting for 1 of 2 members" in k.before_filter(pods[0], NODES).unresolvable["n1"]  # type: ignore
    arrive(k, state, pods[1])
    assert k.before_filter(pods[1], NODES).fits  # type: ignore[union-attr]
    assert held(state) == {"ml/podgroup:job": 2}
    orphan = pod("o", "10", "4Gi")
    orphan["spec"]["schedulingGroup"] = {"podGroupName": "missing"}
    arrive(k, state, orphan)
    assert "PodGroup ml/missing not found" in k.before_filter(orphan, NODES).unresolvable["n1"]  # type: ignore


def test_pods_outside_gangs_are_not_answered() -> None:
    state = cluster()
    assert keeper(state).before_filter(pod("solo"), NODES) is None


def test_the_admit_gang_seam_can_refuse_the_whole_gang() -> None:
    state = cluster()
    seen: list[int] = []

    def admit(pods: Any) -> str | None:
        seen.append(len(pods))
        return "namespace ml: over its GPU quota"

    k = keeper(state, admit_gang=admit)
    pods = [member(f"w{i}") for i in range(4)]
    for p in pods:
        arrive(k, state, p)
        outcome = k.before_filter(p, NODES)
    assert seen == [4] and held(state) == {}
    assert outcome is not None and "over its GPU quota" in outcome.unresolvable["n1"]


async def test_the_workloads_status_gang_is_written_when_it_changes() -> None:
    import datetime as dt

    from extender.controllers.gang.status import StatusWriter

    state = cluster()
    k = keeper(state)
    written: list[tuple[str, str, dict[str, Any]]] = []

    async def patch(namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        written.append((namespace, name, status))
        return {"kind": "TensorFusionWorkload", "metadata": {"name": name, "namespace": namespace}}

    events: list[tuple[str, str]] = []
    writer = StatusWriter(patch, lambda obj, reason, message, type_: events.append((reason, type_)))
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    pods = [member(f"w{i}") for i in range(4)]
    for p in pods[:2]:
        arrive(k, state, p)
        k.before_filter(p, NODES)
    await writer.write(k.gangs, now)
    await writer.write(k.gangs, now + dt.timedelta(seconds=2))  # nothing changed: nothing written
    assert len(written) == 1
    gang = written[0][2]["gang"]
    assert written[0][:2] == ("ml", "train")
    assert (gang["phase"], gang["desiredMembers"], gang["waitingMembers"], gang["scheduledMembers"]) == \
        ("Waiting", 4, 2, 0)
    assert "waiting for 2 of 4 members" in gang["message"]
    for p in pods[2:]:
        arrive(k, state, p)
        k.before_filter(p, NODES)
    await writer.write(k.gangs, now + dt.timedelta(seconds=4))
    assert written[-1][2]["gang"]["phase"] == "Scheduling"
    assert written[-1][2]["gang"]["lastTransitionTime"] == "2026-01-01T00:00:04Z"
    assert events == [("GangWaiting", "Normal"), ("GangScheduling", "Normal")]  # on the workload


def test_a_gang_left_half_bound_that_cannot_finish_is_released_whole() -> None:
    state = make(*(gpu(f"n1-g{i}", "n1", index=i) for i in range(2)))  # room for the bound half only
    clock = Clock()
    k = keeper(state, clock, reserve_seconds=60)
    first = [member(f"w{i}", node="n1", gpu_ids=f"n1-g{i}", phase="Running") for i in range(2)]
    rest = [member(f"w{i}") for i in range(2, 4)]
    for p in first + rest:
        arrive(k, state, p)
    outcome = k.before_filter(rest[0], ["n1"])
    assert outcome is not None and outcome.fits == []
    assert k.half_bound() == []  # not yet: the rest may still find room
    clock.now += 61
    released = k.half_bound()
    assert [(g.key, sorted(p["metadata"]["name"] for p in pods)) for g, pods in released] == \
        [("ml/train", ["w0", "w1"])]
    assert "released: 2 of 4 members were bound" in released[0][0].reason


def test_a_gang_binding_member_by_member_is_not_half_bound() -> None:
    state = cluster()
    clock = Clock()
    k = keeper(state, clock, reserve_seconds=60)
    pods = [member(f"w{i}") for i in range(4)]
    for p in pods:
        arrive(k, state, p)
        k.before_filter(p, NODES)
    node = state.gang_holds()["ml/train"][0].node
    first = next(p for p in pods if state.held_node(p) == node)
    reservation = state.reserve(first, node)
    bound_pod = {**first, "spec": {**first["spec"], "nodeName": node}, "status": {"phase": "Running"}}
    bound_pod["metadata"] = {**first["metadata"], "annotations": {
        **first["metadata"]["annotations"], "tensor-fusion.ai/gpu-ids": ",".join(reservation.gpu_ids)}}
    state.apply(Kind.POD, "MODIFIED", bound_pod)
    k.observe("MODIFIED", bound_pod)
    clock.now += 61
    assert k.half_bound() == []  # the others still hold their GPUs


def test_preemption_for_a_gang_evicts_only_when_the_whole_gang_then_fits() -> None:
    # four GPUs: two hold low-priority pods, two are free; a gang of three high-priority members
    low = [bound(f"low{i}", "n1", f"n1-g{i}", "10", "40Gi", priority=0) for i in range(2)]
    state = make(*(gpu(f"{n}-g{i}", n, index=i) for n in NODES for i in range(2)), *low)
    evicted: list[tuple[str, list[str]]] = []
    k = keeper(state, evict=lambda gang, victims: evicted.append((gang, [v.name for v in victims])))
    pods = [member(f"w{i}", required=3, desired=3, priority=100) for i in range(3)]
    for p in pods:
        arrive(k, state, p)
        outcome = k.before_filter(p, NODES)
    assert outcome is not None and outcome.fits == []
    assert evicted == [("ml/train", ["low0"])]  # one victim is enough for the third member
    reason = k.gangs["ml/train"].reason
    assert "evicting lower-priority GPU pods ml/low0 so that the whole gang fits" in reason
    k.before_filter(pods[0], NODES)  # the victim still holds its GPU: nothing evicted twice
    assert len(evicted) == 1


def test_no_pod_is_evicted_when_the_gang_would_still_not_fit() -> None:
    high = [bound(f"high{i}", "n1", f"n1-g{i}", "10", "40Gi", priority=1000) for i in range(2)]
    low = [bound("low", "n2", "n2-g0", "10", "40Gi", priority=0)]
    state = make(*(gpu(f"{n}-g{i}", n, index=i) for n in NODES for i in range(2)), *high, *low)
    evicted: list[Any] = []
    k = keeper(state, evict=lambda gang, victims: evicted.append(victims))
    pods = [member(f"w{i}", required=3, desired=3, priority=100) for i in range(3)]
    for p in pods:
        arrive(k, state, p)
        k.before_filter(p, NODES)
    assert evicted == []  # evicting low frees one GPU: two members still would not fit


def test_members_of_gangs_are_never_preempted_for_a_gang() -> None:
    # the bound half of a gang (lower priority) must not be evicted to make room for the rest of it
    state = make(*(gpu(f"n1-g{i}", "n1", index=i) for i in range(2)))
    evicted: list[Any] = []
    k = keeper(state, evict=lambda gang, victims: evicted.append(victims))
    first = [member(f"w{i}", node="n1", gpu_ids=f"n1-g{i}", phase="Running", priority=0) for i in range(2)]
    rest = [member(f"w{i}", priority=100) for i in range(2, 4)]
    for p in first + rest:
        arrive(k, state, p)
    k.before_filter(rest[0], ["n1"])
    assert evicted == []


@pytest.mark.parametrize(("total", "placed"), [("30", False), ("40", True)])
def test_a_namespace_quota_admits_the_whole_gang_or_none_of_it(total: str, placed: bool) -> None:
    """Four members of 10 TFLOPS each: a total of 30 holds the whole gang back, 40 lets all of it in."""
    state = cluster()
    quota = {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUResourceQuota",
             "metadata": {"name": "q", "namespace": "ml"},
             "spec": {"total": {"requests": {"tflops": total, "vram": "1Ti"}}}}
    state.quota_gate = QuotaBook(state, lambda: [quota])
    k = keeper(state, admit_gang=admit_by_quota(state))
    for p in [member(f"w{i}") for i in range(4)]:
        arrive(k, state, p)
        outcome = k.before_filter(p, NODES)
    assert held(state) == ({"ml/train": 4} if placed else {})
    assert outcome is not None
    if not placed:
        assert "ml" in outcome.unresolvable["n1"] and "30" in outcome.unresolvable["n1"]


def test_a_multi_gpu_members_bind_names_the_tier_of_its_held_gpus() -> None:
    """A gang member's bind reports its GPUs' topology tier as any multi-GPU bind does (the bind event and
    the placements metric read it); a one-GPU member has none."""
    state = cluster()
    k = keeper(state)
    pods = [member(f"w{i}", required=2, desired=2, vram="10Gi") for i in range(2)]
    for p in pods:
        p["metadata"]["annotations"]["tensor-fusion.ai/gpu-count"] = "2"
    for p in pods:
        arrive(k, state, p)
        k.before_filter(p, NODES)
    holds = {a.uid: a for a in state.gang_holds()["ml/train"]}
    reservation = state.reserve(pods[0], holds["uid-w0"].node)
    assert len(reservation.gpu_ids) == 2 and reservation.tier is not None

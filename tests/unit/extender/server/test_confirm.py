"""A reservation lives until its pod is confirmed: with the pod watch stalled, capacity is never handed out
twice, however long the watch stays behind.

The binder binds through the fake API (which stores the Binding, so reads see the pod bound); the "watch"
is stalled: the cluster state is not told about the bound pod. The grace before the first read is shortened
to a fraction of a second; the real one is 60 s.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes.client import ApiException

from extender.scheduling.state import ClusterState, Kind, PlacementError
from extender.server.binder import Binder
from extender.server.protocol import ExtenderBindingArgs
from tests.unit.fixtures.fakes import Events, FakeApi, Pods, eventually, gpu, pod

GRACE = 0.05


def world() -> tuple[ClusterState, Pods, FakeApi, Binder]:
    state = ClusterState()
    state.apply(Kind.POOL, "ADDED", {"metadata": {"name": "pool-a"}, "spec": {}})
    state.apply(Kind.GPU, "ADDED", gpu("g1", "n1"))  # 100 TFLOPS
    pods = Pods(pod("a", "u-a", tflops="80"), pod("b", "u-b", tflops="80"))
    api = FakeApi(pods)
    binder = Binder(state, pods, api, Events(), settle_grace=GRACE, confirm_interval=GRACE)
    return state, pods, api, binder


async def bind(binder: Binder, name: str) -> str:
    return await binder.bind(ExtenderBindingArgs(pod_name=name, pod_namespace="ml", pod_uid=f"u-{name}",
                                                 node="n1"))


def second_pod_fits(state: ClusterState, pods: Pods) -> bool:
    try:
        reservation = state.reserve(pods.get("b", "ml") or {}, "n1")
    except PlacementError:
        return False
    state.release(reservation)
    return True


async def test_a_stalled_watch_never_frees_a_bound_pods_capacity() -> None:
    state, pods, api, binder = world()
    assert await bind(binder, "a") == ""
    for _ in range(10):  # many grace periods and reads later, the watch still has not shown the pod
        await asyncio.sleep(GRACE * 2)
        assert not second_pod_fits(state, pods)
    await eventually(lambda: ("get", "a") in api.calls)  # a read confirmed the bind
    assert state.reservation("u-a") is None and state.holds("u-a")  # counted as the pod's own allocation
    # the watch catches up, oldest news first: the pod before its bind, then bound
    state.apply(Kind.POD, "MODIFIED", pod("a", "u-a", tflops="80"))
    assert not second_pod_fits(state, pods)
    state.apply(Kind.POD, "MODIFIED", pods.get("a", "ml") or {})
    assert not second_pod_fits(state, pods)
    await binder.drain(1)


async def test_while_reads_fail_the_reservation_stays() -> None:
    state, pods, api, binder = world()
    assert await bind(binder, "a") == ""
    api.fail["get"] = ApiException(status=503, reason="Service Unavailable")
    await eventually(lambda: api.calls.count(("get", "a")) >= 3)  # three failed reads later
    assert state.reservation("u-a") is not None and not second_pod_fits(state, pods)
    await binder.drain(1)


@pytest.mark.parametrize("fate", ["deleted", "replaced", "finished"])
async def test_a_read_showing_the_pod_gone_releases_the_reservation(fate: str) -> None:
    state, pods, _api, binder = world()
    assert await bind(binder, "a") == ""
    current: dict[str, Any] = pods.pods[("ml", "a")]
    if fate == "deleted":
        del pods.pods[("ml", "a")]
    elif fate == "replaced":
        pods.pods[("ml", "a")] = {**current, "metadata": {**current["metadata"], "uid": "u-a2"}}
    else:
        pods.pods[("ml", "a")] = {**current, "status": {"phase": "Succeeded"}}
    await eventually(lambda: state.reservation("u-a") is None)
    assert not state.holds("u-a")
    assert second_pod_fits(state, pods)
    await binder.drain(1)

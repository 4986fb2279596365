"""Bind: reserve, annotate, bind; and on any failure release and roll back."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from extender_fakes import POOL, Events, FakeApi, Pods, gpu, pod
from kubernetes.client import ApiException

from extender.binder import Binder, describe_allocation
from extender.contract import ALLOCATED, GPU_IDS, POD_INDEX, GPURequest
from extender.protocol import ExtenderBindingArgs
from extender.state import ClusterState, Kind


def cluster() -> ClusterState:
    state = ClusterState()
    state.apply(Kind.POOL, "ADDED", {"metadata": {"name": POOL}, "spec": {}})
    state.apply(Kind.GPU, "ADDED", gpu("g1", "n1"))
    state.apply(Kind.GPU, "ADDED", gpu("g2", "n2"))
    return state


def args(name: str, uid: str, node: str = "n1") -> ExtenderBindingArgs:
    return ExtenderBindingArgs(pod_name=name, pod_namespace="ml", pod_uid=uid, node=node)


def setup(*pods: dict[str, Any]) -> tuple[ClusterState, FakeApi, Events, Binder]:
    state = cluster()
    lookup = Pods(*pods)
    api, events = FakeApi(lookup), Events()
    return state, api, events, Binder(state, lookup, api, events, index_poll=0.01, settle_grace=3600)


async def test_success_annotates_then_binds_and_keeps_the_capacity() -> None:
    state, api, events, binder = setup(pod("a", "u1", index=3))
    assert await binder.bind(args("a", "u1")) == ""
    [patch, bind] = api.calls
    assert patch == ("merge_patch",
                     {"metadata": {"uid": "u1", "annotations": {
                         GPU_IDS: "g1", ALLOCATED: "tflops=60,vram=4Gi", POD_INDEX: "3"}}})
    assert bind == ("bind", ("a", "u1", "n1"))
    assert events.recorded == [("a", "GPUDeviceAllocated",
                                "allocated GPU g1 on node n1: 60 TFLOPS and 4Gi per GPU", "Normal")]
    # the capacity stays taken until the watched pod shows it: a second 60-TFLOPS pod no longer fits
    assert state.filter(pod("b", "u2"), ["n1"]).fits == []
    await binder.drain()


async def test_concurrent_binds_never_share_capacity() -> None:
    _, api, _, binder = setup(pod("a", "u1"), pod("b", "u2"))
    api.gate = asyncio.Event()
    first = binder.start_bind(args("a", "u1"))
    second = binder.start_bind(args("b", "u2"))
    await asyncio.sleep(0.01)
    api.gate.set()
    results = await asyncio.gather(first, second)
    assert results[0] == ""
    assert "cannot place pod ml/b on node n1" in results[1]
    await binder.drain()


async def test_patch_failure_releases_the_reservation_and_reports() -> None:
    state, api, events, binder = setup(pod("a", "u1"))
    api.fail["merge_patch"] = ApiException(status=500, reason="Internal Server Error")
    error = await binder.bind(args("a", "u1"))
    assert error.startswith(f"cannot write {GPU_IDS} on pod ml/a")
    assert [c[0] for c in api.calls] == ["merge_patch"]  # nothing to roll back, no binding attempted
    assert state.filter(pod("b", "u2"), ["n1"]).fits == ["n1"]
    assert events.recorded[-1][1:] == ("GPUDeviceAllocationFailed", error, "Warning")


async def test_binding_failure_releases_and_removes_only_what_this_bind_wrote() -> None:
    state, api, events, binder = setup(pod("a", "u1", index=2))
    api.fail["bind"] = ApiException(status=409, reason="Conflict")
    error = await binder.bind(args("a", "u1"))
    assert error.startswith("cannot bind pod ml/a to node n1")
    kinds = [c[0] for c in api.calls]
    assert kinds == ["merge_patch", "bind", "get", "json_patch"]
    ops = api.calls[-1][1]
    assert {"op": "test", "path": "/metadata/uid", "value": "u1"} in ops
    assert {"op": "test", "path": "/metadata/annotations/tensor-fusion.ai~1gpu-ids", "value": "g1"} in ops
    assert {"op": "remove", "path": "/metadata/annotations/tensor-fusion.ai~1gpu-ids"} in ops
    assert {"op": "remove", "path": "/metadata/annotations/tensor-fusion.ai~1index"} in ops
    assert state.filter(pod("b", "u2"), ["n1"]).fits == ["n1"]
    assert events.recorded[-1][1] == "GPUDeviceAllocationFailed"


async def test_a_binding_error_that_actually_bound_counts_as_success() -> None:
    _, api, _, binder = setup(pod("a", "u1"))
    api.fail["bind"] = TimeoutError("read timed out")
    api.node_after_bind_error = "n1"
    assert await binder.bind(args("a", "u1")) == ""
    assert "json_patch" not in [c[0] for c in api.calls]
    await binder.drain()


async def test_no_room_on_the_node_answers_an_error_without_writing() -> None:
    _, api, _, binder = setup(pod("a", "u1", tflops="500"))
    error = await binder.bind(args("a", "u1"))
    assert "cannot place pod ml/a on node n1" in error and "exceeds" in error
    assert api.calls == []


async def test_uid_mismatch_refuses_to_bind_a_replaced_pod() -> None:
    _, api, _, binder = setup(pod("a", "u-new"))
    error = await binder.bind(args("a", "u-old"))
    assert "was replaced" in error
    assert [c[0] for c in api.calls] == ["get"]


async def test_pod_missing_from_the_cache_is_read_from_the_api() -> None:
    _, api, _, binder = setup()
    error = await binder.bind(args("ghost", "u9"))
    assert error.startswith("cannot read pod ml/ghost")
    assert api.calls == [("get", "ghost")]


async def test_index_held_by_a_pending_pod_is_set_later() -> None:
    holder = pod("h", "u0", tflops="10", index=5, node="n1", gpu_ids="g1", phase="Pending")
    newcomer = pod("a", "u1", tflops="10", index=5)
    state, api, _, binder = setup(holder, newcomer)
    state.apply(Kind.POD, "ADDED", holder)
    assert await binder.bind(args("a", "u1")) == ""
    first_patch = api.calls[0][1]
    assert POD_INDEX not in first_patch["metadata"]["annotations"]
    await asyncio.sleep(0.05)
    assert len([c for c in api.calls if c[0] == "merge_patch"]) == 1  # still waiting for the holder
    state.apply(Kind.POD, "MODIFIED", {**holder, "status": {"phase": "Running"}})
    async with asyncio.timeout(2):
        while len([c for c in api.calls if c[0] == "merge_patch"]) < 2:
            await asyncio.sleep(0.01)
    assert api.calls[-1][1] == {"metadata": {"uid": "u1", "annotations": {POD_INDEX: "5"}}}
    await binder.drain()


async def test_a_pod_without_the_worker_label_gets_it_so_the_cache_sees_it() -> None:
    unlabelled = pod("a", "u1")
    unlabelled["metadata"]["labels"] = {}
    _, api, _, binder = setup(unlabelled)
    assert await binder.bind(args("a", "u1")) == ""
    assert api.calls[0][1]["metadata"]["labels"] == {"tensor-fusion.ai/component": "worker"}
    await binder.drain()


@pytest.mark.parametrize(("request_", "expected"), [
    (GPURequest(pool="p", percent_request=50, vram_request=2**30), "50% compute and 1Gi per GPU"),
    (GPURequest(pool="p", isolation="shared", gpu_count=2), "whole GPUs"),
])
def test_allocation_message(request_: GPURequest, expected: str) -> None:
    assert describe_allocation(("g1", "g2"), "n1", request_) == f"allocated GPUs g1,g2 on node n1: {expected}"

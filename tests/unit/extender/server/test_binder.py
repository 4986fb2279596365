"""Bind: reserve, then one Binding carrying the GPUs; retries join, unknown outcomes are resolved."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from typing import Any

import pytest
from kubernetes.client import ApiException

from extender.common.batched_log import BatchedLog
from extender.common.contract import ALLOCATED, GPU_IDS, POD_INDEX, GPURequest
from extender.kube.aio import NotSent, UnknownOutcome
from extender.scheduling.state import ClusterState, Kind
from extender.server import binder as binder_module
from extender.server.binder import Binder, bind_annotations, describe_allocation
from extender.server.protocol import ExtenderBindingArgs
from tests.unit.fixtures.fakes import POOL, Events, FakeApi, Pods, gpu, pod


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
    return state, api, events, Binder(state, lookup, api, events, index_poll=0.01, settle_grace=3600,
                                   retry_delay=0.001)


async def test_success_is_one_binding_carrying_the_gpus_and_keeps_the_capacity() -> None:
    state, api, events, binder = setup(pod("a", "u1", index=3))
    assert await binder.bind(args("a", "u1")) == ""
    assert api.calls == [("bind", ("a", "u1", "n1", {GPU_IDS: "g1", ALLOCATED: "tflops=60,vram=4Gi",
                                                     POD_INDEX: "3"}))]
    assert events.recorded == [("a", "GPUDeviceAllocated",
                                "allocated GPU g1 on node n1: 60 TFLOPS and 4Gi per GPU", "Normal")]
    # the capacity stays taken until the watched pod shows it: a second 60-TFLOPS pod no longer fits
    assert state.filter(pod("b", "u2"), ["n1"]).fits == []
    await binder.drain()


async def test_each_bind_writes_one_line_with_the_pod_node_and_gpus(monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=binder_module.log.name)
    stream = io.StringIO()
    monkeypatch.setattr(binder_module, "bind_log", BatchedLog(binder_module.log, stream))
    _, _, _, binder = setup(pod("a", "u1", index=3), pod("b", "u2"))
    assert await binder.bind(args("a", "u1")) == ""
    assert await binder.bind(args("b", "u2", node="n2")) == ""
    binder_module.bind_log.flush()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["level"], line["msg"], line["pod"], line["node"], line["gpus"], line["index"])
            for line in lines] == [("info", "bound", "ml/a", "n1", "g1", 3),
                                   ("info", "bound", "ml/b", "n2", "g2", None)]
    await binder.drain()


def test_bind_annotations_are_the_gpus_and_the_index() -> None:
    state = cluster()
    reservation = state.reserve(pod("a", "u1"), "n1")
    granted = {GPU_IDS: "g1", ALLOCATED: "tflops=60,vram=4Gi"}
    assert bind_annotations(reservation, None) == granted
    assert bind_annotations(reservation, 7) == {**granted, POD_INDEX: "7"}


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


async def test_a_retried_bind_joins_the_one_in_flight_and_answers_its_outcome() -> None:
    _, api, _, binder = setup(pod("a", "u1"))
    api.gate = asyncio.Event()
    first = binder.start_bind(args("a", "u1"))
    await asyncio.sleep(0.01)
    second = binder.start_bind(args("a", "u1"))
    await asyncio.sleep(0.01)
    api.gate.set()
    assert await asyncio.gather(first, second) == ["", ""]
    assert [c[0] for c in api.calls] == ["bind"]  # one Binding, nothing reserved twice
    await binder.drain()


async def test_a_retry_to_another_node_while_in_flight_answers_where_the_pod_went() -> None:
    _, api, _, binder = setup(pod("a", "u1"))
    api.gate = asyncio.Event()
    first = binder.start_bind(args("a", "u1"))
    await asyncio.sleep(0.01)
    second = binder.start_bind(args("a", "u1", node="n2"))
    api.gate.set()
    assert await first == ""
    assert await second == "pod ml/a is already bound to node n1, not n2"
    assert [c[0] for c in api.calls] == ["bind"]
    await binder.drain()


async def test_a_failed_bind_in_flight_lets_a_retry_to_another_node_go_ahead() -> None:
    _, api, _, binder = setup(pod("a", "u1"))
    api.gate = asyncio.Event()
    api.fail_next["bind"] = [ApiException(status=403, reason="Forbidden")]
    first = binder.start_bind(args("a", "u1"))
    await asyncio.sleep(0.01)
    second = binder.start_bind(args("a", "u1", node="n2"))
    api.gate.set()
    assert (await first).startswith("cannot bind pod ml/a to node n1: HTTP 403")
    assert await second == ""
    assert api.calls[-1] == ("bind", ("a", "u1", "n2", {GPU_IDS: "g2", ALLOCATED: "tflops=60,vram=4Gi"}))
    await binder.drain()


@pytest.mark.parametrize(("node", "gpu_ids", "expected"), [
    ("n1", "g1", ""),
    ("n2", "g2", "pod ml/a is already bound to node n2, not n1"),
    ("n1", None, f"pod ml/a is already bound to node n1 without {GPU_IDS}: not bound by this extender"),
])
async def test_an_already_bound_pod_is_answered_at_once(node: str, gpu_ids: str | None,
                                                        expected: str) -> None:
    _, api, _, binder = setup(pod("a", "u1", node=node, gpu_ids=gpu_ids))
    assert await binder.bind(args("a", "u1")) == expected
    assert api.calls == []


async def test_a_bind_that_succeeded_but_is_not_yet_watched_answers_success_again() -> None:
    state, api, _, binder = setup(pod("a", "u1"))
    lookup_pod = dict(binder.pods.get("a", "ml") or {})
    assert await binder.bind(args("a", "u1")) == ""
    binder.pods = Pods(lookup_pod)  # the cache has not seen the bind yet
    assert await binder.bind(args("a", "u1")) == ""
    assert await binder.bind(args("a", "u1", node="n2")) == "pod ml/a is already bound to node n1, not n2"
    assert [c[0] for c in api.calls] == ["bind"]
    assert state.filter(pod("b", "u2"), ["n1"]).fits == []
    await binder.drain()


async def test_a_refused_binding_releases_the_reservation_and_reports() -> None:
    state, api, events, binder = setup(pod("a", "u1", index=2))
    api.fail["bind"] = ApiException(status=403, reason="Forbidden")
    error = await binder.bind(args("a", "u1"))
    assert error.startswith("cannot bind pod ml/a to node n1: HTTP 403")
    assert [c[0] for c in api.calls] == ["bind"]  # nothing written, so nothing to roll back
    assert state.filter(pod("b", "u2"), ["n1"]).fits == ["n1"]
    assert events.recorded[-1][1:] == ("GPUDeviceAllocationFailed", error, "Warning")


@pytest.mark.parametrize("lost", [
    UnknownOutcome("POST: no answer"), ApiException(status=504, reason="Gateway Timeout"),
    ApiException(status=429, reason="Too Many Requests")])
async def test_a_binding_whose_answer_was_lost_but_happened_counts_as_success(lost: Exception) -> None:
    state, api, events, binder = setup(pod("a", "u1"))
    api.fail_next["bind"] = [lost]
    api.bound_after = True
    assert await binder.bind(args("a", "u1")) == ""
    assert [c[0] for c in api.calls] == ["bind", "get"]
    assert events.recorded[-1][1] == "GPUDeviceAllocated"
    assert state.filter(pod("b", "u2"), ["n1"]).fits == []  # still held
    await binder.drain()


async def test_an_unknown_outcome_keeps_the_reservation_and_posts_again_until_known() -> None:
    state, api, _, binder = setup(pod("a", "u1"))
    api.fail_next["bind"] = [UnknownOutcome("no answer"), UnknownOutcome("no answer")]
    api.fail_next["get"] = [UnknownOutcome("no answer")]
    api.gate = asyncio.Event()
    task = binder.start_bind(args("a", "u1"))
    await asyncio.sleep(0)
    assert state.filter(pod("b", "u2"), ["n1"]).fits == []  # held while unknown
    api.gate.set()
    assert await task == ""
    assert [c[0] for c in api.calls] == ["bind", "get", "bind", "get", "bind"]
    assert api.calls[0] == api.calls[2] == api.calls[4]  # the same Binding each time
    await binder.drain()


async def test_a_binding_not_sent_is_posted_again_without_a_read() -> None:
    _, api, _, binder = setup(pod("a", "u1"))
    api.fail_next["bind"] = [NotSent("no connection free in time")]
    assert await binder.bind(args("a", "u1")) == ""
    assert [c[0] for c in api.calls] == ["bind", "bind"]
    await binder.drain()


async def test_a_binding_lost_and_then_done_by_the_late_request_is_found_by_the_retry() -> None:
    # the first Binding times out, the pod reads unbound, then the late request lands: the second Binding
    # gets 409 and the read shows the pod bound with this bind's GPUs
    _, api, _, binder = setup(pod("a", "u1"))
    api.fail_next["bind"] = [UnknownOutcome("no answer")]
    real_get = api.get
    reads = 0

    async def get(namespace: str, name: str) -> dict[str, Any]:
        nonlocal reads
        reads += 1
        found = await real_get(namespace, name)
        if reads == 1:
            api._store_binding(namespace, name, "n1", {GPU_IDS: "g1"})
        return found

    api.get = get  # type: ignore[method-assign]
    assert await binder.bind(args("a", "u1")) == ""
    assert [c[0] for c in api.calls] == ["bind", "get", "bind", "get"]
    await binder.drain()


@pytest.mark.parametrize(("after", "expected"), [
    ({"spec": {"nodeName": "n2"}}, "pod ml/a is already bound to node n2, not n1"),
    ({"metadata": {"uid": "u-other"}}, "cannot bind pod ml/a: it was replaced (uid u-other)"),
    (None, "cannot bind pod ml/a: it was deleted"),
])
async def test_a_lost_answer_then_a_definite_state_releases(after: dict[str, Any] | None,
                                                            expected: str) -> None:
    state, api, _, binder = setup(pod("a", "u1"))
    api.fail_next["bind"] = [UnknownOutcome("no answer")]
    original = binder.pods.get("a", "ml") or {}
    if after is None:
        api.pods = Pods()
    else:
        api.pods = Pods({**original, **{k: {**original[k], **v} for k, v in after.items()}})
    assert await binder.bind(args("a", "u1")) == expected
    assert state.filter(pod("b", "u2"), ["n1"]).fits == ["n1"]
    await binder.drain()


async def test_a_pod_bound_here_by_an_earlier_bind_keeps_those_gpus() -> None:
    # e.g. after a restart: this bind chose g1, the pod already holds g1b from the bind before
    state, api, _, binder = setup(pod("a", "u1", tflops="10"))
    api.fail_next["bind"] = [ApiException(status=409, reason="Conflict")]
    earlier = pod("a", "u1", tflops="10", node="n1", gpu_ids="g1b")
    api.pods = Pods(earlier)
    state.apply(Kind.GPU, "ADDED", gpu("g1b", "n1"))
    assert await binder.bind(args("a", "u1")) == ""
    assert {a.uid: a.gpu_ids for a in state.allocations()} == {"u1": ("g1b",)}
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
    assert api.calls[0] == ("bind", ("a", "u1", "n1", {GPU_IDS: "g1", ALLOCATED: "tflops=10,vram=4Gi"}))
    await asyncio.sleep(0.05)
    assert [c for c in api.calls if c[0] == "merge_patch"] == []  # still waiting for the holder
    state.apply(Kind.POD, "MODIFIED", {**holder, "status": {"phase": "Running"}})
    async with asyncio.timeout(2):
        while not [c for c in api.calls if c[0] == "merge_patch"]:
            await asyncio.sleep(0.01)
    assert api.calls[-1][1] == {"metadata": {"uid": "u1", "annotations": {POD_INDEX: "5"}}}
    await binder.drain()


async def test_a_pod_without_the_worker_label_gets_it_so_the_cache_sees_it() -> None:
    unlabelled = pod("a", "u1")
    unlabelled["metadata"]["labels"] = {}
    _, api, _, binder = setup(unlabelled)
    assert await binder.bind(args("a", "u1")) == ""
    assert api.calls[0] == ("merge_patch", {"metadata": {"uid": "u1",
                                                         "labels": {"tensor-fusion.ai/component": "worker"}}})
    assert api.calls[1][0] == "bind"
    await binder.drain()


@pytest.mark.parametrize(("request_", "expected"), [
    (GPURequest(pool="p", percent_request=50, vram_request=2**30), "50% compute and 1Gi per GPU"),
    (GPURequest(pool="p", isolation="shared", gpu_count=2), "whole GPUs"),
])
def test_allocation_message(request_: GPURequest, expected: str) -> None:
    assert describe_allocation(("g1", "g2"), "n1", request_) == f"allocated GPUs g1,g2 on node n1: {expected}"

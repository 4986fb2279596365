"""The resize verb on the live ClusterState: the ledger decides first, the pod is patched in one write,
events follow the decision, a failed patch gives the room back."""

from __future__ import annotations

import asyncio
from fractions import Fraction
from typing import Any

from kubernetes.client import ApiException

from extender.server.resize import Resizer, Target
from tests.unit.fixtures.autoscale import GIB, bound_worker, g1_used, state_with
from tests.unit.fixtures.fakes import Events, FakeApi, Pods


def test_a_resize_patches_request_limit_and_record_together_and_says_so() -> None:
    a = bound_worker("a", "ua", "10")
    state = state_with(a, bound_worker("b", "ub", "20", "other"))
    api, events = FakeApi(Pods(a)), Events()
    result = asyncio.run(Resizer(state, api, events).resize(a, Target(Fraction(30), Fraction(40))))
    assert result.outcome.value == "resized" and result.tflops == 30
    (what, patch), = api.calls
    assert what == "merge_patch"
    assert patch == {"metadata": {"uid": "ua", "annotations": {
        "tensor-fusion.ai/allocated": "tflops=30,vram=4Gi", "tensor-fusion.ai/tflops-request": "30",
        "tensor-fusion.ai/tflops-limit": "40"}}}
    assert [e[1] for e in events.recorded] == ["ResourceScaledUp"]
    assert g1_used(state) == 50


def test_a_clamped_scale_up_is_patched_to_the_room_and_warned() -> None:
    a = bound_worker("a", "ua", "10")
    state = state_with(a, bound_worker("b", "ub", "70", "other"))
    events = Events()
    result = asyncio.run(Resizer(state, FakeApi(Pods(a)), events).resize(a, Target(Fraction(50))))
    assert result.outcome.value == "clamped" and result.tflops == 30
    assert [(e[1], e[3]) for e in events.recorded] == [("ResourceScaledUp", "Normal"),
                                                       ("ResizeLimited", "Warning")]
    assert g1_used(state) == 100


def test_a_full_gpu_refuses_with_one_warning_and_no_patch() -> None:
    a = bound_worker("a", "ua", "10")
    state = state_with(a, bound_worker("b", "ub", "90", "other"))
    api, events = FakeApi(Pods(a)), Events()
    result = asyncio.run(Resizer(state, api, events).resize(a, Target(Fraction(50))))
    assert result.outcome.value == "refused" and api.calls == []
    assert events.recorded == [("a", "ResizeLimited",
                                "not resized: its GPUs have no room for more (10 TFLOPS and 36Gi VRAM per "
                                "GPU for it)", "Warning")]


def test_a_failed_patch_gives_the_room_back() -> None:
    a = bound_worker("a", "ua", "10")
    state = state_with(a)
    api, events = FakeApi(Pods(a)), Events()
    api.fail["merge_patch"] = ApiException(status=500, reason="boom")
    result = asyncio.run(Resizer(state, api, events).resize(a, Target(Fraction(60))))
    assert result.error.startswith("cannot patch pod ml/a") and events.recorded == []
    assert g1_used(state) == 10


def test_a_scale_down_frees_the_room_only_after_the_patch() -> None:
    a = bound_worker("a", "ua", "60")
    state = state_with(a)
    seen: list[Fraction] = []
    api = FakeApi(Pods(a))
    original = api.merge_patch

    async def watching(namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        seen.append(g1_used(state))
        return await original(namespace, name, patch)

    api.merge_patch = watching  # type: ignore[method-assign]
    asyncio.run(Resizer(state, api, Events()).resize(a, Target(Fraction(6), Fraction(60), 2 * GIB)))
    assert seen == [60]  # still held while the pod was being patched
    assert g1_used(state) == 6 and state.gpu_usage()["g1"][1] == 2 * GIB




def test_a_scale_up_grows_within_the_namespace_quota_by_its_delta() -> None:
    """The quota leaves 15 TFLOPS in namespace ml: a scale-up of 10 -> 60 ends at 25, and says why."""
    from extender.controllers.quota.rule import QuotaRule
    from extender.quota.book import QuotaBook

    a = bound_worker("a", "ua", "10")
    state = state_with(a, bound_worker("b", "ub", "15"))
    quotas = [{"metadata": {"name": "q", "namespace": "ml"},
               "spec": {"total": {"requests": {"tflops": "40", "vram": "1Ti"}}}}]

    class Cache:
        synced = asyncio.Event()

    Cache.synced.set()
    state.quota_gate = QuotaRule(QuotaBook(state, lambda: quotas), Cache())
    events = Events()
    resizer = Resizer(state, FakeApi(Pods(a)), events, quota=lambda: state.quota_gate)
    result = asyncio.run(resizer.resize(a, Target(Fraction(60))))
    assert result.outcome.value == "clamped" and result.tflops == 25
    assert result.quota.startswith("TFLOPS clamped by the GPU quota of namespace ml")
    assert events.recorded[-1][1] == "ResizeLimited" and "GPU quota" in events.recorded[-1][2]
    again = asyncio.run(resizer.resize(a, Target(Fraction(60))))  # the quota is full now
    assert again.outcome.value == "refused" and again.tflops == 25
    shrink = asyncio.run(resizer.resize(a, Target(Fraction(5))))  # scaling down always goes
    assert shrink.outcome.value == "resized" and shrink.tflops == 5

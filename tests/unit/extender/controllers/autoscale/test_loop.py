"""The autoscaling loop on the live ClusterState with fakes at its API boundary: one TensorFusionWorkload
per workload, the recommendation applied through the ledger, a refused scale-up warned once (TensorFusion
warns every tick), bad fields in the condition, and a restart that starts from the stored status."""

from __future__ import annotations

import asyncio
import datetime as dt
from fractions import Fraction
from typing import Any

from extender.autoscaling.usage import StaticUsageSource, WorkerUsage
from extender.controllers.autoscale.config import AutoscaleOptions
from extender.controllers.autoscale.loop import WorkloadAutoscaler
from extender.server.resize import Resizer
from tests.unit.extender_fakes import Events, FakeApi, Pods
from tests.unit.test_resize import _bound, _state, _used

NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
GIB = 2**30


class Workloads:
    def __init__(self, profile: dict[str, Any] | None = None) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.profile_obj = profile
        self.patches: list[dict[str, Any]] = []

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((namespace, name))

    async def create(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        body["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
        self.objects[(namespace, body["metadata"]["name"])] = body
        return body

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.patches.append(status)
        self.objects[(namespace, name)]["status"] = status

    async def profile(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.profile_obj

    async def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None


class PodList:
    def __init__(self, *pods: dict[str, Any]) -> None:
        self.pods = list(pods)

    def list(self) -> list[dict[str, Any]]:
        return self.pods


def _autoscaled(name: str, uid: str, tflops: str) -> dict[str, Any]:
    p = _bound(name, uid, tflops, workload=name)
    p["metadata"]["annotations"].update({"tensor-fusion.ai/autoscale": "true",
                                         "tensor-fusion.ai/autoscale-target": "compute"})
    return p


def _usage(workload: str, tflops: float) -> StaticUsageSource:
    source = StaticUsageSource()
    start = int((NOW - dt.timedelta(minutes=50)).timestamp()) * 10**9
    source.add("ml", workload, [WorkerUsage(workload, tflops, 3 * GIB, start + i * 30 * 10**9)
                                for i in range(90)])
    return source


def _loop(state, pods, workloads, source, events) -> WorkloadAutoscaler:
    return WorkloadAutoscaler(state, PodList(*pods), workloads, Resizer(state, FakeApi(Pods(*pods)), events),
                              AutoscaleOptions(True, 1.0), source)


def test_a_workload_is_created_recommended_and_resized() -> None:
    a = _autoscaled("a", "ua", "10")
    state, workloads, events = _state(a), Workloads(), Events()
    asyncio.run(_loop(state, [a], workloads, _usage("a", 40.0), events).reconcile(NOW))
    tfw = workloads.objects[("ml", "a")]
    assert tfw["spec"]["resources"]["requests"]["tflops"] == "10"
    auto_set = tfw["spec"]["autoScalingConfig"]["autoSetResources"]
    assert auto_set == {"enable": True, "targetResource": "compute"}
    assert tfw["status"]["workerCount"] == 1
    assert tfw["status"]["recommendation"]["requests"]["tflops"] == "47"
    assert tfw["status"]["conditions"][0]["reason"] == "Updated"
    assert _used(state) == 47
    assert [e[1] for e in events.recorded] == ["ResourceScaledUp"]
    assert state.gpu_usage()["g1"][1] == 4 * GIB  # compute only: VRAM stays


def test_a_refused_scale_up_is_warned_once_not_every_pass() -> None:
    a, b = _autoscaled("a", "ua", "10"), _bound("b", "ub", "90", "other")
    state, workloads, events = _state(a, b), Workloads(), Events()
    loop = _loop(state, [a, b], workloads, _usage("a", 40.0), events)
    for minute in range(3):
        asyncio.run(loop.reconcile(NOW + dt.timedelta(minutes=minute)))
    assert [e[1] for e in events.recorded] == ["ResizeLimited"]
    assert _used(state) == 100


def test_bad_fields_are_named_in_the_condition_and_the_default_used() -> None:
    profile = {"spec": {"autoScalingConfig": {"autoSetResources": {
        "enable": True, "targetResource": "compute", "marginFraction": "lots",
        "initialDelayPeriod": "soon"}}}}
    a = _autoscaled("a", "ua", "10")
    a["metadata"]["annotations"]["tensor-fusion.ai/workload-profile"] = "p"
    state, workloads, events = _state(a), Workloads(profile), Events()
    asyncio.run(_loop(state, [a], workloads, _usage("a", 40.0), events).reconcile(NOW))
    (condition,) = workloads.objects[("ml", "a")]["status"]["conditions"]
    assert condition["status"] == "False" and condition["reason"] == "InvalidAutoScalingConfig"
    assert "autoSetResources.marginFraction: 'lots' is not a number; using the default 0.15" in \
        condition["message"]
    assert "autoSetResources.initialDelayPeriod: 'soon' is not a duration" in condition["message"]
    assert _used(state) == 47  # the defaults still recommend


def test_a_restart_starts_from_the_stored_recommendation() -> None:
    a = _autoscaled("a", "ua", "47")
    state, workloads, events = _state(a), Workloads(), Events()
    workloads.objects[("ml", "a")] = {
        "metadata": {"name": "a", "namespace": "ml", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"resources": {"requests": {"tflops": "10", "vram": "4Gi"},
                               "limits": {"tflops": "10", "vram": "4Gi"}},
                 "autoScalingConfig": {"autoSetResources": {"enable": True, "targetResource": "compute"}}},
        "status": {"recommendation": {"requests": {"tflops": "47", "vram": "4Gi"},
                                      "limits": {"tflops": "47", "vram": "4Gi"}}}}
    asyncio.run(_loop(state, [a], workloads, _usage("a", 40.0), events).reconcile(NOW))
    # the same usage gives the same 47 TFLOPS the worker already holds: no resize, no event; the VRAM part of
    # the recommendation moves (3Gi in use), but targetResource compute keeps it off the worker
    assert events.recorded == [] and _used(state) == Fraction(47)
    status = workloads.objects[("ml", "a")]["status"]
    assert status["recommendation"]["requests"]["tflops"] == "47"
    assert status["recommendation"]["requests"]["vram"] != "4Gi"
    assert state.gpu_usage()["g1"][1] == 4 * GIB


def test_a_workload_is_evaluated_on_its_own_interval_and_a_long_history_is_capped() -> None:
    """autoSetResources.interval paces each workload, as TensorFusion's loader does (the loop's passes
    are only the tick); historyDataPeriod beyond 30 days is TensorFusion's limit, named and applied."""
    profile = {"spec": {"autoScalingConfig": {"autoSetResources": {
        "enable": True, "targetResource": "compute", "interval": "5m", "historyDataPeriod": "1440h"}}}}
    a = _autoscaled("a", "ua", "10")
    a["metadata"]["annotations"]["tensor-fusion.ai/workload-profile"] = "p"
    state, workloads, events = _state(a), Workloads(profile), Events()
    loop = _loop(state, [a], workloads, _usage("a", 40.0), events)
    for seconds in (0, 30, 60, 299, 300, 330):
        asyncio.run(loop.reconcile(NOW + dt.timedelta(seconds=seconds)))
    assert len(workloads.patches) == 2, "evaluated at 0 s and 300 s, not on every pass"
    (condition,) = workloads.patches[0]["conditions"]
    assert "autoSetResources.historyDataPeriod: '1440h' is longer than 30 days; using 30 days" in \
        condition["message"]

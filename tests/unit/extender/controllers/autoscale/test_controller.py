"""The workload autoscaler on the live ClusterState with fakes at its API boundary: one TensorFusionWorkload
per workload, the recommendation applied through the ledger, a refused scale-up warned once (TensorFusion
warns every tick), bad fields in the condition, and a restart that starts from the stored status."""

from __future__ import annotations

import asyncio
import datetime as dt
from fractions import Fraction

from tests.unit.fixtures.autoscale import (
    GIB,
    NOW,
    Workloads,
    autoscaled_worker,
    autoscaler,
    bound_worker,
    g1_used,
    state_with,
    usage_source,
)
from tests.unit.fixtures.fakes import Events


def test_a_workload_is_created_recommended_and_resized() -> None:
    a = autoscaled_worker("a", "ua", "10")
    state, workloads, events = state_with(a), Workloads(), Events()
    asyncio.run(autoscaler(state, [a], workloads, usage_source("a", 40.0), events).reconcile(NOW))
    tfw = workloads.objects[("ml", "a")]
    assert tfw["spec"]["resources"]["requests"]["tflops"] == "10"
    auto_set = tfw["spec"]["autoScalingConfig"]["autoSetResources"]
    assert auto_set == {"enable": True, "targetResource": "compute"}
    assert tfw["status"]["workerCount"] == 1
    assert tfw["status"]["recommendation"]["requests"]["tflops"] == "47"
    assert tfw["status"]["conditions"][0]["reason"] == "Updated"
    assert g1_used(state) == 47
    assert [e[1] for e in events.recorded] == ["ResourceScaledUp"]
    assert state.gpu_usage()["g1"][1] == 4 * GIB  # compute only: VRAM stays


def test_a_refused_scale_up_is_warned_once_not_every_pass() -> None:
    a, b = autoscaled_worker("a", "ua", "10"), bound_worker("b", "ub", "90", "other")
    state, workloads, events = state_with(a, b), Workloads(), Events()
    loop = autoscaler(state, [a, b], workloads, usage_source("a", 40.0), events)
    for minute in range(3):
        asyncio.run(loop.reconcile(NOW + dt.timedelta(minutes=minute)))
    assert [e[1] for e in events.recorded] == ["ResizeLimited"]
    assert g1_used(state) == 100


def test_bad_fields_are_named_in_the_condition_and_the_default_used() -> None:
    profile = {"spec": {"autoScalingConfig": {"autoSetResources": {
        "enable": True, "targetResource": "compute", "marginFraction": "lots",
        "initialDelayPeriod": "soon"}}}}
    a = autoscaled_worker("a", "ua", "10")
    a["metadata"]["annotations"]["tensor-fusion.ai/workload-profile"] = "p"
    state, workloads, events = state_with(a), Workloads(profile), Events()
    asyncio.run(autoscaler(state, [a], workloads, usage_source("a", 40.0), events).reconcile(NOW))
    (condition,) = workloads.objects[("ml", "a")]["status"]["conditions"]
    assert condition["status"] == "False" and condition["reason"] == "InvalidAutoScalingConfig"
    assert "autoSetResources.marginFraction: 'lots' is not a number; using the default 0.15" in \
        condition["message"]
    assert "autoSetResources.initialDelayPeriod: 'soon' is not a duration" in condition["message"]
    assert g1_used(state) == 47  # the defaults still recommend


def test_a_restart_starts_from_the_stored_recommendation() -> None:
    a = autoscaled_worker("a", "ua", "47")
    state, workloads, events = state_with(a), Workloads(), Events()
    workloads.objects[("ml", "a")] = {
        "metadata": {"name": "a", "namespace": "ml", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"resources": {"requests": {"tflops": "10", "vram": "4Gi"},
                               "limits": {"tflops": "10", "vram": "4Gi"}},
                 "autoScalingConfig": {"autoSetResources": {"enable": True, "targetResource": "compute"}}},
        "status": {"recommendation": {"requests": {"tflops": "47", "vram": "4Gi"},
                                      "limits": {"tflops": "47", "vram": "4Gi"}}}}
    asyncio.run(autoscaler(state, [a], workloads, usage_source("a", 40.0), events).reconcile(NOW))
    # the same usage gives the same 47 TFLOPS the worker already holds: no resize, no event; the VRAM part of
    # the recommendation moves (3Gi in use), but targetResource compute keeps it off the worker
    assert events.recorded == [] and g1_used(state) == Fraction(47)
    status = workloads.objects[("ml", "a")]["status"]
    assert status["recommendation"]["requests"]["tflops"] == "47"
    assert status["recommendation"]["requests"]["vram"] != "4Gi"
    assert state.gpu_usage()["g1"][1] == 4 * GIB


def test_a_workload_is_evaluated_on_its_own_interval_and_a_long_history_caps_only_the_read() -> None:
    """autoSetResources.interval paces each workload, as TensorFusion's loader does (the loop's passes
    are only the tick). historyDataPeriod beyond 30 days: TensorFusion reads 30 days of usage
    (internal/autoscaler/workload_metrics_loader.go) but keeps the half-life at half the period
    (internal/autoscaler/workload/workload.go); nothing is named in the condition."""
    profile = {"spec": {"autoScalingConfig": {"autoSetResources": {
        "enable": True, "targetResource": "compute", "interval": "5m", "historyDataPeriod": "1440h"}}}}
    a = autoscaled_worker("a", "ua", "10")
    a["metadata"]["annotations"]["tensor-fusion.ai/workload-profile"] = "p"
    state, workloads, events = state_with(a), Workloads(profile), Events()
    reads: list[tuple[int, int]] = []
    source = usage_source("a", 40.0)

    class Recording:
        async def workload_usage(self, namespace: str, workload: str, start_ns: int, end_ns: int):
            reads.append((start_ns, end_ns))
            return await source.workload_usage(namespace, workload, start_ns, end_ns)

    loop = autoscaler(state, [a], workloads, Recording(), events)
    for seconds in (0, 30, 60, 299, 300, 330):
        asyncio.run(loop.reconcile(NOW + dt.timedelta(seconds=seconds)))
    assert len(workloads.patches) == 2, "evaluated at 0 s and 300 s, not on every pass"
    (condition,) = workloads.patches[0]["conditions"]
    assert "historyDataPeriod" not in condition["message"]
    assert reads[0][1] - reads[0][0] == 30 * 86400 * 10**9
    assert loop._memory[("ml", "a")].usage.half_life_ns == 720 * 3600 * 10**9


def test_the_package_builds_one_leader_only_controller_on_the_core_caches() -> None:
    import types
    from typing import Any

    from extender import controllers
    from extender.controllers import autoscale
    from extender.controllers.autoscale.config import AutoscaleOptions
    from extender.controllers.autoscale.controller import WorkloadAutoscaler
    from extender.controllers.runner import Reconciler
    from tests.unit.fixtures.autoscale import PodList
    from tests.unit.fixtures.fakes import FakeApi, Pods

    off = AutoscaleOptions()
    assert autoscale.NAME == "autoscale" and off == autoscale.DEFAULT
    assert controllers.autoscale is autoscale
    state = state_with()
    core = types.SimpleNamespace(pods=PodList(), all=("nodes", "pods"))
    deps: Any = types.SimpleNamespace(state=state, core=core, kube=None, pod_api=FakeApi(Pods()),
                                      recorder=Events())
    assert autoscale.build(deps, off) is None  # off unless --autoscale
    built = autoscale.build(deps, AutoscaleOptions(enabled=True, interval_seconds=12.0))
    assert built is not None
    [controller] = built.controllers
    assert isinstance(controller, Reconciler)
    assert controller.name == "workload-autoscale"
    assert controller.leader_only and controller.interval == 12.0
    assert tuple(controller.caches) == core.all
    assert isinstance(built.part, WorkloadAutoscaler) and built.part.pods is core.pods
    assert controller.reconcile == built.part.reconcile

"""The autoscaling loop on the live ClusterState with fakes at its API boundary: one TensorFusionWorkload
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


def test_a_workload_is_evaluated_on_its_own_interval_and_a_long_history_is_capped() -> None:
    """autoSetResources.interval paces each workload, as TensorFusion's loader does (the loop's passes
    are only the tick); historyDataPeriod beyond 30 days is TensorFusion's limit, named and applied."""
    profile = {"spec": {"autoScalingConfig": {"autoSetResources": {
        "enable": True, "targetResource": "compute", "interval": "5m", "historyDataPeriod": "1440h"}}}}
    a = autoscaled_worker("a", "ua", "10")
    a["metadata"]["annotations"]["tensor-fusion.ai/workload-profile"] = "p"
    state, workloads, events = state_with(a), Workloads(profile), Events()
    loop = autoscaler(state, [a], workloads, usage_source("a", 40.0), events)
    for seconds in (0, 30, 60, 299, 300, 330):
        asyncio.run(loop.reconcile(NOW + dt.timedelta(seconds=seconds)))
    assert len(workloads.patches) == 2, "evaluated at 0 s and 300 s, not on every pass"
    (condition,) = workloads.patches[0]["conditions"]
    assert "autoSetResources.historyDataPeriod: '1440h' is longer than 30 days; using 30 days" in \
        condition["message"]

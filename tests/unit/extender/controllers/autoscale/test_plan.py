"""``tf-extender plan --autoscale`` on a snapshot: the recommendation and what the resize would do, unreadable
samples named, the live state left alone."""

from __future__ import annotations

import datetime as dt
import json
from zoneinfo import ZoneInfo

from extender.autoscaling.usage import StaticUsageSource, WorkerUsage
from extender.cli import main
from extender.controllers.autoscale.plan import plan_autoscale
from extender.scheduling.inventory import NANO
from tests.unit.fixtures.autoscale import GIB, autoscale_snapshot, bound_worker, g1_used, state_with


def test_plan_autoscale_prints_the_recommendation_and_what_the_resize_would_do(tmp_path, capsys) -> None:
    cluster, usage = autoscale_snapshot(tmp_path)
    rc = main(["plan", "--cluster", str(cluster), "--now", "2026-01-01T12:00:00Z", "--autoscale",
               "--samples", str(usage)])
    assert rc == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    mine = next(line for line in lines if line.get("action") == "autoscale" and line["workload"] == "w")
    assert mine["recommendation"]["requests"]["tflops"] == "47"
    assert mine["reason"] == "Updated" and mine["samples"] == 100
    (resize,) = mine["resizes"]
    # 47 wanted, 30 left beside b's 70: clamped, as the live resize would be
    assert resize["outcome"] == "clamped" and resize["tflops"] == {"from": "10", "to": "30"}
    assert resize["event"] == "ResizeLimited"
    other = next(line for line in lines if line.get("workload") == "other")
    assert other["reason"] == "NotConfigured"


def test_plan_autoscale_names_unreadable_samples(tmp_path, capsys) -> None:
    cluster, usage = autoscale_snapshot(tmp_path)
    usage.write_text(json.dumps([{"namespace": "ml", "workload": "w", "worker": "a", "tflops": "lots"}]))
    rc = main(["plan", "--cluster", str(cluster), "--autoscale", "--samples", str(usage)])
    assert rc == 2
    assert "--samples: sample [0]: tflops 'lots' is not a non-negative number" in capsys.readouterr().err


def test_plan_autoscale_leaves_the_live_state_alone() -> None:
    a = bound_worker("a", "ua", "10")
    state = state_with(a)
    source = StaticUsageSource()
    t0 = int(dt.datetime(2026, 1, 1, 11, tzinfo=dt.UTC).timestamp()) * 10**9
    source.add("ml", "w", [WorkerUsage("a", 40.0, GIB, t0 + i * 30 * NANO) for i in range(50)])
    objects = [dict(a, metadata={**a["metadata"], "annotations": {
        **a["metadata"]["annotations"], "tensor-fusion.ai/autoscale": "true"}})]
    out = plan_autoscale(state, objects, source, dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC), ZoneInfo("UTC"))
    assert out[0]["resizes"][0]["outcome"] == "resized"
    assert g1_used(state) == 10



def _planned(qos: object, pod_qos: str, config: dict[str, object]) -> dict[str, object]:
    a = bound_worker("a", "ua", "10")
    a["metadata"]["annotations"]["tensor-fusion.ai/qos"] = pod_qos
    state = state_with(a)
    source = StaticUsageSource()
    t0 = int(dt.datetime(2026, 1, 1, 11, tzinfo=dt.UTC).timestamp()) * 10**9
    # half the samples at 10 TFLOPS, half at 40: the lower bound (p50) and the target (p95) differ
    source.add("ml", "w", [WorkerUsage("a", 10.0 if i % 2 else 40.0, GIB, t0 + i * 30 * NANO)
                           for i in range(100)])
    spec: dict[str, object] = {"resources": {"requests": {"tflops": "10", "vram": "4Gi"},
                                             "limits": {"tflops": "10", "vram": "4Gi"}},
                               "autoScalingConfig": config}
    if qos is not None:
        spec["qos"] = qos
    tfw = {"kind": "TensorFusionWorkload", "metadata": {"name": "w", "namespace": "ml",
                                                         "creationTimestamp": "2026-01-01T00:00:00Z"},
           "spec": spec}
    now = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)
    (out,) = plan_autoscale(state, [a, tfw], source, now, ZoneInfo("UTC"))
    return out


ENABLED = {"autoSetResources": {"enable": True, "targetResource": "all"}}


def test_an_empty_qos_is_read_as_tensorfusion_reads_it() -> None:
    """TensorFusion's percentile recommender (internal/autoscaler/recommender/percentile_recommender.go) takes
    the upper bound for critical, the target for high and the lower bound for anything else, the empty QoS of
    spec.qos included; the pod's own QoS does not stand in for it."""
    low = _planned("low", "high", ENABLED)["recommendation"]
    high = _planned("high", "low", ENABLED)["recommendation"]
    assert isinstance(low, dict) and isinstance(high, dict)
    assert low["requests"]["tflops"] != high["requests"]["tflops"]
    for empty in ("", None):
        assert _planned(empty, "high", ENABLED)["recommendation"] == low


def test_each_config_problem_is_printed_once() -> None:
    config = {"autoSetResources": {"enable": True, "targetResource": "all", "marginFraction": "lots"},
              "cronScalingRules": [{"enable": True, "name": "x", "start": "@daily", "end": "0 9 * * *"}]}
    problems = _planned("low", "low", config)["problems"]
    assert isinstance(problems, list) and len(problems) == 2 and len(set(problems)) == 2
    assert any("marginFraction: 'lots'" in p for p in problems)
    assert any("cronScalingRules[0].start: '@daily'" in p for p in problems)

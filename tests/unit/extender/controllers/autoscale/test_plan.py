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


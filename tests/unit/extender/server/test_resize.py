"""The resize verb on the live ClusterState: the ledger decides first, the pod is patched in one write,
events follow the decision, a failed patch gives the room back. And ``plan --autoscale`` on a snapshot."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from fractions import Fraction
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from kubernetes.client import ApiException

from extender.autoscaling.usage import StaticUsageSource, WorkerUsage
from extender.cli import main
from extender.controllers.autoscale.plan import plan_autoscale
from extender.scheduling.inventory import NANO
from extender.scheduling.state import ClusterState, Kind
from extender.server.resize import Resizer, Target
from tests.unit.extender_fakes import Events, FakeApi, Pods, gpu, pod

GIB = 2**30


def _bound(name: str, uid: str, tflops: str, workload: str = "w") -> dict[str, Any]:
    p = pod(name, uid, tflops=tflops, node="n1", gpu_ids="g1", phase="Running")
    p["metadata"]["annotations"]["tensor-fusion.ai/allocated"] = f"tflops={tflops},vram=4Gi"
    p["metadata"]["labels"]["tensor-fusion.ai/workload"] = workload
    p["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    return p


def _node() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {}},
            "status": {"allocatable": {"pods": "110"}}}


def _state(*pods: dict[str, Any]) -> ClusterState:
    state = ClusterState()
    state.apply(Kind.NODE, "ADDED", _node())
    state.apply(Kind.GPU, "ADDED", gpu("g1", "n1"))
    for p in pods:
        state.apply(Kind.POD, "ADDED", p)
    return state


def _used(state: ClusterState) -> Fraction:
    return state.gpu_usage()["g1"][0]


def test_a_resize_patches_request_limit_and_record_together_and_says_so() -> None:
    a = _bound("a", "ua", "10")
    state = _state(a, _bound("b", "ub", "20", "other"))
    api, events = FakeApi(Pods(a)), Events()
    result = asyncio.run(Resizer(state, api, events).resize(a, Target(Fraction(30), Fraction(40))))
    assert result.outcome.value == "resized" and result.tflops == 30
    (what, patch), = api.calls
    assert what == "merge_patch"
    assert patch == {"metadata": {"uid": "ua", "annotations": {
        "tensor-fusion.ai/allocated": "tflops=30,vram=4Gi", "tensor-fusion.ai/tflops-request": "30",
        "tensor-fusion.ai/tflops-limit": "40"}}}
    assert [e[1] for e in events.recorded] == ["ResourceScaledUp"]
    assert _used(state) == 50


def test_a_clamped_scale_up_is_patched_to_the_room_and_warned() -> None:
    a = _bound("a", "ua", "10")
    state = _state(a, _bound("b", "ub", "70", "other"))
    events = Events()
    result = asyncio.run(Resizer(state, FakeApi(Pods(a)), events).resize(a, Target(Fraction(50))))
    assert result.outcome.value == "clamped" and result.tflops == 30
    assert [(e[1], e[3]) for e in events.recorded] == [("ResourceScaledUp", "Normal"),
                                                       ("ResizeLimited", "Warning")]
    assert _used(state) == 100


def test_a_full_gpu_refuses_with_one_warning_and_no_patch() -> None:
    a = _bound("a", "ua", "10")
    state = _state(a, _bound("b", "ub", "90", "other"))
    api, events = FakeApi(Pods(a)), Events()
    result = asyncio.run(Resizer(state, api, events).resize(a, Target(Fraction(50))))
    assert result.outcome.value == "refused" and api.calls == []
    assert events.recorded == [("a", "ResizeLimited",
                                "not resized: its GPUs have no room for more (10 TFLOPS and 36Gi VRAM per "
                                "GPU for it)", "Warning")]


def test_a_failed_patch_gives_the_room_back() -> None:
    a = _bound("a", "ua", "10")
    state = _state(a)
    api, events = FakeApi(Pods(a)), Events()
    api.fail["merge_patch"] = ApiException(status=500, reason="boom")
    result = asyncio.run(Resizer(state, api, events).resize(a, Target(Fraction(60))))
    assert result.error.startswith("cannot patch pod ml/a") and events.recorded == []
    assert _used(state) == 10


def test_a_scale_down_frees_the_room_only_after_the_patch() -> None:
    a = _bound("a", "ua", "60")
    state = _state(a)
    seen: list[Fraction] = []
    api = FakeApi(Pods(a))
    original = api.merge_patch

    async def watching(namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        seen.append(_used(state))
        return await original(namespace, name, patch)

    api.merge_patch = watching  # type: ignore[method-assign]
    asyncio.run(Resizer(state, api, Events()).resize(a, Target(Fraction(6), Fraction(60), 2 * GIB)))
    assert seen == [60]  # still held while the pod was being patched
    assert _used(state) == 6 and state.gpu_usage()["g1"][1] == 2 * GIB


def _snapshot(tmp_path: Path) -> tuple[Path, Path]:
    profile = {"apiVersion": "tensor-fusion.ai/v1", "kind": "WorkloadProfile",
               "metadata": {"name": "prof", "namespace": "ml"},
               "spec": {"autoScalingConfig": {"autoSetResources": {
                   "enable": True, "targetResource": "compute", "initialDelayPeriod": "1m"}}}}
    a = _bound("a", "ua", "10")
    a["metadata"]["annotations"]["tensor-fusion.ai/workload-profile"] = "prof"
    objects = [_node(), gpu("g1", "n1"), a, _bound("b", "ub", "70", "other"), profile]
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("\n---\n".join(json.dumps(o) for o in objects))
    start = dt.datetime(2026, 1, 1, 11, 0, tzinfo=dt.UTC)
    samples = [{"namespace": "ml", "workload": "w", "worker": "a", "tflops": 40.0, "vram": 3 * GIB,
                "time": (start + dt.timedelta(seconds=30 * i)).strftime("%Y-%m-%dT%H:%M:%SZ")}
               for i in range(100)]
    usage = tmp_path / "samples.json"
    usage.write_text(json.dumps(samples))
    return cluster, usage


def test_plan_autoscale_prints_the_recommendation_and_what_the_resize_would_do(tmp_path, capsys) -> None:
    cluster, usage = _snapshot(tmp_path)
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
    cluster, usage = _snapshot(tmp_path)
    usage.write_text(json.dumps([{"namespace": "ml", "workload": "w", "worker": "a", "tflops": "lots"}]))
    rc = main(["plan", "--cluster", str(cluster), "--autoscale", "--samples", str(usage)])
    assert rc == 2
    assert "--samples: sample [0]: tflops 'lots' is not a non-negative number" in capsys.readouterr().err


def test_plan_autoscale_leaves_the_live_state_alone() -> None:
    a = _bound("a", "ua", "10")
    state = _state(a)
    source = StaticUsageSource()
    t0 = int(dt.datetime(2026, 1, 1, 11, tzinfo=dt.UTC).timestamp()) * 10**9
    source.add("ml", "w", [WorkerUsage("a", 40.0, GIB, t0 + i * 30 * NANO) for i in range(50)])
    objects = [dict(a, metadata={**a["metadata"], "annotations": {
        **a["metadata"]["annotations"], "tensor-fusion.ai/autoscale": "true"}})]
    out = plan_autoscale(state, objects, source, dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC), ZoneInfo("UTC"))
    assert out[0]["resizes"][0]["outcome"] == "resized"
    assert _used(state) == 10

"""``tf-extender plan`` on snapshots: launch, release, protect and skip lines, read-only."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.cli import main
from extender.plan_cmd import DEFAULT_PLANNERS, snapshot_inputs
from extender.planning.action import plan
from tests.unit.fixtures.plan import CATALOG, NOW, gpu_node, run_plan

YOUNG = "2026-01-01T11:59:00Z"
NODE_CLASS_REF = {
    "group": "karpenter.kwok.sh",
    "kind": "KWOKNodeClass",
    "version": "v1alpha1",
    "name": "default",
}


def karpenter_pool(name: str, ref: dict[str, str] | None = None, **capacity: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tensor-fusion.ai/v1",
        "kind": "GPUPool",
        "metadata": {"name": name},
        "spec": {
            "capacityConfig": capacity,
            "nodeManagerConfig": {
                "provisioningMode": "Karpenter",
                "nodeProvisioner": {"karpenterNodeClassRef": ref or NODE_CLASS_REF},
            },
        },
    }


def autoselect_pool(name: str, **capacity: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tensor-fusion.ai/v1",
        "kind": "GPUPool",
        "metadata": {"name": name},
        "spec": {"capacityConfig": capacity, "nodeManagerConfig": {"provisioningMode": "AutoSelect"}},
    }


def gpu_pod(name: str, pool: str, node: str | None = None, tflops: str = "10") -> dict[str, Any]:
    annotations = {
        "tensor-fusion.ai/tflops-request": tflops,
        "tensor-fusion.ai/vram-request": "1Gi",
        "tensor-fusion.ai/gpupool": pool,
    }
    if node:
        annotations["tensor-fusion.ai/gpu-ids"] = f"{node}-gpu-0"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": name, "annotations": annotations},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": "Running" if node else "Pending"},
    }


NODE_CLASS = {
    "apiVersion": "karpenter.kwok.sh/v1alpha1",
    "kind": "KWOKNodeClass",
    "metadata": {"name": "default"},
}


def test_empty_karpenter_pool_launches_the_cheapest_types(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = run_plan(
        tmp_path, [NODE_CLASS, karpenter_pool("kp", minResources={"tflops": 500})], capsys=capsys
    )
    assert [(x["action"], x["instanceType"], x["count"], x["hourlyPrice"]) for x in lines] == [
        ("launch", "big.x4", 1, 3.5),
        ("launch", "small.x1", 1, 1.0),
    ]
    assert lines[0]["pool"] == "kp" and lines[0]["capacityType"] == "on-demand" and lines[0]["zone"] is None
    assert "below minResources (500 TFLOPS, 0 VRAM)" in lines[0]["reason"]
    assert list(lines[0]) == [
        "action",
        "pool",
        "instanceType",
        "capacityType",
        "zone",
        "count",
        "hourlyPrice",
        "reason",
    ]


def test_pending_claims_count_as_capacity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    claim = {
        "apiVersion": "tensor-fusion.ai/v1",
        "kind": "GPUNodeClaim",
        "metadata": {"name": "kp-1", "labels": {"tensor-fusion.ai/gpupool": "kp"}},
        "spec": {"tflopsOffered": "400", "vramOffered": "96Gi", "gpuDeviceOffered": 4},
        "status": {"phase": "Creating"},
    }
    lines = run_plan(
        tmp_path, [NODE_CLASS, karpenter_pool("kp", minResources={"tflops": 500}), claim], capsys=capsys
    )
    assert [(x["instanceType"], x["count"]) for x in lines] == [("small.x1", 1)]


def test_missing_node_class_is_a_skip_not_a_launch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = run_plan(tmp_path, [karpenter_pool("kp", minResources={"tflops": 100})], capsys=capsys)
    assert [(x["action"], x["event"]) for x in lines] == [("skip", "NodeClassNotFound")]
    assert "KWOKNodeClass 'default'" in lines[0]["reason"]


def test_max_resources_is_never_exceeded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pool = karpenter_pool("kp", minResources={"tflops": 500}, maxResources={"tflops": 300})
    lines = run_plan(tmp_path, [NODE_CLASS, pool], capsys=capsys)
    assert [(x["action"], x.get("instanceType"), x.get("count")) for x in lines] == [
        ("launch", "small.x1", 3),
        ("skip", None, None),
    ]
    assert lines[1]["event"] == "MaxResourceConstraintReached"


def test_pending_pods_add_demand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # One Bound node full of a pod; a pending pod that fits no node for capacity asks for a new one.
    objects = [
        NODE_CLASS,
        karpenter_pool("kp"),
        gpu_node("n1", "kp"),
        gpu_pod("full", "kp", "n1", tflops="70"),
        gpu_pod("waiting", "kp", tflops="50"),
    ]
    lines = run_plan(tmp_path, objects, capsys=capsys)
    assert [(x["action"], x["instanceType"], x["count"]) for x in lines] == [("launch", "small.x1", 1)]
    assert "pending pods need 50 TFLOPS, 1Gi VRAM" in lines[0]["reason"]


def test_autoselect_compaction_releases_surplus_and_protects_warm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    objects = [
        autoselect_pool("auto", warmResources={"tflops": 70}),
        gpu_node("a1", "auto"),
        gpu_node("a2", "auto"),
        gpu_node("a3", "auto", created=YOUNG),
        gpu_node("busy", "auto", labels={"tensor-fusion.ai/should-delete": "true"}),
        gpu_node("pinned", "auto", labels={"tensor-fusion.ai/do-not-disrupt": "true"}),
        gpu_pod("w", "auto", "busy"),
    ]
    lines = run_plan(tmp_path, objects, capsys=capsys)
    got = [(x["action"], x["node"]) for x in lines]
    # pinned counts toward warm (70 TFLOPS), so a1, a2 and a3 are surplus; a3 is too young to go.
    assert got == [("release", "a1"), ("release", "a2"), ("unmark", "busy")]
    lines = run_plan(tmp_path, [o for o in objects if o["metadata"]["name"] != "pinned"], capsys=capsys)
    assert [(x["action"], x["node"]) for x in lines] == [
        ("release", "a1"),
        ("release", "a2"),
        ("protect", "a3"),
        ("unmark", "busy"),
    ]


def test_protection_time_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    objects = [autoselect_pool("auto"), gpu_node("a3", "auto", created=YOUNG)]
    assert run_plan(tmp_path, objects, capsys=capsys) == []
    lines = run_plan(tmp_path, objects, "--protection-time", "30", capsys=capsys)
    assert [(x["action"], x["node"]) for x in lines] == [("release", "a3")]


def test_karpenter_mode_releases_by_deleting_its_nodeclaim() -> None:
    claim = {
        "apiVersion": "tensor-fusion.ai/v1",
        "kind": "GPUNodeClaim",
        "metadata": {
            "name": "kp-1",
            "labels": {"tensor-fusion.ai/gpupool": "kp"},
            "annotations": {"tensor-fusion.ai/hourly-pricing": "1.0"},
        },
        "spec": {"tflopsOffered": "70", "vramOffered": "24Gi", "gpuDeviceOffered": 1},
        "status": {"phase": "Bound"},
    }
    nodeclaim = {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {"name": "kp-1"},
        "status": {"nodeName": "n1"},
    }
    objects = [NODE_CLASS, karpenter_pool("kp"), gpu_node("n1", "kp"), gpu_node("n2", "kp"), claim, nodeclaim]
    inputs = snapshot_inputs(objects, now=dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC))
    actions = [a.as_json() for a in plan(inputs, DEFAULT_PLANNERS)]
    # n2 has no claim of ours: it is never released in Karpenter mode
    assert actions == [
        {"action": "release", "pool": "kp", "node": "n1", "nodeClaim": "kp-1", "reason": actions[0]["reason"]}
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--now", "yesterday"], "not an RFC 3339 time"),
        (["--catalog", "/nonexistent/catalog.yaml"], "/nonexistent/catalog.yaml: no such file"),
    ],
)
def test_bad_arguments_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    snapshot = tmp_path / "s.yaml"
    snapshot.write_text("")
    assert main(["plan", "--cluster", str(snapshot), *args]) == 2
    assert message in capsys.readouterr().err


def test_bad_catalog_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot, catalog = tmp_path / "s.yaml", tmp_path / "c.yaml"
    snapshot.write_text("")
    catalog.write_text("instanceTypes: [{name: x}]")
    assert main(["plan", "--cluster", str(snapshot), "--catalog", str(catalog)]) == 2
    assert "give tflopsPerGPU" in capsys.readouterr().err


def test_a_multi_gpu_pod_gets_a_node_with_enough_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 4 GPUs x 10 TFLOPS: the cheapest TFLOPS (one small.x1) could never hold it; the pool buys a big.x4.
    pod = gpu_pod("wide", "kp")
    pod["metadata"]["annotations"]["tensor-fusion.ai/gpu-count"] = "4"
    lines = run_plan(tmp_path, [NODE_CLASS, karpenter_pool("kp"), pod], capsys=capsys)
    assert [(x["instanceType"], x["count"]) for x in lines] == [("big.x4", 1)]
    # a pod that fits small nodes keeps the cheapest choice
    lines = run_plan(tmp_path, [NODE_CLASS, karpenter_pool("kp"), gpu_pod("narrow", "kp")], capsys=capsys)
    assert [(x["instanceType"], x["count"]) for x in lines] == [("small.x1", 1)]


@pytest.mark.parametrize("output", ["table", "yaml"])
def test_plan_prints_a_table_or_yaml_on_request(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                output: str) -> None:
    snapshot = tmp_path / "snapshot.yaml"
    snapshot.write_text(yaml.safe_dump_all([NODE_CLASS, karpenter_pool("kp", minResources={"tflops": 500})]))
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG)
    assert main(["plan", "--cluster", str(snapshot), "--catalog", str(catalog), "--now", NOW,
                 "-o", output]) == 0
    out = capsys.readouterr().out
    if output == "yaml":
        actions = yaml.safe_load(out)
        assert [(a["action"], a["instanceType"]) for a in actions] == [("launch", "big.x4"),
                                                                      ("launch", "small.x1")]
    else:
        lines = out.splitlines()
        assert lines[0].split() == ["ACTION", "POOL", "NODE", "INSTANCE", "TYPE", "CAPACITY", "COUNT",
                                    "$/HOUR", "REASON"]
        rows = [line.split()[:7] for line in lines[1:]]
        assert [r[:4] for r in rows] == [["launch", "kp", "-", "big.x4"], ["launch", "kp", "-", "small.x1"]]
        assert all(r[5].isdigit() and float(r[6]) > 0 for r in rows), rows  # the count and the hourly price


def test_a_pending_pod_its_quota_holds_is_a_quota_hold_and_no_demand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quota = {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUResourceQuota",
             "metadata": {"name": "q", "namespace": "ml"},
             "spec": {"total": {"requests": {"tflops": "100", "vram": "1Ti"}}}}
    objects = [NODE_CLASS, karpenter_pool("kp"), gpu_node("n1", "kp"),
               gpu_pod("full", "kp", "n1", tflops="70"), gpu_pod("waiting", "kp", tflops="50"), quota]
    lines = run_plan(tmp_path, objects, capsys=capsys)
    assert [(x["action"], x.get("pod")) for x in lines] == [("quota-hold", "ml/waiting")]
    assert "used 70 TFLOPS, requested 50 TFLOPS, cap 100 TFLOPS" in lines[0]["reason"]
    quota["spec"]["total"]["requests"]["tflops"] = "120"  # room for it: a node is bought as before
    lines = run_plan(tmp_path, objects, capsys=capsys)
    assert [x["action"] for x in lines] == ["launch"]

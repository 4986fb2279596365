"""Simulator: places pods in order with the extender's code and reports what a user compares."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.simulate_cmd import add_simulate_arguments, main_simulate, read_objects, simulate
from tests.unit.fixtures.simulate import CLUSTER, PODS, pod


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (None, [("b", ["b-0"]), ("b", ["b-1"]), ("a", ["a-0"])]),  # the pool's CompactFirst
        ("CompactFirst", [("b", ["b-0"]), ("b", ["b-1"]), ("a", ["a-0"])]),
        # a-0 at load 22 makes node a (mean 11) busier than b (mean 8): the second pod goes to b
        ("LowLoadFirst", [("a", ["a-0"]), ("b", ["b-1"]), ("a", ["a-1"])]),
        ("NodeCompactGPULowLoad", [("b", ["b-1"]), ("b", ["b-0"]), ("a", ["a-0"])]),
    ],
)
def test_pods_are_placed_in_order_and_later_pods_see_earlier_ones(
    mode: str | None, expected: list[tuple[str, list[str]]]
) -> None:
    results = simulate(CLUSTER, PODS, mode)
    assert [(r["node"], r["gpus"]) for r in results[:3]] == expected
    assert [r["pod"] for r in results] == ["ml/one", "ml/two", "ml/three", "ml/huge"]


def test_unplaced_pod_has_a_reason_with_numbers() -> None:
    huge = simulate(CLUSTER, PODS, None)[3]
    assert huge == {
        "pod": "ml/huge",
        "node": None,
        "gpus": [],
        "reason": "0/2 nodes fit: 2 nodes: request 500 TFLOPS exceeds the largest GPU here (100 TFLOPS)",
    }


def test_invalid_pod_is_reported_not_raised() -> None:
    bad = pod("bad", "lots")
    [result] = simulate(CLUSTER, [bad], None)
    assert result["node"] is None and "tensor-fusion.ai/tflops-request" in result["reason"]


def test_read_objects_unpacks_lists() -> None:
    text = (
        yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [pod("x", "1")]})
        + "---\n"
        + yaml.safe_dump({"kind": "GPUList", "items": [{"metadata": {"name": "g"}}]})
    )
    assert [(o["kind"], o["metadata"]["name"]) for o in read_objects(text)] == [("Pod", "x"), ("GPU", "g")]


def test_main_prints_one_json_line_per_pod_and_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, pods = tmp_path / "cluster.yaml", tmp_path / "pods.yaml"
    cluster.write_text(yaml.safe_dump_all(CLUSTER))
    pods.write_text(yaml.safe_dump({"kind": "PodList", "items": PODS[:2]}))
    parser = argparse.ArgumentParser()
    add_simulate_arguments(parser)
    code = main_simulate(
        parser.parse_args(["--cluster", str(cluster), "--pods", str(pods), "--mode", "LowLoadFirst"])
    )
    out, err = capsys.readouterr()
    assert code == 0
    assert [json.loads(line) for line in out.splitlines()] == [
        {"pod": "ml/one", "node": "a", "gpus": ["a-0"]},
        {"pod": "ml/two", "node": "b", "gpus": ["b-1"]},
    ]
    assert "a: 1/2 GPUs used, TFLOPS 25.0%, VRAM 5.0%" in err
    assert "b: 2/2 GPUs used, TFLOPS 40.0%, VRAM 10.0%" in err


def test_main_reports_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(
        cluster=str(tmp_path / "nope.yaml"), pods=str(tmp_path / "nope.yaml"), mode=None
    )
    assert main_simulate(args) == 2
    assert "nope.yaml" in capsys.readouterr().err


@pytest.mark.parametrize("output", ["table", "yaml"])
def test_main_prints_a_table_or_yaml_on_request(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                output: str) -> None:
    cluster, pods = tmp_path / "cluster.yaml", tmp_path / "pods.yaml"
    cluster.write_text(yaml.safe_dump_all(CLUSTER))
    pods.write_text(yaml.safe_dump({"kind": "PodList", "items": PODS[:2]}))
    parser = argparse.ArgumentParser()
    add_simulate_arguments(parser)
    assert main_simulate(parser.parse_args(["--cluster", str(cluster), "--pods", str(pods), "--mode",
                                            "LowLoadFirst", "-o", output])) == 0
    out = capsys.readouterr().out
    if output == "yaml":
        assert yaml.safe_load(out) == [{"pod": "ml/one", "node": "a", "gpus": ["a-0"]},
                                       {"pod": "ml/two", "node": "b", "gpus": ["b-1"]}]
    else:
        assert out.splitlines() == ["POD     NODE  GPUS  REASON", "ml/one  a     a-0   -",
                                    "ml/two  b     b-1   -"]


def test_quotas_in_the_cluster_hold_the_pods_their_totals_refuse() -> None:
    quota = {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUResourceQuota",
             "metadata": {"name": "q", "namespace": "ml"},
             "spec": {"total": {"requests": {"tflops": "100", "vram": "1Ti"}}}}
    results = simulate([*CLUSTER, quota], PODS, None)  # 30 bound already: one (50) fits, two (50) does not
    assert [(r["pod"], r["node"] is not None, r.get("heldByQuota", False)) for r in results] == [
        ("ml/one", True, False), ("ml/two", False, True), ("ml/three", False, True), ("ml/huge", False, True)]
    assert "used 80 TFLOPS, requested 50 TFLOPS, cap 100 TFLOPS" in results[1]["reason"]


@pytest.mark.parametrize(("pods", "flag", "code"), [
    (PODS, "--fail-on-unplaced", 3),  # "huge" finds no node
    (PODS, "--no-fail-on-unplaced", 0),
    (PODS[:2], "--fail-on-unplaced", 0),  # every pod placed
])
def test_fail_on_unplaced_gates_ci_on_pods_that_found_no_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pods: list[dict[str, Any]], flag: str, code: int
) -> None:
    cluster, pod_file = tmp_path / "cluster.yaml", tmp_path / "pods.yaml"
    cluster.write_text(yaml.safe_dump_all(CLUSTER))
    pod_file.write_text(yaml.safe_dump_all(pods))
    parser = argparse.ArgumentParser()
    add_simulate_arguments(parser)
    args = parser.parse_args(["--cluster", str(cluster), "--pods", str(pod_file), flag])
    assert main_simulate(args) == code
    err = capsys.readouterr().err
    assert ("1 of 4 pods unplaced" in err) == (code == 3)


@pytest.mark.parametrize(("content", "needle"), [
    (b"kind: Pod\nmetadata: {name: caf\xe9}\n", "bad.yaml:2: not UTF-8 text"),
    (b"kind: Node\nspec: {replicas: " + b"9" * 5000 + b"}\n",
     "bad.yaml: not readable YAML: a number is too long"),
])
def test_unreadable_inputs_are_one_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         content: bytes, needle: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(content)
    args = argparse.Namespace(cluster=str(bad), pods=str(bad), mode=None)
    assert main_simulate(args) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_an_endless_input_is_refused_not_read_until_memory_runs_out(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from extender.common import yamlio

    monkeypatch.setattr(yamlio.read_text_file, "__defaults__", (1024 * 1024,))
    args = argparse.Namespace(cluster="/dev/zero", pods="/dev/zero", mode=None)
    assert main_simulate(args) == 2
    assert "/dev/zero: larger than 1 MiB; not read" in capsys.readouterr().err


def gang(name: str, key: str, required: int, tflops: str = "100") -> dict:
    p = pod(name, tflops)
    p["metadata"]["annotations"].update({"tensor-fusion.ai/gang-group-key": f"ml/{key}",
                                         "tensor-fusion.ai/gang-required-members": str(required),
                                         "tensor-fusion.ai/gang-desired-members": str(required)})
    return p


def test_gangs_are_placed_all_together_or_not_at_all() -> None:
    cluster = [obj for obj in CLUSTER if obj.get("kind") != "Pod"]  # four idle GPUs of 100 TFLOPS
    pods = [gang("a0", "a", 3), gang("b0", "b", 2), gang("a1", "a", 3), gang("b1", "b", 2),
            gang("a2", "a", 3), gang("c0", "c", 2)]
    results = {r["pod"]: r for r in simulate(cluster, pods, None)}
    # b's quorum comes first and takes two GPUs; a then needs three of the two left: none of a is placed
    assert [bool(results[f"ml/b{i}"]["node"]) for i in range(2)] == [True, True]
    assert [results[f"ml/a{i}"]["node"] for i in range(3)] == [None, None, None]
    assert "gang ml/a: the gang's 3 members do not fit together (2 would)" in results["ml/a0"]["reason"]
    assert results["ml/c0"]["reason"] == "gang ml/c: waiting for 1 of 2 members"

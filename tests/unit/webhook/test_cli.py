"""``tf-webhook mutate``: what a user sees for their manifest, and the exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.fixtures.webhook import OBJECTS, pod, tf
from webhook.cli import main


@pytest.fixture
def objects_file(tmp_path: Path) -> Path:
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all(OBJECTS))
    return path


def write(tmp_path: Path, name: str, data: Any) -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def test_mutate_prints_the_mutated_pod_as_yaml(tmp_path: Path, objects_file: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    pod_file = write(tmp_path, "pod.yaml", pod(tf(tflops_request="2", vram_limit="1024Mi")))
    assert main(["mutate", "--pod", str(pod_file), "--objects", str(objects_file)]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["metadata"]["annotations"]["tensor-fusion.ai/vram-limit"] == "1Gi"
    assert out["metadata"]["labels"]["tensor-fusion.ai/gpupool"] == "pool-a"
    assert out["spec"]["schedulerName"] == "tensor-fusion-scheduler"
    assert out["spec"]["containers"][0]["resources"]["limits"] == {"tensor-fusion.ai/index_0": "1"}


def test_mutate_json_output_namespace_and_scheduler(tmp_path: Path, objects_file: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    p = pod(tf(workload_profile="small"))
    del p["metadata"]["namespace"]
    pod_file = write(tmp_path, "pod.json", json.dumps(p))
    assert main(["mutate", "--pod", str(pod_file), "--objects", str(objects_file), "--namespace", "team",
                 "-o", "json", "--scheduler-name", "other"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["metadata"]["annotations"]["tensor-fusion.ai/qos"] == "critical"  # from the team profile
    assert out["spec"]["schedulerName"] == "other"


def test_mutate_objects_as_a_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    objects = write(tmp_path, "list.yaml", {"apiVersion": "v1", "kind": "List", "items": OBJECTS})
    pod_file = write(tmp_path, "pod.yaml", pod(tf(tflops_request="1", gpupool="pool-b")))
    assert main(["mutate", "--pod", str(pod_file), "--objects", str(objects)]) == 0
    assert "tensor-fusion.ai/gpupool: pool-b" in capsys.readouterr().out


def test_denial_goes_to_stderr_with_exit_1(tmp_path: Path, objects_file: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    pod_file = write(tmp_path, "pod.yaml", pod(tf(tflops_request="1", isolation="total")))
    assert main(["mutate", "--pod", str(pod_file), "--objects", str(objects_file)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert 'tensor-fusion.ai/isolation="total"' in captured.err


def test_without_objects_there_is_no_default_pool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod_file = write(tmp_path, "pod.yaml", pod(tf(tflops_request="1")))
    assert main(["mutate", "--pod", str(pod_file)]) == 1
    assert "no GPUPool is annotated as the default pool" in capsys.readouterr().err


def test_pod_without_opt_in_is_printed_unchanged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = pod(tf(tflops_request="1"), labels={})
    p["metadata"]["labels"] = {}
    pod_file = write(tmp_path, "pod.yaml", p)
    assert main(["mutate", "--pod", str(pod_file), "-o", "json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == p
    assert "leaves it untouched" in captured.err


@pytest.mark.parametrize(
    ("pod_text", "needle"),
    [("kind: Deployment\n", "Deployment has no spec.template"),
     ("kind: Service\n", "kind 'Service' has no pods"),
     ("kind: [", "not valid YAML"),
     ("kind: Pod\n---\nkind: Pod\n", "expected exactly one object (a Pod or a workload), found 2")],
)
def test_bad_input_files_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], pod_text: str,
                                needle: str) -> None:
    pod_file = write(tmp_path, "pod.yaml", pod_text)
    assert main(["mutate", "--pod", str(pod_file)]) == 2
    assert needle in capsys.readouterr().err


def test_missing_files_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod_file = write(tmp_path, "pod.yaml", pod(tf(tflops_request="1")))
    assert main(["mutate", "--pod", str(tmp_path / "nope.yaml")]) == 2
    assert main(["mutate", "--pod", str(pod_file), "--objects", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_serve_requires_a_cert_dir(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve"])
    assert exited.value.code == 2
    assert "--cert-dir" in capsys.readouterr().err


def test_serve_with_unusable_certificates_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("extender.common.logs.setup_logging", lambda level: None)
    assert main(["serve", "--cert-dir", str(tmp_path), "--port", "0", "--log-level", "error"]) == 1


def _workload(kind: str, api_version: str, pod_spec: dict[str, Any]) -> dict[str, Any]:
    template = {"metadata": {k: v for k, v in pod_spec["metadata"].items() if k not in ("name", "namespace")},
                "spec": pod_spec["spec"]}
    spec: dict[str, Any] = {"template": template}
    if kind == "CronJob":
        spec = {"schedule": "@daily", "jobTemplate": {"spec": {"template": template}}}
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": "trainer", "namespace": "team"},
            "spec": spec}


@pytest.mark.parametrize(("kind", "api_version"), [
    ("Deployment", "apps/v1"), ("StatefulSet", "apps/v1"), ("Job", "batch/v1"), ("CronJob", "batch/v1"),
    ("DaemonSet", "apps/v1"), ("ReplicaSet", "apps/v1"),
])
def test_mutate_takes_a_workload_and_shows_the_pod_its_template_makes(
    tmp_path: Path, objects_file: Path, capsys: pytest.CaptureFixture[str], kind: str, api_version: str
) -> None:
    workload = _workload(kind, api_version, pod(tf(tflops_request="2")))
    path = write(tmp_path, "workload.yaml", workload)
    assert main(["mutate", "--pod", str(path), "--objects", str(objects_file)]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["kind"] == "Pod" and out["metadata"]["namespace"] == "team"
    assert out["metadata"]["labels"]["tensor-fusion.ai/workload"] == "trainer"
    assert out["metadata"]["annotations"]["tensor-fusion.ai/tflops-request"] == "2"
    assert out["spec"]["schedulerName"] == "tensor-fusion-scheduler"


def test_mutate_reports_every_denial_of_a_manifest_at_once(
    tmp_path: Path, objects_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = pod(tf(tflops_request="lots", isolation="total", vram_request="-1Gi"))
    path = write(tmp_path, "deploy.yaml", _workload("Deployment", "apps/v1", bad))
    assert main(["mutate", "--pod", str(path), "--objects", str(objects_file)]) == 1
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and all(line.startswith("denied: ") for line in lines), lines
    assert len(lines) == 3, lines
    for needle in ('tflops-request="lots"', 'isolation="total"', 'vram-request="-1Gi"'):
        assert sum(needle in line for line in lines) == 1, (needle, lines)


def test_unreadable_inputs_exit_2_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"kind: Pod\nmetadata: {name: caf\xe9}\n")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"kind: Pod\nspec: {priority: " + b"9" * 5000 + b"}\n")
    pod_file = write(tmp_path, "pod.yaml", pod(tf(tflops_request="1")))
    assert main(["mutate", "--pod", str(bad)]) == 2
    assert main(["mutate", "--pod", str(big)]) == 2
    assert main(["mutate", "--pod", str(pod_file), "--objects", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "latin1.yaml:2: not UTF-8 text" in err and "big.yaml: not readable YAML" in err
    assert "Traceback" not in err

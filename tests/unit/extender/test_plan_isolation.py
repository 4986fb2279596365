"""``tf-extender plan`` and ``simulate`` on snapshots with malformed objects: every good object is planned as
if the bad ones were absent, each bad one is named on stderr, and nothing ends in a traceback. Every field of
each kind the tools read is set in turn to each of the sweep's eighteen wrong values."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.cli import main
from extender.simulate_cmd import main_simulate
from tests.unit.fixtures.plan import CATALOG, NOW, gpu_node
from tests.unit.fixtures.simulate import CLUSTER, PODS
from tests.unit.fixtures.sweep import WRONG_VALUES, clearly_wrong, paths, with_value

REF = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "version": "v1alpha1", "name": "default"}
NODE_CLASS = {"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass",
              "metadata": {"name": "default"}}


def pool(name: str) -> dict[str, Any]:
    return {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool", "metadata": {"name": name},
            "spec": {"capacityConfig": {"minResources": {"tflops": "500", "vram": "10Gi"},
                                        "maxResources": {"tflops": "2000", "vram": "1000Gi"}},
                     "nodeManagerConfig": {"provisioningMode": "Karpenter",
                                           "nodeCompaction": {"period": "5m"},
                                           "nodeProvisioner": {"karpenterNodeClassRef": dict(REF),
                                                               "gpuTaints": [{"key": "gpu"}]}}}}


BAD_KINDS: dict[str, dict[str, Any]] = {
    "GPUPool": pool("bad"),
    "GPUNodeClaim": {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUNodeClaim",
                     "metadata": {"name": "bad-1", "labels": {"tensor-fusion.ai/gpupool": "bad"},
                                  "annotations": {"tensor-fusion.ai/computing-vendor":
                                                  '{"type":"aws","params":"x"}'}},
                     "spec": {"tflopsOffered": "400", "vramOffered": "96Gi", "gpuDeviceOffered": 4},
                     "status": {"phase": "Creating", "nodeName": "n"}},
    "TensorFusionCluster": {"apiVersion": "tensor-fusion.ai/v1", "kind": "TensorFusionCluster",
                            "metadata": {"name": "bad"},
                            "spec": {"computingVendor": {"type": "aws", "params": {"defaultRegion": "r"}},
                                     "gpuPools": [{"name": "bad", "specTemplate": {}}]}},
    "SchedulingConfigTemplate": {"apiVersion": "tensor-fusion.ai/v1", "kind": "SchedulingConfigTemplate",
                                 "metadata": {"name": "bad"},
                                 "spec": {"placement": {"mode": "CompactFirst"}}},
    "Node": gpu_node("bad-node", "bad"),
}


def _plan(tmp_path: Path, objects: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
          ) -> tuple[int, list[dict[str, Any]], str]:
    snapshot = tmp_path / "snapshot.yaml"
    snapshot.write_text(yaml.safe_dump_all(objects, default_style=None))
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG)
    code = main(["plan", "--cluster", str(snapshot), "--catalog", str(catalog), "--now", NOW])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def _good_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("pool") == "good"]


@pytest.mark.parametrize("kind", list(BAD_KINDS))
def test_a_malformed_object_of_any_kind_leaves_the_good_pool_planned_as_if_it_were_absent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    good = [NODE_CLASS, pool("good")]
    code, rows, err = _plan(tmp_path, good, capsys)
    assert code == 0 and _good_rows(rows), err
    expected = _good_rows(rows)
    bad = BAD_KINDS[kind]
    failures = []
    for path in paths(bad):
        if path[:2] == ("metadata", "name") or path in (("kind",), ("apiVersion",)):
            continue
        original = bad
        for part in path:
            original = original[part]
        for value in WRONG_VALUES:
            obj = with_value(bad, path, value)
            where = f"{kind} {'.'.join(map(str, path))}={value!r:.30}"
            try:
                code, rows, err = _plan(tmp_path, [*good, obj], capsys)
            except Exception as exc:
                failures.append(f"{where}: raised {type(exc).__name__}: {exc}"[:300])
                continue
            if code != 0 or "Traceback" in err:
                failures.append(f"{where}: exit {code}: {err[-300:]}")
            elif _good_rows(rows) != expected:
                failures.append(f"{where}: the good pool's plan changed: {_good_rows(rows)}")
            elif kind == "GPUPool" and path[0] == "spec" and clearly_wrong(original, value) \
                    and "GPUPool bad" not in err:
                failures.append(f"{where}: the bad pool is not named on stderr: {err[-300:]}")
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:40])


def test_the_issues_shapes_are_named_once_each_on_stderr(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    bad_pools = []
    for name, manager in (("p-string", {"nodeCompaction": "10m"}),
                          ("p-period", {"nodeCompaction": {"period": "99999999999999h"}}),
                          ("p-taints", {"nodeProvisioner": {"gpuTaints": 5}})):
        obj = pool(name)
        obj["spec"]["nodeManagerConfig"].update(manager)
        bad_pools.append(obj)
    broken = copy.deepcopy(pool("p-spec"))
    broken["spec"] = [1]
    code, rows, err = _plan(tmp_path, [NODE_CLASS, pool("good"), *bad_pools, broken], capsys)
    assert code == 0 and _good_rows(rows)
    for needle in ("skipped GPUPool p-string: spec.nodeManagerConfig.nodeCompaction='10m': expected an "
                   "object",
                   "skipped GPUPool p-period: left alone: nodeCompaction.period: '99999999999999h' is longer",
                   "nodeProvisioner.gpuTaints=5: expected a list",
                   "skipped GPUPool p-spec: spec: expected an object"):
        assert err.count(needle) == 1, err


def test_simulate_places_the_good_pods_beside_malformed_objects_and_names_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster, pods = tmp_path / "cluster.yaml", tmp_path / "pods.yaml"
    cluster.write_text(yaml.safe_dump_all(CLUSTER))
    pods.write_text(yaml.safe_dump_all(PODS))
    assert main_simulate(argparse.Namespace(cluster=str(cluster), pods=str(pods), mode=None)) == 0
    expected = capsys.readouterr().out
    bad = [{"kind": "GPUPool", "metadata": {"name": "x"}, "spec": {"nodeManagerConfig": [1]}},
           {"kind": "SchedulingConfigTemplate", "metadata": {"name": "t"},
            "spec": {"placement": "CompactFirst"}},
           {"kind": "Node", "metadata": {"name": "n", "labels": [1]}},
           {"kind": "GPU", "metadata": {"name": "g"}, "status": {"capacity": 5}}]
    cluster.write_text(yaml.safe_dump_all([*CLUSTER, *bad]))
    pods.write_text(yaml.safe_dump_all([*PODS, {"kind": "Pod", "metadata": {"name": "p", "annotations": 5}}]))
    assert main_simulate(argparse.Namespace(cluster=str(cluster), pods=str(pods), mode=None)) == 0
    out, err = capsys.readouterr()
    assert out == expected
    for needle in ("skipped GPUPool x: spec.nodeManagerConfig=[1]: expected an object",
                   "skipped SchedulingConfigTemplate t: spec.placement='CompactFirst': expected an object",
                   "skipped Node n: metadata.labels: expected an object of strings, got a list",
                   "skipped GPU g: status.capacity=5: expected an object",
                   "skipped Pod p: metadata.annotations: expected an object of strings"):
        assert needle in err, err

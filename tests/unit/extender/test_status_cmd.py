"""tf-extender status: the per-pool report and its two renderings."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from extender import cli
from extender.kube import resources
from extender.status_cmd import StatusSnapshot, build_report, pending_reason, read_snapshot, render_table
from tests.unit.fixtures.fakes import POOL, pod
from tests.unit.fixtures.status import Closable, status_snapshot


def test_report_per_pool():
    report = build_report(status_snapshot())
    pools = {p["name"]: p for p in report["pools"]}
    assert list(pools) == ["inference", POOL]
    a = pools[POOL]
    assert (a["mode"], a["provisioning"], a["default"], a["nodes"], a["gpus"], a["partiallyUsedGPUs"]) == (
        "CompactFirst", "AutoSelect", True, 2, 3, 2)  # g2: TFLOPS full, VRAM not
    assert a["tflops"] == {"total": "300", "allocated": "130", "free": "170"}
    assert a["vram"] == {"total": "120Gi", "allocated": "8Gi", "free": "112Gi"}
    assert a["pendingPods"] == [{"pod": "ml/big", "reason": "0/3 nodes are available: need 90 TFLOPS free"}]
    assert a["nodeClaimsInFlight"] == [{"kind": "NodeClaim", "name": "gpu-tf-abc", "nodePool": "gpu",
                                        "forPod": "ml/big", "state": "Launched"}]
    b = pools["inference"]
    assert (b["mode"], b["provisioning"], b["default"], b["gpus"]) == (
        "NodeCompactGPULowLoad", "Karpenter", False, 1)
    assert b["tflops"]["free"] == "200" and b["pendingPods"] == []
    assert b["nodeClaimsInFlight"] == [{"kind": "GPUNodeClaim", "name": "inference-x1",
                                        "instanceType": "p5.48xlarge", "state": "Creating"}]


def test_table_names_every_pool_pending_pod_and_claim():
    text = render_table(build_report(status_snapshot()))
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["POOL", "MODE", "PROVISIONING"]
    row = next(line for line in lines if line.startswith(POOL + "*"))
    assert row.split() == [POOL + "*", "CompactFirst", "AutoSelect", "2", "3", "130/300", "170",
                           "8Gi/120Gi", "112Gi", "2", "1", "1"]
    assert "  ml/big (pool pool-a): 0/3 nodes are available: need 90 TFLOPS free" in lines
    assert "  NodeClaim gpu-tf-abc (pool pool-a, NodePool gpu, for ml/big): Launched" in lines
    assert "  GPUNodeClaim inference-x1 (pool inference, instance type p5.48xlarge): Creating" in lines


def test_empty_cluster():
    assert render_table(build_report(StatusSnapshot([], [], [], [], [], []))) == (
        "No GPU pools, GPUs or GPU pods found.\n")


def test_pending_pod_of_an_unknown_pool_is_still_shown():
    stray = pod("stray", "u-s")
    stray["metadata"]["annotations"]["tensor-fusion.ai/gpupool"] = "nowhere"
    report = build_report(StatusSnapshot([], [], [], [], [stray], []))
    rows = [(p["name"], p["exists"], len(p["pendingPods"])) for p in report["pools"]]
    assert rows == [("nowhere", False, 1)]
    assert "nowhere (no GPUPool)" in render_table(report)


@pytest.mark.parametrize(("status", "meta", "reason"), [
    ({}, {}, "not tried by the scheduler yet"),
    ({"nominatedNodeName": "n1"}, {}, "preempting lower-priority pods on n1"),
    ({}, {"deletionTimestamp": "2026-01-01T00:00:00Z"}, "being deleted"),
    ({"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}, {},
     "Unschedulable"),
])
def test_pending_reason(status: dict[str, Any], meta: dict[str, Any], reason: str):
    assert pending_reason({"metadata": meta, "status": status}) == reason


def test_snapshot_lists_gpu_pods_only_and_every_kind():
    asked: list[tuple[str, str | None]] = []

    def list_all(resource: resources.Resource, selector: str | None) -> list[dict[str, Any]]:
        asked.append((resource.plural, selector))
        return []

    read_snapshot(list_all)
    assert ("pods", "tensor-fusion.ai/component=worker") in asked
    assert {p for p, _ in asked} == {"nodes", "gpus", "gpupools", "schedulingconfigtemplates", "pods",
                                     "nodeclaims", "gpunodeclaims", "gpuresourcequotas", "leases"}
    assert ("leases", "field:metadata.name=tensor-fusion-expander") in asked


def test_a_user_who_may_not_list_leases_still_gets_the_pools():
    def list_all(resource: resources.Resource, selector: str | None) -> list[dict[str, Any]]:
        if resource.plural == "leases":
            raise PermissionError("leases is forbidden")
        return []

    assert read_snapshot(list_all).leases == []


def lease(namespace: str, name: str, holder: str | None) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name},
            "spec": {"holderIdentity": holder, "renewTime": "2026-12-04T14:00:00.000000Z"}}


def test_the_report_says_which_replica_leads():
    snapshot = status_snapshot()
    snapshot = StatusSnapshot(**{**snapshot.__dict__, "leases": [
        lease("tensor-fusion-sys", "tensor-fusion-expander", "tfe-scheduler-7d9-abcde_1f2e3d4c"),
        lease("tensor-fusion-sys", "tensor-fusion-scheduler", None),
        lease("kube-node-lease", "node-1", "node-1")]})
    report = build_report(snapshot)
    assert report["leaders"] == [
        {"lease": "tensor-fusion-sys/tensor-fusion-expander", "role": "controllers",
         "holder": "tfe-scheduler-7d9-abcde_1f2e3d4c", "renewed": "2026-12-04T14:00:00.000000Z"},
        {"lease": "tensor-fusion-sys/tensor-fusion-scheduler", "role": "scheduler", "holder": "",
         "renewed": "2026-12-04T14:00:00.000000Z"}]
    lines = render_table(report).splitlines()
    assert lines[lines.index("Leaders:") + 1:] == [
        "  controllers (Lease tensor-fusion-sys/tensor-fusion-expander): tfe-scheduler-7d9-abcde_1f2e3d4c, "
        "renewed 2026-12-04T14:00:00.000000Z",
        "  scheduler (Lease tensor-fusion-sys/tensor-fusion-scheduler): released, none yet"]


def test_cli_parses_status(tmp_path: Any, capsys: pytest.CaptureFixture[str]):
    args = cli.build_parser().parse_args(["status", "-o", "json", "--kubeconfig", "k"])
    assert (args.command, args.output, args.kubeconfig) == ("status", "json", "k")
    assert cli.main(["status", "--kubeconfig", str(tmp_path / "missing")]) == 2
    assert "cannot load Kubernetes configuration" in capsys.readouterr().err


def test_json_output_is_the_report(monkeypatch: pytest.MonkeyPatch):
    from extender import status_cmd

    monkeypatch.setattr(status_cmd, "read_snapshot", lambda _lister: status_snapshot())
    monkeypatch.setattr("extender.kube.client.load_api_client", lambda _path, context=None: Closable())
    out = io.StringIO()
    args = cli.build_parser().parse_args(["status", "-o", "json"])
    assert status_cmd.main_status(args, out) == 0
    assert json.loads(out.getvalue()) == build_report(status_snapshot())


def test_allocated_vs_used_per_pool_node_gpu_and_workload():
    from extender.status_cmd import report_state
    from extender.status_usage import render_usage, usage_report

    snapshot = status_snapshot()
    shared = pod("c", "u-c", tflops="10", node="n1", gpu_ids="g0", phase="Running")
    shared["metadata"]["labels"]["tensor-fusion.ai/workload"] = "trainer"
    snapshot.pods.append(shared)
    # g0 (100 TFLOPS) 40 % busy, held 30 by a and 10 by c: 30 and 10 of the 40 used; g2 unreported
    usage = usage_report(report_state(snapshot), snapshot.pods, {"g0": 40.0, "g1": 0.0, "h0": 0.0},
                         {"g0": 4096.0, "g1": 0.0, "h0": 0.0})
    workloads = {w["workload"]: w for w in usage["workloads"]}
    assert workloads["trainer"]["tflops"] == {"allocated": "10", "used": "10"}
    assert workloads["a"]["tflops"] == {"allocated": "30", "used": "30"}
    assert workloads["b"]["tflops"] == {"allocated": "100", "used": None}  # dcgm-exporter says nothing
    nodes = {n["node"]: n for n in usage["nodes"]}
    assert nodes["n1"]["tflops"] == {"allocated": "40", "used": "40"}
    assert nodes["n1"]["vram"]["used"] == "4Gi"
    gpus = {g["UUID"]: g for g in usage["gpus"]}
    assert gpus["g1"]["tflops"] == {"allocated": "0", "used": "0"}
    assert "workload ml/trainer: TFLOPS 10 allocated, 10 used" in render_usage(usage)


def test_status_with_an_unreachable_prometheus_still_reports_and_says_why(monkeypatch, capsys):
    from extender import status_cmd

    class Client:
        def close(self) -> None:
            pass

    monkeypatch.setattr("extender.kube.client.load_api_client", lambda path, context=None: Client())
    monkeypatch.setattr(status_cmd, "read_snapshot", lambda lister: status_snapshot())
    out = io.StringIO()
    args = cli.build_parser().parse_args(["status", "--prometheus", "http://127.0.0.1:9"])
    assert status_cmd.main_status(args, out) == 1
    assert "POOL" in out.getvalue()
    assert "no usage: Prometheus at http://127.0.0.1:9" in capsys.readouterr().err


def test_yaml_output_is_the_report(monkeypatch: pytest.MonkeyPatch):
    import yaml

    from extender import status_cmd

    monkeypatch.setattr(status_cmd, "read_snapshot", lambda _lister: status_snapshot())
    monkeypatch.setattr("extender.kube.client.load_api_client", lambda _path, context=None: Closable())
    out = io.StringIO()
    assert status_cmd.main_status(cli.build_parser().parse_args(["status", "-o", "yaml"]), out) == 0
    assert yaml.safe_load(out.getvalue()) == build_report(status_snapshot())


def test_quotas_used_and_total_per_namespace():
    from dataclasses import replace

    quotas = [{"metadata": {"name": "q", "namespace": "ml"},
               "spec": {"total": {"requests": {"tflops": "200", "vram": "100Gi"}, "maxWorkers": 10}}},
              {"metadata": {"name": "empty", "namespace": "idle"}, "spec": {}}]
    report = build_report(replace(status_snapshot(), quotas=quotas))
    (idle, ml) = report["quotas"]
    assert ml == {"namespace": "ml", "quotas": ["q"],
                  "requests": {"tflops": {"used": "130", "total": "200"},
                               "vram": {"used": "8Gi", "total": "100Gi"}},
                  "limits": {"tflops": {"used": "130", "total": "-"}, "vram": {"used": "8Gi", "total": "-"}},
                  "workers": {"used": 2, "total": 10}}
    assert idle["workers"] == {"used": 0, "total": 32768}
    text = render_table(report)
    assert ("  ml: requests 130/200 TFLOPS, 8Gi/100Gi VRAM; limits 130/- TFLOPS, 8Gi/- VRAM; "
            "workers 2/10") in text


@pytest.mark.parametrize(("answer", "code", "stderr"), [
    # no TensorFusion CRDs: the report still comes, and one line names what the API server lacks
    (404, 0, "tf-extender status: note: the API server has no gpus.tensor-fusion.ai, "
             "gpupools.tensor-fusion.ai, schedulingconfigtemplates.tensor-fusion.ai, "
             "gpunodeclaims.tensor-fusion.ai, gpuresourcequotas.tensor-fusion.ai: install "),
    # no right to list them: the resource at fault, and the server's words
    (403, 1, "tf-extender status: error: gpus.tensor-fusion.ai: HTTP 403: gpus is forbidden\n"),
])
def test_status_names_the_resource_the_api_server_does_not_serve(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], answer: int, code: int,
        stderr: str) -> None:
    from extender.kube.client import ApiException

    def request_json(_api: Any, _method: str, path: str, **_kw: Any) -> dict[str, Any]:
        if path.startswith("/apis/tensor-fusion.ai/"):
            exc = ApiException(status=answer, reason="Not Found" if answer == 404 else "Forbidden")
            exc.body = json.dumps({"message": "gpus is forbidden"}) if answer == 403 else "404 page not found"
            raise exc
        return {"items": []}

    monkeypatch.setattr("extender.kube.client.request_json", request_json)
    monkeypatch.setattr("extender.kube.client.load_api_client", lambda _path, context=None: Closable())
    assert cli.main(["status", "-o", "json"]) == code
    captured = capsys.readouterr()
    assert captured.err.startswith(stderr) and len(captured.err.splitlines()) == 1, captured.err
    if code == 0:
        assert json.loads(captured.out) == {"pools": [], "quotas": [], "waitingGangs": [], "leaders": []}


def test_waiting_gangs_are_listed_and_running_ones_are_not():
    def member(name: str, gang: str, required: int, node: str | None = None) -> dict[str, Any]:
        p = pod(name, f"u-{name}", node=node, gpu_ids="g0" if node else None,
                phase="Running" if node else "Pending")
        p["metadata"]["annotations"].update({"tensor-fusion.ai/gang-group-key": f"ml/{gang}",
                                             "tensor-fusion.ai/gang-required-members": str(required),
                                             "tensor-fusion.ai/gang-desired-members": str(required)})
        p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "message":
                                      f"gang ml/{gang}: waiting for 1 of 3 members"}]
        return p

    pods = [member("t0", "train", 3), member("t1", "train", 3),
            member("r0", "serve", 2, node="n1"), member("r1", "serve", 2, node="n1")]
    report = build_report(StatusSnapshot([], [], [], [], pods, []))
    assert report["waitingGangs"] == [{"gang": "ml/train", "required": 3, "here": 2, "bound": 0,
                                       "reason": "gang ml/train: waiting for 1 of 3 members"}]
    assert ("  ml/train: 0 bound, 2 here of 3 required: gang ml/train: waiting for 1 of 3 members"
            in render_table(report).splitlines())

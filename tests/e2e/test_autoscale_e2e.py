"""Workload autoscaling end to end: usage history -> recommendation -> resize in place through the ledger.

On the real kube-apiserver, kube-scheduler, kwok, webhook and ``tf-extender serve --autoscale``. Usage
comes from ``--autoscale-usage-file``, a JSON file of samples the test writes: a stand-in for the GPU
metrics (dcgm-exporter through Prometheus, or TensorFusion's hypervisor) that the extender would read
through the same seam. Each GPU has 100 TFLOPS and 40Gi.

- usage rises: the worker gets more TFLOPS in place (same pod uid), VRAM untouched (targetResource
  compute), and the TensorFusionWorkload shows the recommendation and the ResourceUpdate condition;
- a full GPU: the scale-up is clamped to the room left, no GPU is ever over capacity, ResizeLimited says so;
- a scale-down frees room a pod placed afterwards uses, and a restarted extender counts the same;
- an unreadable percentile gives a condition naming the field, and the defaults are used.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from extender.common.quantity import parse_quantity
from tests import harness as cpl

pytestmark = pytest.mark.e2e

P = "tensor-fusion.ai/"
TFW = "tensorfusionworkloads"
INTERVAL = "1s"

TFW_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{TFW}.tensor-fusion.ai"},
    "spec": {"group": "tensor-fusion.ai", "scope": "Namespaced",
             "names": {"kind": "TensorFusionWorkload", "listKind": "TensorFusionWorkloadList", "plural": TFW,
                       "singular": "tensorfusionworkload"},
             "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                               "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                               "status": {"type": "object",
                                          "x-kubernetes-preserve-unknown-fields": True}}}}}]},
}


@pytest.fixture(scope="module")
def workload_crd(control_plane, api_client):
    """The TensorFusionWorkload CRD (the project's own once manifests/crds carries it; this one keeps every
    field, as that one does)."""
    ext = client.ApiextensionsV1Api(api_client)
    try:
        ext.create_custom_resource_definition(TFW_CRD)
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    custom = client.CustomObjectsApi(api_client)
    cpl.wait_until(lambda: custom.list_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION, TFW) is not None,
                   30, what="the TensorFusionWorkload CRD to be served")


@pytest.fixture
def samples(tmp_path: Path):
    path = tmp_path / "usage.json"
    entries: list[dict[str, Any]] = []
    path.write_text("[]")

    def add(namespace: str, workload: str, worker: str, tflops: float, vram: int, count: int,
            start: dt.datetime, step_s: float = 5.0) -> None:
        for i in range(count):
            when = start + dt.timedelta(seconds=i * step_s)
            entries.append({"namespace": namespace, "workload": workload, "worker": worker, "tflops": tflops,
                            "vram": vram, "time": when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")})
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entries))
        tmp.replace(path)

    add.path = path  # type: ignore[attr-defined]
    return add


@pytest.fixture
def autoscaling(gpu_cluster, workload_crd, extender_runner, samples):
    extender_runner.ensure(autoscale=True, autoscale_interval=INTERVAL,
                           autoscale_usage_file=str(samples.path))
    yield extender_runner
    extender_runner.ensure()


@pytest.fixture
def gpu(make_node, make_gpu, make_pool):
    pool = make_pool()
    node = f"as-{uuid.uuid4().hex[:6]}"
    make_gpu(f"{node}-gpu", node, pool=pool, tflops="100", vram="40Gi")
    make_node(node)
    return pool, node


def _profile(api_client, namespace: str, name: str, extra: dict[str, str] | None = None) -> None:
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        cpl.TF_GROUP, cpl.TF_VERSION, namespace, "workloadprofiles", {
            "apiVersion": "tensor-fusion.ai/v1", "kind": "WorkloadProfile", "metadata": {"name": name},
            "spec": {"autoScalingConfig": {"autoSetResources": {
                "enable": True, "targetResource": "compute", "initialDelayPeriod": "1s",
                "historyDataPeriod": "1h", **(extra or {})}}}})


def _worker(api_client, namespace: str, name: str, pool: str, tflops: str, vram: str,
            profile: str | None = None) -> Any:
    """A bare pod: its workload (tensor-fusion.ai/workload, written by the webhook) is its own name."""
    annotations = {P + "workload-profile": profile} if profile else {}
    body = cpl.gpu_pod_body(name, pool=pool, tflops=tflops, vram=vram, annotations=annotations)
    cpl.create_pod(api_client, namespace, body)
    return cpl.wait_for_pod_bound(api_client, namespace, name, timeout=60)


def _annotations(api_client, namespace: str, name: str) -> dict[str, str]:
    return cpl.read_pod(api_client, namespace, name).metadata.annotations or {}


def _tflops(api_client, namespace: str, name: str) -> str:
    return _annotations(api_client, namespace, name)[P + "tflops-request"]


def _percent(extender, node: str, resource: str = "tflops") -> float | None:
    value = extender.metric("tf_extender_node_allocated_ratio", node=node, resource=resource)
    return None if value is None else round(100 * value, 6)


def _workload(api_client, namespace: str, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        cpl.TF_GROUP, cpl.TF_VERSION, namespace, TFW, name)


def _with_recommended(tfw: dict[str, Any], tflops: str) -> dict[str, Any] | None:
    """The workload when its status recommends ``tflops``, else None."""
    recommended = ((tfw.get("status") or {}).get("recommendation") or {}).get("requests") or {}
    return tfw if recommended.get("tflops") == tflops else None


def _condition(obj: dict[str, Any]) -> dict[str, Any] | None:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "ResourceUpdate"), None)


def _past(minutes: float) -> dt.datetime:
    return dt.datetime.now(dt.UTC) - dt.timedelta(minutes=minutes)


def test_rising_usage_gets_more_tflops_in_place_and_a_full_gpu_clamps(autoscaling, api_client, namespace,
                                                                       gpu, samples):
    pool, node = gpu
    _profile(api_client, namespace, "train")
    # ten minutes of 40 TFLOPS in use: the recommendation is the p50 bucket's end x 1.15 (QoS medium)
    samples(namespace, "trainer", "trainer", 40.0, 3 * 2**30, 120, _past(10))
    before = _worker(api_client, namespace, "trainer", pool, "10", "4Gi", profile="train")
    uid = before.metadata.uid
    cpl.wait_until(lambda: _tflops(api_client, namespace, "trainer") != "10", 60,
                   what="the trainer to be resized")
    after = cpl.read_pod(api_client, namespace, "trainer")
    assert after.metadata.uid == uid and after.spec.node_name == before.spec.node_name  # in place
    resized = int(_tflops(api_client, namespace, "trainer"))
    assert 40 < resized <= 50
    notes = _annotations(api_client, namespace, "trainer")
    assert notes[P + "vram-request"] == "4Gi"  # targetResource compute: VRAM does not move
    assert notes[P + "allocated"] == f"tflops={resized},vram=4Gi"
    cpl.wait_until(lambda: _percent(autoscaling, node) == float(resized), 30,
                   what="the ledger to count the resize")
    # events go out from a background task, after the patch
    cpl.wait_until(lambda: cpl.pod_events(api_client, namespace, "trainer", "ResourceScaledUp"), 30,
                   what="the ResourceScaledUp event")
    # the status is written after the pod's patch, in the same pass
    tfw = cpl.wait_until(lambda: _with_recommended(_workload(api_client, namespace, "trainer"), str(resized)),
                         30, what="the workload's status to record the recommendation")
    assert tfw["status"]["workerCount"] == 1
    assert tfw["spec"]["resources"]["requests"]["tflops"] == "10"  # the original stays the spec
    condition = _condition(tfw)
    assert condition is not None and condition["reason"] == "Updated"

    # another workload takes 50 TFLOPS of the GPU; then the trainer's use doubles
    _worker(api_client, namespace, "other", pool, "50", "4Gi")
    now = dt.datetime.now(dt.UTC)
    samples(namespace, "trainer", "trainer", 95.0, 3 * 2**30, 400, now, step_s=0.01)
    cpl.wait_until(lambda: cpl.pod_events(api_client, namespace, "trainer", "ResizeLimited"), 60,
                   what="the scale-up to be clamped")
    assert _tflops(api_client, namespace, "trainer") == "50"  # 100 - 50: the room left
    assert _tflops(api_client, namespace, "other") == "50"
    assert _percent(autoscaling, node) == 100.0
    assert cpl.read_pod(api_client, namespace, "trainer").metadata.uid == uid

    # a restarted extender reads the same figures back from the pods
    autoscaling.restart()
    cpl.wait_until(lambda: _percent(autoscaling, node) == 100.0, 30, what="the restarted ledger")
    assert not [e for e in cpl.pod_events(api_client, namespace, "trainer") if e.reason ==
                "GPUAllocationNotBelieved"]


def test_a_scale_down_frees_room_for_the_next_pod(autoscaling, api_client, namespace, gpu, samples):
    pool, node = gpu
    _profile(api_client, namespace, "idle", {"targetResource": "all"})
    # nearly idle: 2 TFLOPS and 2Gi in use; the floors are 0.1 x 60 TFLOPS and 0.2 x 30Gi
    samples(namespace, "idler", "idler", 2.0, 2 * 2**30, 120, _past(10))
    _worker(api_client, namespace, "idler", pool, "60", "30Gi", profile="idle")
    cpl.wait_until(lambda: _tflops(api_client, namespace, "idler") != "60", 60, what="the idler to shrink")
    notes = _annotations(api_client, namespace, "idler")
    assert notes[P + "tflops-request"] == "6"
    assert abs(parse_quantity(notes[P + "vram-request"]).value - 6 * 2**30) <= 1  # 0.2 x 30Gi
    assert notes[P + "tflops-limit"] == "60"  # the compute limit never drops below the original
    cpl.wait_until(lambda: cpl.pod_events(api_client, namespace, "idler", "ResourceScaledDown"), 30,
                   what="the ResourceScaledDown event")
    cpl.wait_until(lambda: _percent(autoscaling, node) == 6.0, 30, what="the ledger to free the room")
    # 90 TFLOPS did not fit beside 60; beside 6 it does, on the same GPU
    placed = _worker(api_client, namespace, "big", pool, "90", "30Gi")
    assert placed.spec.node_name == node
    cpl.wait_until(lambda: _percent(autoscaling, node) == 96.0, 30, what="the ledger to count both")


def test_an_unreadable_percentile_is_named_and_the_default_used(autoscaling, api_client, namespace, gpu,
                                                                samples):
    pool, _ = gpu
    _profile(api_client, namespace, "bad", {"targetComputePercentile": "ninety"})
    samples(namespace, "odd", "odd", 40.0, 3 * 2**30, 60, _past(5))
    _worker(api_client, namespace, "odd", pool, "10", "4Gi", profile="bad")

    def named() -> dict[str, Any] | None:
        found = _condition(_workload(api_client, namespace, "odd"))
        return found if found and found["reason"] == "InvalidAutoScalingConfig" else None

    condition = cpl.wait_until(named, 60, what="the condition naming the field")
    assert condition["status"] == "False"
    assert "spec.autoScalingConfig.autoSetResources.targetComputePercentile: 'ninety'" in condition["message"]
    # the defaults still recommend, and the worker is still resized
    cpl.wait_until(lambda: _tflops(api_client, namespace, "odd") != "10", 60, what="a resize with defaults")

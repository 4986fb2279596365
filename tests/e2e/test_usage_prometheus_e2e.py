"""Usage in Prometheus terms, end to end, on a real Prometheus (v0.316.0, built by build-control-plane.sh).

Prometheus scrapes the extender's /metrics (what is allocated per pod and per GPU, ``UUID`` as dcgm-exporter
writes it) and ``DcgmStandIn``, a stand-in for NVIDIA dcgm-exporter (no GPU here): dcgm-exporter's metric
names and labels with values the test scripts. History is backfilled with promtool before Prometheus starts.
On the real kube-apiserver, kube-scheduler, kwok, webhook and ``tf-extender serve --autoscale
--autoscale-prometheus-url``:

- the usage reader pages a long range (backfilled hours, a few hundred points a request) through the real
  query_range API;
- the extender's allocation series join dcgm-exporter's ``on(UUID)``;
- a worker whose dcgm usage rises gets more TFLOPS in place (same pod uid), through the real usage reader
  and the default dcgm PromQL templates;
- an unreachable Prometheus: the TensorFusionWorkload's condition says so, and nothing is resized.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from kubernetes import client

from extender.controllers.autoscale.prometheus import PrometheusOptions, PrometheusUsage
from tests import harness as cpl
from tests.e2e.test_autoscale_e2e import TFW, workload_crd  # noqa: F401 - a fixture
from tests.harness.prometheus import DcgmStandIn, PrometheusServer, ScriptedGPU, backfill

pytestmark = pytest.mark.e2e

P = "tensor-fusion.ai/"
HISTORY_UUID = "GPU-00000000-0000-4000-8000-00000000h157"
HISTORY_HOURS = 3


@pytest.fixture(scope="module")
def dcgm():
    stand_in = DcgmStandIn()
    yield stand_in
    stand_in.close()


@pytest.fixture(scope="module")
def prometheus(control_plane, e2e_binaries, e2e_workdir, extender_port, dcgm):
    work = e2e_workdir / f"prometheus-{uuid.uuid4().hex[:6]}"
    work.mkdir(parents=True)
    server = PrometheusServer(e2e_binaries["prometheus"], work, control_plane.registry, control_plane.log_dir,
                              targets={"dcgm-exporter": [dcgm.target],
                                       "tf-extender": [f"127.0.0.1:{extender_port}"]})
    # a device with hours of history at 35 % (a GPU of another node, only in the backfilled blocks)
    history = ScriptedGPU(HISTORY_UUID, "history-node", util_percent=35.0, fb_used_mib=2048)
    end = time.time() - 3 * 3600  # older than the head block Prometheus starts with
    t0 = time.monotonic()
    start = end - HISTORY_HOURS * 3600
    backfill(e2e_binaries["promtool"], server.data_dir, [history], start, end, 60.0, work)
    server.backfill_seconds = time.monotonic() - t0  # type: ignore[attr-defined]
    server.history_end = end  # type: ignore[attr-defined]
    server.start()
    yield server
    server.stop()


@pytest.fixture
def gpu(make_node, make_gpu, make_pool, dcgm, api_client):
    pool = make_pool()
    node = f"pu-{uuid.uuid4().hex[:6]}"
    # TensorFusion names a GPU object after the device's UUID, lower-cased; status.uuid is the UUID as NVML
    # and so dcgm-exporter write it
    name = f"gpu-{uuid.uuid4()}"
    make_gpu(name, node, pool=pool, tflops="100", vram="40Gi")
    make_node(node)
    stored = client.CustomObjectsApi(api_client).get_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION,
                                                                           "gpus", name)
    device = ScriptedGPU(str(stored["status"]["uuid"]), node, util_percent=0.0, fb_used_mib=0.0)
    dcgm.set(device)
    return pool, node, device.uuid


def _profile(api_client, namespace: str, name: str) -> None:
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        cpl.TF_GROUP, cpl.TF_VERSION, namespace, "workloadprofiles", {
            "apiVersion": "tensor-fusion.ai/v1", "kind": "WorkloadProfile", "metadata": {"name": name},
            "spec": {"autoScalingConfig": {"autoSetResources": {
                "enable": True, "targetResource": "compute", "initialDelayPeriod": "1s",
                "historyDataPeriod": "1h"}}}})


def _worker(api_client, namespace: str, name: str, pool: str, tflops: str, profile: str) -> Any:
    body = cpl.gpu_pod_body(name, pool=pool, tflops=tflops, vram="4Gi",
                            annotations={P + "workload-profile": profile})
    cpl.create_pod(api_client, namespace, body)
    return cpl.wait_for_pod_bound(api_client, namespace, name, timeout=60)


def _tflops(api_client, namespace: str, name: str) -> int:
    return int(cpl.read_pod(api_client, namespace, name).metadata.annotations[P + "tflops-request"])


def _condition(api_client, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        obj = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
            cpl.TF_GROUP, cpl.TF_VERSION, namespace, TFW, name)
    except client.ApiException:
        return None
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "ResourceUpdate"), None)


def test_the_reader_pages_backfilled_history(prometheus):
    # any PromQL with a `pod` label per worker: here the history device, named worker "w"
    query = (f'label_replace(max by (UUID) (DCGM_FI_DEV_GPU_UTIL{{UUID="{HISTORY_UUID}"}}), '
             '"pod", "w", "UUID", ".*")')
    reader = PrometheusUsage(PrometheusOptions(prometheus.url, query, query, step_seconds=60, max_points=50))
    end = prometheus.history_end
    samples = asyncio.run(reader.workload_usage("ns", "wl", int((end - HISTORY_HOURS * 3600) * 1e9),
                                                int(end * 1e9)))
    # 180 one-minute steps after the start, 50 points a request: 4 pages of 2 queries
    assert reader.requests == 8
    assert 170 <= len(samples) <= 181
    assert {s.worker for s in samples} == {"w"} and {s.tflops for s in samples} == {35.0}
    stamps = [s.unix_ns for s in samples]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)  # pages neither overlap nor repeat


def test_rising_dcgm_usage_gets_more_tflops_in_place(gpu_cluster, workload_crd, extender_runner,  # noqa: F811
                                                     prometheus, dcgm, api_client, namespace, gpu):
    pool, node, gpu_uuid = gpu
    extender_runner.ensure(autoscale=True, autoscale_interval="1s", autoscale_prometheus_url=prometheus.url,
                           autoscale_prometheus_step="1s")
    try:
        _profile(api_client, namespace, "train")
        dcgm.update(gpu_uuid, util_percent=40.0, fb_used_mib=3072.0)
        before = _worker(api_client, namespace, "trainer", pool, "10", "train")
        # the extender's allocation joins dcgm-exporter's series on(UUID) in Prometheus
        joined = prometheus.wait_for(
            f'tf_extender_pod_allocated_tflops{{namespace="{namespace}",pod="trainer"}} '
            f'* on(UUID) group_left max by (UUID) (DCGM_FI_DEV_GPU_UTIL)', 60)
        assert joined[0]["metric"]["UUID"] == gpu_uuid and joined[0]["metric"]["workload"] == "trainer"
        # 40 % of a 100-TFLOPS GPU held whole by the trainer: 40 TFLOPS in use, 10 requested
        cpl.wait_until(lambda: _tflops(api_client, namespace, "trainer") > 10, 90,
                       what="the trainer to get more TFLOPS")
        first = _tflops(api_client, namespace, "trainer")
        assert 40 < first <= 50
        # its use rises to 90 %: more again, in place
        dcgm.update(gpu_uuid, util_percent=90.0)
        cpl.wait_until(lambda: _tflops(api_client, namespace, "trainer") > first, 150,
                       what="the trainer to get more TFLOPS as its use rises")
        after = cpl.read_pod(api_client, namespace, "trainer")
        assert after.metadata.uid == before.metadata.uid and after.spec.node_name == node
        cpl.wait_until(lambda: cpl.pod_events(api_client, namespace, "trainer", "ResourceScaledUp"), 30,
                       what="the ResourceScaledUp event")
        # the workload's status is written after the pod's patch, in the same pass
        condition = cpl.wait_until(
            lambda: (c := _condition(api_client, namespace, "trainer")) and c["reason"] == "Updated" and c,
            30, what="the workload's ResourceUpdate condition Updated")
        assert condition["reason"] == "Updated"
    finally:
        extender_runner.ensure()


def test_an_unreachable_prometheus_is_a_condition_and_no_resize(gpu_cluster, workload_crd,  # noqa: F811
                                                                extender_runner, dcgm, api_client, namespace,
                                                                gpu):
    pool, _, gpu_uuid = gpu
    nowhere = f"http://127.0.0.1:{cpl.free_port()}"
    extender_runner.ensure(autoscale=True, autoscale_interval="1s", autoscale_prometheus_url=nowhere)
    try:
        _profile(api_client, namespace, "blind")
        dcgm.update(gpu_uuid, util_percent=95.0)
        _worker(api_client, namespace, "blind", pool, "10", "blind")

        def unavailable() -> dict[str, Any] | None:
            found = _condition(api_client, namespace, "blind")
            return found if found and found["reason"] == "UsageUnavailable" else None

        condition = cpl.wait_until(unavailable, 60, what="the UsageUnavailable condition")
        assert condition["status"] == "False" and nowhere in condition["message"]
        time.sleep(5)  # several passes at 1 s
        assert _tflops(api_client, namespace, "blind") == 10
        assert not cpl.pod_events(api_client, namespace, "blind", "ResourceScaledUp")
        assert not cpl.pod_events(api_client, namespace, "blind", "ResourceScaledDown")
    finally:
        extender_runner.ensure()

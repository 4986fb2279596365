"""Operating it, end to end on the real control plane: ``--write-gpu-status`` (what ``kubectl get gpu`` and
``kubectl get gpupool`` show, read through the same Table API kubectl uses), ``tf-extender status`` with a
user's kubeconfig, and the metric names of the shipped alerts and dashboard against ``/metrics`` of the
running tf-extender and tf-webhook.

GPU pods go through the webhook and the real kube-scheduler to the extender; kwok plays the kubelet.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.request
import uuid
from typing import Any

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from tests import harness as cpl

pytestmark = pytest.mark.e2e

INTERVAL = 1.0  # --gpu-status-interval: at most one write per GPU per second
CAP = {"tflops": "100", "vram": "100Gi"}
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


@pytest.fixture
def status_extender(gpu_cluster, extender_runner):
    extender_runner.ensure(write_gpu_status=True, gpu_status_interval=INTERVAL)
    return extender_runner


def _table(api_client, plural: str, name: str) -> dict[str, Any]:
    """What ``kubectl get <plural> <name>`` prints: the server-side Table with the CRD's printer columns."""
    path = f"/apis/{cpl.TF_GROUP}/{cpl.TF_VERSION}/{plural}/{name}"
    request = api_client.param_serialize(method="GET", resource_path=path, header_params={"Accept": TABLE},
                                         auth_settings=["BearerToken"])
    response = api_client.call_api(*request)
    response.read()
    data = json.loads(response.data)
    columns = [c["name"] for c in data["columnDefinitions"]]
    return dict(zip(columns, data["rows"][0]["cells"], strict=True))


def _gpu_status(api_client, name: str) -> dict[str, Any]:
    custom = client.CustomObjectsApi(api_client)
    obj = custom.get_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION, "gpus", name)
    return obj.get("status") or {}


def _wait_table(api_client, plural: str, name: str, want: dict[str, Any],
                timeout: float = 30) -> dict[str, Any]:
    seen: list[dict[str, Any]] = [{}]

    def check() -> dict[str, Any] | None:
        seen[0] = row = _table(api_client, plural, name)
        return row if all(row.get(k) == v for k, v in want.items()) else None

    try:
        return cpl.wait_until(check, timeout, what=f"kubectl get {plural} {name} to show {want}")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; it shows {seen[0]}") from None


def _node(make_gpu, make_node, pool: str, gpus: int) -> str:
    name = f"st-{uuid.uuid4().hex[:6]}"
    for i in range(gpus):
        make_gpu(f"{name}-gpu-{i}", name, pool=pool, index=i, **CAP)
    make_node(name)
    return name


def test_kubectl_get_gpu_and_gpupool_show_what_the_extender_handed_out(
        api_client, status_extender, namespace, make_pool, make_gpu, make_node):
    pool = make_pool("CompactFirst")
    node = _node(make_gpu, make_node, pool, gpus=2)
    status_extender.wait_node_allocated(node, 0.0)
    for name in ("a", "b", "c"):
        cpl.create_pod(api_client, namespace, cpl.gpu_pod_body(name, pool=pool, tflops="30", vram="20Gi"))
    placed = {name: cpl.placement(api_client, namespace, name) for name in ("a", "b", "c")}
    assert {gpus[0] for _, gpus in placed.values()} == {f"{node}-gpu-0"}  # CompactFirst packs one GPU

    busy = _wait_table(api_client, "gpus", f"{node}-gpu-0",
                       {"Available TFlops": "10", "Available VRAM": "40Gi"})
    assert (busy["Total TFlops"], busy["Total VRAM"]) == ("100", "100Gi")
    _wait_table(api_client, "gpus", f"{node}-gpu-1", {"Available TFlops": "100", "Available VRAM": "100Gi"})
    apps = _gpu_status(api_client, f"{node}-gpu-0")["runningApps"]
    pods = sorted(p["name"] for app in apps for p in app["pods"])
    assert pods == ["a", "b", "c"] and sum(app["count"] for app in apps) == 3
    assert all(p["requests"] == {"tflops": "30", "vram": "20Gi"} for app in apps for p in app["pods"])
    _wait_table(api_client, "gpupools", pool, {
        "Total Nodes": "1", "Total GPU": "2", "Total TFlops": "200", "Total VRAM": "200Gi",
        "Available TFlops": "110", "Available VRAM": "140Gi"})

    client.CoreV1Api(api_client).delete_namespaced_pod("b", namespace, grace_period_seconds=0)
    cpl.wait_for_pod_gone(api_client, namespace, "b")
    _wait_table(api_client, "gpus", f"{node}-gpu-0", {"Available TFlops": "40", "Available VRAM": "60Gi"})
    _wait_table(api_client, "gpupools", pool, {"Available TFlops": "140", "Available VRAM": "160Gi"})
    # gpu-0 after the binds (one pass or a few) and after the delete; gpu-1 never changed
    assert status_extender.metric("tf_extender_status_writes_total", kind="gpu", outcome="ok") >= 2
    assert status_extender.metric("tf_extender_status_writes_total", kind="gpu", outcome="error") == 0


def test_a_burst_of_binds_is_batched_into_few_status_writes(
        api_client, status_extender, namespace, make_pool, make_gpu, make_node):
    pool = make_pool("CompactFirst")
    node = _node(make_gpu, make_node, pool, gpus=1)
    status_extender.wait_node_allocated(node, 0.0)
    _wait_table(api_client, "gpus", f"{node}-gpu-0", {"Available TFlops": "100"})
    before = status_extender.metric("tf_extender_status_writes_total", kind="gpu", outcome="ok") or 0.0
    started = time.monotonic()
    names = [f"burst-{i}" for i in range(30)]
    for name in names:
        cpl.create_pod(api_client, namespace, cpl.gpu_pod_body(name, pool=pool, tflops="2", vram="1Gi"))
    for name in names:
        cpl.placement(api_client, namespace, name)
    _wait_table(api_client, "gpus", f"{node}-gpu-0", {"Available TFlops": "40", "Available VRAM": "70Gi"})
    elapsed = time.monotonic() - started
    writes = status_extender.metric("tf_extender_status_writes_total", kind="gpu", outcome="ok") - before
    # one GPU changed: at most one write per pass (+1 for a pass under way, +1 for the cache catching up)
    assert writes <= elapsed / INTERVAL + 2, (writes, elapsed)
    assert writes < len(names), f"{writes} writes for {len(names)} binds: not batched"
    apps = _gpu_status(api_client, f"{node}-gpu-0")["runningApps"]
    assert sum(app["count"] for app in apps) == len(names)


def test_status_command_reads_the_cluster_with_a_users_kubeconfig(
        control_plane, api_client, status_extender, namespace, make_pool, make_gpu, make_node):
    pool = make_pool("LowLoadFirst")
    node = _node(make_gpu, make_node, pool, gpus=2)
    status_extender.wait_node_allocated(node, 0.0)
    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("small", pool=pool, tflops="25", vram="10Gi"))
    cpl.placement(api_client, namespace, "small")
    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("huge", pool=pool, tflops="100", vram="100Gi",
                                                           gpu_count=3))
    cpl.wait_until(lambda: cpl.scheduling_failure(api_client, namespace, "huge"), 60,
                   what="the scheduler to give up on pod huge")

    report = json.loads(cpl.run_console_script(
        "tf-extender", "status", "--kubeconfig", control_plane.kubeconfig, "-o", "json"))
    mine = next(p for p in report["pools"] if p["name"] == pool)
    assert (mine["mode"], mine["provisioning"], mine["nodes"], mine["gpus"], mine["partiallyUsedGPUs"]) == (
        "LowLoadFirst", "AutoSelect", 1, 2, 1)
    assert mine["tflops"] == {"total": "200", "allocated": "25", "free": "175"}
    assert mine["vram"] == {"total": "200Gi", "allocated": "10Gi", "free": "190Gi"}
    pending = {p["pod"]: p["reason"] for p in mine["pendingPods"]}
    assert list(pending) == [f"{namespace}/huge"]
    assert "GPU" in pending[f"{namespace}/huge"]  # the scheduler's message, with the extender's reasons

    table = cpl.run_console_script("tf-extender", "status", "--kubeconfig", control_plane.kubeconfig)
    row = next(line for line in table.splitlines() if line.split()[:1] == [pool])
    assert row.split()[:8] == [pool, "LowLoadFirst", "AutoSelect", "1", "2", "25/200", "175", "10Gi/200Gi"]
    assert f"  {namespace}/huge (pool {pool}): " in table


def _live_names(page: str) -> set[str]:
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
    names: set[str] = set()
    for family in text_string_to_metric_families(page):
        names |= {family.name + s for s in suffixes.get(family.type, [""])}
        names |= {s.name for s in family.samples}
    return names


def test_alerts_and_dashboard_read_metrics_the_running_services_export(status_extender, webhook):
    from tests.harness.promql import PROMETHEUS_OWN, dashboard_queries, names_in, rules

    with urllib.request.urlopen(f"{status_extender.url}/metrics", timeout=5) as r:
        extender_page = r.read().decode()
    context = ssl.create_default_context(cafile=str(webhook.ca_file))
    with urllib.request.urlopen(f"{webhook.url}/metrics", timeout=5, context=context) as r:
        webhook_page = r.read().decode()
    live = _live_names(extender_page) | _live_names(webhook_page)
    wanted = {name for rule in rules() for name in names_in(rule["expr"])}
    wanted |= {name for _, query in dashboard_queries() for name in names_in(query)}
    assert not wanted - live - PROMETHEUS_OWN, f"not on /metrics: {sorted(wanted - live - PROMETHEUS_OWN)}"
    expiry = next(s.value for f in text_string_to_metric_families(webhook_page) for s in f.samples
                  if s.name == "tf_webhook_certificate_expiry_timestamp_seconds")
    assert expiry > time.time() + 86400  # the e2e certificate is valid for a year

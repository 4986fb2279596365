"""Namespace GPU quotas (TensorFusion's GPUResourceQuota) on the real control plane: the webhook, the real
kube-scheduler and the extender, checked from the pods and quotas as the API server stores them.

- two namespaces share a pool: the one at its total keeps its next pod Pending with the quota event while
  the other's pods schedule, and the quota's status says what is used;
- a burst of 200 pods of one namespace against a total of 50 pods' worth ends with exactly 50 bound, no
  GPU and no quota over, also with the extender killed midway;
- preemption inside a quota: a critical pod of a namespace at its total evicts one of its own low pods;
- a quota-blocked pod buys no node (the real Karpenter, as in test_expansion.py).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests import harness as cpl
from tests.harness.expansion import (
    create_pod,
    fill_first_node,
    gpu_pod,
    group_fixture,
    make_group_fixture,
    run_extender_fixture,
)
from tests.harness.karpenter import karpenter_fixture

pytestmark = pytest.mark.e2e

karpenter = karpenter_fixture(node_overlay=False)
FIXTURES = (group_fixture, make_group_fixture, run_extender_fixture)

QUOTA_EVENT = "GPUQuotaOrCapacityNotEnough"


# --- helpers -----------------------------------------------------------------------------------------------


def make_quota(api_client, namespace: str, tflops: str, vram: str = "1Ti", name: str = "gpu-quota",
               **total: Any) -> dict:
    body = {"apiVersion": f"{cpl.TF_GROUP}/{cpl.TF_VERSION}", "kind": "GPUResourceQuota",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"total": {"requests": {"tflops": tflops, "vram": vram}, **total}}}
    created: dict = client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        cpl.TF_GROUP, cpl.TF_VERSION, namespace, "gpuresourcequotas", body)
    return created


def read_quota(api_client, namespace: str, name: str = "gpu-quota") -> dict:
    found: dict = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        cpl.TF_GROUP, cpl.TF_VERSION, namespace, "gpuresourcequotas", name)
    return found


def quota_table(api_client, namespace: str, name: str = "gpu-quota") -> dict[str, Any]:
    """What ``kubectl get gpuresourcequota`` prints: the server-side Table with the CRD's printer columns."""
    request = api_client.param_serialize(
        method="GET", resource_path=f"/apis/{cpl.TF_GROUP}/{cpl.TF_VERSION}/namespaces/{namespace}/"
                                    f"gpuresourcequotas/{name}",
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        auth_settings=["BearerToken"])
    response = api_client.call_api(*request)
    response.read()
    data = json.loads(response.data)
    columns = [c["name"] for c in data["columnDefinitions"]]
    return dict(zip(columns, data["rows"][0]["cells"], strict=True))


def wait_quota_seen(extender, namespace: str, tflops: float) -> None:
    """Until the extender enforces the namespace's quota (its total is on the metrics page)."""
    cpl.wait_until(lambda: extender.metric("tf_extender_quota_total_tflops", namespace=namespace,
                                           kind="requests") == tflops, 30,
                   what=f"the extender to see the quota of {namespace}")


def bound_pods(core: client.CoreV1Api, namespace: str) -> list[Any]:
    return [p for p in core.list_namespaced_pod(namespace).items
            if p.spec.node_name and not p.metadata.deletion_timestamp]


def requested_tflops(pods: list[Any]) -> Fraction:
    annotations = [p.metadata.annotations for p in pods]
    return sum((Fraction(a["tensor-fusion.ai/tflops-request"]) * int(a.get("tensor-fusion.ai/gpu-count", "1"))
                for a in annotations), Fraction(0))


def gpu_node(make_node, make_gpu, pool: str, short: str, gpus: int = 1, tflops: str = "100",
             vram: str = "100Gi") -> str:
    name = f"{short}-{uuid.uuid4().hex[:6]}"
    for i in range(gpus):
        make_gpu(f"{name}-gpu-{i}", name, pool=pool, index=i, tflops=tflops, vram=vram)
    make_node(name)
    return name


@pytest.fixture
def second_namespace(api_client):
    core = client.CoreV1Api(api_client)
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    with contextlib.suppress(Exception):
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    with contextlib.suppress(Exception):
        core.delete_namespace(name)


# --- two namespaces, one pool ------------------------------------------------------------------------------


def test_a_namespace_at_its_total_waits_while_another_schedules(api_client, gpu_cluster, extender, namespace,
                                                               second_namespace, make_pool, make_node,
                                                               make_gpu):
    pool = make_pool()
    node = gpu_node(make_node, make_gpu, pool, "shared", gpus=2)
    extender.wait_node_allocated(node, 0)
    make_quota(api_client, namespace, "40", alertThresholdPercent=90)
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        cpl.TF_GROUP, cpl.TF_VERSION, namespace, "gpuresourcequotas", "gpu-quota",
        {"spec": {"single": {"defaultRequests": {"tflops": "20", "vram": "1Gi"}}}})
    wait_quota_seen(extender, namespace, 40)

    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("a-0", pool=pool, tflops="20", vram="1Gi"))
    # no amounts at all: the webhook fills them from the quota's single.defaultRequests
    defaulted = cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("a-1", pool=pool))
    assert (defaulted.metadata.annotations["tensor-fusion.ai/tflops-request"],
            defaulted.metadata.annotations["tensor-fusion.ai/vram-request"]) == ("20", "1Gi")
    for i in range(2):
        cpl.placement(api_client, namespace, f"a-{i}")
    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("a-over", pool=pool, tflops="20", vram="1Gi"))
    for i in range(3):  # the other namespace has no quota: the pool's room is its to take
        cpl.create_pod(api_client, second_namespace,
                       cpl.gpu_pod_body(f"b-{i}", pool=pool, tflops="20", vram="1Gi"))
    for i in range(3):
        cpl.placement(api_client, second_namespace, f"b-{i}")

    events = cpl.wait_until(lambda: cpl.pod_events(api_client, namespace, "a-over", QUOTA_EVENT), 60,
                            what="the quota event on the pod over the total")
    message = events[0].message
    assert f"namespace {namespace}" in message and "total.max.tflops.request" in message
    assert "used 40 TFLOPS, requested 20 TFLOPS, cap 40 TFLOPS" in message
    failure = cpl.wait_until(lambda: cpl.scheduling_failure(api_client, namespace, "a-over"), 60,
                             what="a-over unschedulable")
    assert "total.max.tflops.request" in failure
    core = client.CoreV1Api(api_client)
    assert not core.read_namespaced_pod("a-over", namespace).spec.node_name

    def status_written() -> dict | None:
        status = read_quota(api_client, namespace).get("status") or {}
        return status if (status.get("used") or {}).get("workers") == 2 else None

    status = cpl.wait_until(status_written, 30, what="the quota's status")
    assert status["used"]["requests"]["tflops"] == "40"
    assert status["availablePercent"]["requests.tflops"] == "0.00"
    (ready,) = status["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "AlertThresholdReached")
    alerts = cpl.wait_until(lambda: [e for e in core.list_namespaced_event(namespace).items
                                     if e.reason == "AlertThresholdReached"], 30, what="the alert event")
    assert alerts[0].involved_object.kind == "GPUResourceQuota"
    row = quota_table(api_client, namespace)  # kubectl get gpuresourcequota
    assert {k: row[k] for k in ("TFLOPS Used", "TFLOPS Total", "TFLOPS Avail%", "Workers", "Ready")} == {
        "TFLOPS Used": "40", "TFLOPS Total": "40", "TFLOPS Avail%": "0.00", "Workers": 2, "Ready": "False"}

    # a pod of the namespace goes: the waiting one takes its place
    core.delete_namespaced_pod("a-0", namespace, grace_period_seconds=0)
    assert cpl.placement(api_client, namespace, "a-over", timeout=90)[0] == node


# --- a burst against the total -----------------------------------------------------------------------------

NODES, GPUS_PER_NODE, GPU_TFLOPS = 5, 2, 300  # 3000 TFLOPS: room for 300 pods, the quota allows 50
PODS, POD_TFLOPS, QUOTA_PODS = 200, 10, 50


def _burst(api_client, namespace: str, pool: str) -> None:
    def create(i: int) -> None:
        cpl.create_pod(api_client, namespace, cpl.gpu_pod_body(
            f"burst-{i:03d}", pool=pool, tflops=str(POD_TFLOPS), vram="1Gi"))

    with ThreadPoolExecutor(max_workers=8) as workers:
        list(workers.map(create, range(PODS)))


@pytest.mark.parametrize("crash", [False, True], ids=["steady", "extender-killed-midway"])
def test_a_burst_ends_exactly_at_the_total(api_client, gpu_cluster, extender, namespace, make_pool, make_node,
                                           make_gpu, crash):
    pool = make_pool()
    gpus: dict[str, str] = {}
    for n in range(NODES):
        node = gpu_node(make_node, make_gpu, pool, f"burst{n}", gpus=GPUS_PER_NODE, tflops=str(GPU_TFLOPS),
                        vram="300Gi")
        gpus.update({f"{node}-gpu-{i}": node for i in range(GPUS_PER_NODE)})
        extender.wait_node_allocated(node, 0)
    total = QUOTA_PODS * POD_TFLOPS
    make_quota(api_client, namespace, str(total))
    wait_quota_seen(extender, namespace, total)
    core = client.CoreV1Api(api_client)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=1) as background:
        creating = background.submit(_burst, api_client, namespace, pool)
        if crash:
            cpl.wait_until(lambda: len(bound_pods(core, namespace)) >= QUOTA_PODS // 3, 120, interval=0.2,
                           what="a third of the quota bound before the crash")
            extender.kill()
            at_crash = len(bound_pods(core, namespace))
            assert at_crash < QUOTA_PODS, "the quota was full before the crash"
            time.sleep(2)  # the scheduler goes on filtering against a dead extender meanwhile
            extender.restart()
        creating.result()
    cpl.wait_until(lambda: len(bound_pods(core, namespace)) >= QUOTA_PODS, 240, interval=1,
                   what=f"{QUOTA_PODS} pods bound")
    # the rest stay Pending, however often the scheduler retries them
    cpl.wait_until(lambda: len(cpl.pod_events(api_client, namespace, f"burst-{PODS - 1:03d}")) > 0, 60,
                   what="the last pod tried")
    time.sleep(10)
    pods = core.list_namespaced_pod(namespace).items
    placed = [p for p in pods if p.spec.node_name]
    print(f"{len(placed)} of {PODS} pods bound in {time.monotonic() - started:.1f}s against a total of "
          f"{QUOTA_PODS} pods' worth" + (" (extender killed midway)" if crash else ""))
    assert len(placed) == QUOTA_PODS
    assert requested_tflops(placed) == total
    holders: Counter[str] = Counter()
    for p in placed:
        (gpu,) = cpl.gpu_ids_of(p)
        assert gpus[gpu] == p.spec.node_name
        holders[gpu] += POD_TFLOPS
    assert max(holders.values()) <= GPU_TFLOPS
    waiting = [p for p in pods if not p.spec.node_name]
    blocked = cpl.pod_events(api_client, namespace, waiting[0].metadata.name, QUOTA_EVENT)
    assert blocked and "total.max.tflops.request" in blocked[0].message

    def used_written() -> bool:
        status = read_quota(api_client, namespace).get("status") or {}
        return (status.get("used") or {}).get("workers") == QUOTA_PODS
    cpl.wait_until(used_written, 30, what="the quota's used workers")
    assert read_quota(api_client, namespace)["status"]["used"]["requests"]["tflops"] == str(total)


# --- preemption inside a quota -----------------------------------------------------------------------------


def test_a_critical_pod_preempts_inside_its_quota(api_client, gpu_cluster, extender, namespace, make_pool,
                                                   make_node, make_gpu):
    pool = make_pool()
    node = gpu_node(make_node, make_gpu, pool, "quota-pre", gpus=2)  # the GPUs have room for 4 such pods
    extender.wait_node_allocated(node, 0)
    make_quota(api_client, namespace, "100")
    wait_quota_seen(extender, namespace, 100)
    for i in range(2):
        cpl.create_pod(api_client, namespace, cpl.gpu_pod_body(
            f"low-{i}", pool=pool, tflops="50", vram="10Gi", qos="low"))
    for i in range(2):
        cpl.placement(api_client, namespace, f"low-{i}")

    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("vip", pool=pool, tflops="50", vram="10Gi",
                                                          qos="critical"))
    assert cpl.placement(api_client, namespace, "vip", timeout=90)[0] == node
    core = client.CoreV1Api(api_client)

    def exists(name: str) -> bool:
        try:
            return core.read_namespaced_pod(name, namespace).metadata.deletion_timestamp is None
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    assert sum(exists(f"low-{i}") for i in range(2)) == 1  # one victim: the quota needed 50 TFLOPS back
    assert requested_tflops(bound_pods(core, namespace)) == 100  # never over the total
    preempting = cpl.pod_events(api_client, namespace, "vip", "PreemptingGPUPods")
    assert preempting


# --- expansion ---------------------------------------------------------------------------------------------


def test_a_quota_blocked_pod_buys_no_node(api_client, namespace, group, run_extender, extender_runner):
    run_extender(delay=1)
    fill_first_node(api_client, namespace, group)
    make_quota(api_client, namespace, "10")  # what the first node's pod already holds
    wait_quota_seen(extender_runner, namespace, 10)
    pod = create_pod(api_client, namespace, gpu_pod("blocked", group.name, "60Gi"))
    events = cpl.wait_until(lambda: cpl.pod_events(api_client, namespace, "blocked", QUOTA_EVENT), 60,
                            what="the quota event")
    assert "total.max.tflops.request" in events[0].message
    time.sleep(8)  # the expander's delay is 1 s: it would have claimed a node by now
    assert group.claims_for(pod["uid"]) == []
    assert len(group.karpenter.claims(group.nodepool)) == 1  # the first node's alone
    assert cpl.pod_events(api_client, namespace, "blocked", "NodeExpansionCheck") == []
    assert not client.CoreV1Api(api_client).read_namespaced_pod("blocked", namespace).spec.node_name

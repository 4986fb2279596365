"""Preemption of GPU shares respects PodDisruptionBudgets, on the real control plane.

The budgets' status comes from the real disruption controller (kube-controller-manager in the harness), and
victims leave through the real Eviction API, which refuses what a budget does not allow. One GPU of 100
TFLOPS holds two low-priority pods of 45: ``db`` (covered by a budget that allows no disruption) and ``web``.
A critical pod of 50 needs one of them gone.
"""

from __future__ import annotations

import contextlib
import uuid

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests import harness as cpl

pytestmark = pytest.mark.e2e


def _exists(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        return core.read_namespaced_pod(name, namespace).metadata.deletion_timestamp is None
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


@pytest.fixture
def shared_gpu(api_client, gpu_cluster, extender, namespace, make_pool, make_node, make_gpu):
    """(node, pool): one GPU holding ``db`` and ``web`` (45 TFLOPS each, priority 0), both Running."""
    pool = make_pool()
    node = f"pdb-{uuid.uuid4().hex[:6]}"
    make_gpu(f"{node}-gpu-0", node, pool=pool, tflops="100", vram="100Gi")
    make_node(node)
    extender.wait_node_allocated(node, 0)
    for app in ("db", "web"):
        cpl.create_pod(api_client, namespace, cpl.gpu_pod_body(
            app, pool=pool, tflops="45", vram="45Gi", qos="low", labels={"app": app},
            node_selector={"kubernetes.io/hostname": node}))
    for app in ("db", "web"):
        assert cpl.placement(api_client, namespace, app)[0] == node
        cpl.wait_for_pod_running(api_client, namespace, app)
    extender.wait_node_allocated(node, 90)
    return node, pool


def _budget(api_client, namespace: str, app: str) -> None:
    """A budget keeping every ``app`` pod: none may be disrupted, once the disruption controller says so."""
    policy = client.PolicyV1Api(api_client)
    policy.create_namespaced_pod_disruption_budget(namespace, {
        "metadata": {"name": app}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}}})

    def computed() -> bool:
        status = policy.read_namespaced_pod_disruption_budget(app, namespace).status
        return status is not None and status.current_healthy == 1 and status.disruptions_allowed == 0

    cpl.wait_until(computed, 60, what=f"the disruption controller to compute PDB {app}")


def test_the_victim_no_budget_protects_is_chosen(api_client, extender, namespace, shared_gpu):
    node, pool = shared_gpu
    _budget(api_client, namespace, "db")
    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("vip", pool=pool, tflops="50", vram="50Gi",
                                                           qos="critical"))
    assert cpl.placement(api_client, namespace, "vip", timeout=90) == (node, [f"{node}-gpu-0"])
    core = client.CoreV1Api(api_client)
    assert _exists(core, namespace, "db") and not _exists(core, namespace, "web")
    extender.wait_node_allocated(node, 95)  # 45 + 50


def test_a_budget_that_allows_nothing_holds_until_it_allows(api_client, extender, namespace, shared_gpu):
    node, pool = shared_gpu
    for app in ("db", "web"):
        _budget(api_client, namespace, app)
    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("vip", pool=pool, tflops="50", vram="50Gi",
                                                           qos="critical"))
    # every victim set breaks a budget: the eviction is refused by the API server, nothing is deleted
    cpl.wait_until(lambda: cpl.pod_events(api_client, namespace, "vip", "PreemptionBlockedByPDB"), 90,
                   what="the preemptor to report the eviction a budget refused")
    core = client.CoreV1Api(api_client)
    assert _exists(core, namespace, "db") and _exists(core, namespace, "web")
    assert not core.read_namespaced_pod("vip", namespace).spec.node_name
    # the budget of web goes: the next retry evicts web (never db) and the critical pod is placed
    with contextlib.suppress(ApiException):
        client.PolicyV1Api(api_client).delete_namespaced_pod_disruption_budget("web", namespace)
    assert cpl.placement(api_client, namespace, "vip", timeout=120) == (node, [f"{node}-gpu-0"])
    assert _exists(core, namespace, "db") and not _exists(core, namespace, "web")

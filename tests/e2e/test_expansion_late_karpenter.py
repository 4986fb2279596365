"""Level-triggered expansion on the real control plane with the real Karpenter (KWOK provider): the extender
starts before Karpenter's CRDs and the pool's NodePool exist, the GPU pod is turned away, then they are
installed. The expander reconsiders the pending pod when the NodePool appears, so the pod gets its node
within one Karpenter batch plus registration, not at kube-scheduler's five-minute retry of unschedulable
pods (the defect: `make demo` waited from 21:11:46 to 21:16:50 for it).

Karpenter is started inside the first test, after the pod was turned away, so its CRDs really are absent
when the extender starts (the module removes them first when an earlier module of the same control plane
installed them, and puts them back at the end).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests import harness as cpl
from tests.harness.expansion import GROUP, Group, create_pod, gpu_pod, run_extender_fixture, wait_for_event
from tests.harness.karpenter import Karpenter, start_karpenter

pytestmark = pytest.mark.e2e

FIXTURES = (run_extender_fixture,)
# kube-scheduler retries unschedulable pods every 5 minutes; the pod must be placed long before that:
# the expansion delay (10 s, the default) + Karpenter's batch (1-10 s) + the KWOK node's registration
BOUND_WITHIN_SECONDS = 60.0
KARPENTER_GROUPS = ("karpenter.sh", "karpenter.kwok.sh")


def remove_karpenter_crds(api_client: Any) -> None:
    """Karpenter's CRDs gone, with any object left in them (finalizers cleared: no Karpenter runs now)."""
    ext = client.ApiextensionsV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    crds = [c for c in ext.list_custom_resource_definition().items if c.spec.group in KARPENTER_GROUPS]
    for crd in crds:
        where = (crd.spec.group, next(v.name for v in crd.spec.versions if v.storage), crd.spec.names.plural)
        for item in custom.list_cluster_custom_object(*where)["items"]:
            with contextlib.suppress(ApiException):
                custom.patch_cluster_custom_object(*where, item["metadata"]["name"],
                                                   {"metadata": {"finalizers": None}})
        with contextlib.suppress(ApiException):
            ext.delete_custom_resource_definition(crd.metadata.name)
    names = {c.metadata.name for c in crds}
    cpl.wait_until(lambda: not names & {c.metadata.name for c in ext.list_custom_resource_definition().items},
                   60, what="Karpenter's CRDs to be gone")


@pytest.fixture(scope="module")
def karpenter_late(cluster, api_client, e2e_binaries):
    """``karpenter_late()`` starts the real Karpenter (installing its CRDs) on its first call, and returns
    it; the module begins with Karpenter's CRDs removed."""
    started: list[Karpenter] = []

    def get() -> Karpenter:
        if not started:
            started.append(start_karpenter(cluster, api_client, e2e_binaries))
        return started[0]

    remove_karpenter_crds(api_client)
    yield get
    for karpenter in started:
        karpenter.close()
    cpl.apply_crds(api_client, cpl.karpenter_crd_files())  # as the later modules of this control plane expect


def wait_turned_away(api_client: Any, namespace: str, name: str) -> str:
    return cpl.wait_until(lambda: cpl.scheduling_failure(api_client, namespace, name), 60,
                          what=f"{name} to be reported unschedulable")


def karpenter_crds_installed(api_client: Any) -> bool:
    crds = client.ApiextensionsV1Api(api_client).list_custom_resource_definition().items
    return any(c.spec.group in KARPENTER_GROUPS for c in crds)


def grow_and_time(api_client: Any, namespace: str, karpenter: Karpenter, group: str, pod: str) -> float:
    """Create the group's NodePool; the seconds until the pod is bound to one of its nodes (asserted)."""
    nodepool = Group(karpenter)
    nodepool.name = group
    nodepool.create()
    created = time.monotonic()
    node = cpl.wait_for_pod_bound(api_client, namespace, pod, timeout=BOUND_WITHIN_SECONDS).spec.node_name
    took = time.monotonic() - created
    print(f"\n{pod}: NodePool created -> pod bound in {took:.1f}s")
    assert took < BOUND_WITHIN_SECONDS * cpl.TIMEOUT_SCALE
    assert node in {n.metadata.name for n in karpenter.nodes(nodepool.nodepool)}
    completed = wait_for_event(api_client, namespace, pod, "NodeExpansionCompleted")
    assert "from the NodePool's template" in completed.message
    assert len(karpenter.claims(nodepool.nodepool)) == 1  # one node's worth of demand: one claim
    return took


def test_a_pod_turned_away_before_karpenter_was_installed_gets_its_node_in_seconds(
        api_client, namespace, karpenter_late, run_extender, extender_runner, make_node):
    run_extender(delay=10)  # the shipped default
    extender_runner.restart()  # so it surely starts while Karpenter's CRDs are absent
    assert not karpenter_crds_installed(api_client)
    group = "late-crds"
    make_node(labels={GROUP: group})  # a CPU node the pod may use: the extender is asked, and says no GPU
    create_pod(api_client, namespace, gpu_pod("burst-1", group, "10Gi"))
    wait_turned_away(api_client, namespace, "burst-1")
    time.sleep(15)  # past the expansion delay: the edge-triggered expander had given up on the pod by now
    assert cpl.read_pod(api_client, namespace, "burst-1").spec.node_name is None

    karpenter = karpenter_late()  # its CRDs, its KWOKNodeClass, the process
    try:
        grow_and_time(api_client, namespace, karpenter, group, "burst-1")
    finally:
        client.CoreV1Api(api_client).delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        karpenter.reset()


def test_a_pod_no_node_could_take_gets_its_node_once_its_nodepool_is_created(
        api_client, namespace, karpenter_late, run_extender):
    run_extender(delay=10)
    karpenter = karpenter_late()
    group = "late-nodepool"
    # no node carries the group label: kube-scheduler never asks the extender, the pod watch sees it
    create_pod(api_client, namespace, gpu_pod("burst-2", group, "10Gi"))
    wait_turned_away(api_client, namespace, "burst-2")
    time.sleep(15)
    assert cpl.read_pod(api_client, namespace, "burst-2").spec.node_name is None
    try:
        grow_and_time(api_client, namespace, karpenter, group, "burst-2")
    finally:
        client.CoreV1Api(api_client).delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        karpenter.reset()

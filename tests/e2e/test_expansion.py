"""Node expansion on the real control plane with the real Karpenter (KWOK provider), NodeOverlay off.

Karpenter launches every NodeClaim (the expander's included) and its KWOK provider creates the Nodes; their
GPUs come from the GPU discovery labels the NodePool template carries (see tests/harness/karpenter.py). With
the overlay off Karpenter itself does not provision for GPU pods (it sees no node offering
``tensor-fusion.ai/index_*``), so every node here is the expander's: a pool grows from zero out of its
NodePool, then by copying a Karpenter node. The extender runs as ``tf-extender serve`` with short delays.
"""

from __future__ import annotations

import time
import uuid

import pytest
from kubernetes import client

from tests import harness as cpl
from tests.harness.expansion import (
    DO_NOT_DISRUPT,
    EXPANSION_POD_UID,
    GROUP,
    POOL,
    TAINT,
    create_pod,
    fill_first_node,
    gpu_pod,
    group_fixture,
    make_group_fixture,
    node_of,
    run_extender_fixture,
    wait_for_event,
)
from tests.harness.karpenter import INSTANCE_TYPE, NODEPOOL_LABEL, ZONE, karpenter_fixture

pytestmark = pytest.mark.e2e

karpenter = karpenter_fixture(node_overlay=False)
FIXTURES = (group_fixture, make_group_fixture, run_extender_fixture)


# --- tests -----------------------------------------------------------------------------------------


def test_a_pool_with_no_gpu_node_grows_from_its_nodepool(api_client, namespace, group, run_extender):
    run_extender(delay=1)
    pod = create_pod(api_client, namespace, gpu_pod("first", group.name, "10Gi"))
    check = wait_for_event(api_client, namespace, "first", "NodeExpansionCheck", timeout=60)
    assert f"pool {POOL}" in check.message
    node = cpl.wait_for_pod_bound(api_client, namespace, "first", timeout=120).spec.node_name
    claims = group.registered_claims_for(pod["uid"])
    assert len(claims) == 1 and claims[0]["status"]["nodeName"] == node
    assert [c["metadata"]["name"] for c in group.karpenter.claims(group.nodepool)] == \
        [claims[0]["metadata"]["name"]]  # the only node of the NodePool
    labels = client.CoreV1Api(api_client).read_node(node).metadata.labels
    assert labels[INSTANCE_TYPE] == "gpu-a100-1" and labels["nvidia.com/gpu.count"] == "1"


def test_one_more_pod_gets_one_new_nodeclaim_and_lands_on_its_node(api_client, namespace, group,
                                                                    run_extender):
    run_extender(delay=1)
    template = fill_first_node(api_client, namespace, group)
    pod = create_pod(api_client, namespace, gpu_pod("one-more", group.name, "60Gi"))

    check = wait_for_event(api_client, namespace, "one-more", "NodeExpansionCheck")
    assert "an empty node would fit it" in check.message
    claims = cpl.wait_until(lambda: group.claims_for(pod["uid"]), 60, what="a new NodeClaim")
    time.sleep(3)  # and only one
    assert len(group.claims_for(pod["uid"])) == 1
    claim = claims[0]
    name = claim["metadata"]["name"]
    assert name.startswith(f"{group.nodepool}-tf-")
    assert claim["metadata"]["labels"][NODEPOOL_LABEL] == group.nodepool
    assert claim["metadata"]["labels"][GROUP] == group.name  # the NodePool template's labels
    assert DO_NOT_DISRUPT not in (claim["metadata"].get("annotations") or {})
    assert claim["metadata"]["annotations"]["team"] == "ml"
    assert claim["metadata"]["annotations"]["tensor-fusion.ai/expansion-template-node"] == template
    requirements = {r["key"]: r for r in claim["spec"]["requirements"]}
    assert requirements[INSTANCE_TYPE] == {"key": INSTANCE_TYPE, "operator": "In", "values": ["gpu-a100-1"]}
    assert requirements[ZONE]["values"] == ["zone-a", "zone-b"]  # the pod pins no zone
    assert requirements["karpenter.sh/capacity-type"]["values"] == ["on-demand"]
    assert claim["spec"]["nodeClassRef"]["kind"] == "KWOKNodeClass"
    assert claim["spec"]["taints"] == [TAINT]
    completed = wait_for_event(api_client, namespace, "one-more", "NodeExpansionCompleted")
    assert name in completed.message and f"a copy of node {template}" in completed.message

    new_node = group.karpenter.node_of_claim(name)  # Karpenter launched it
    bound = cpl.wait_for_pod_bound(api_client, namespace, "one-more", timeout=120)
    assert bound.spec.node_name == new_node != template
    assert len(group.expansion_claims()) == 2  # the first node's and this one


def test_twenty_pods_never_more_than_three_claims_in_flight(api_client, namespace, karpenter, make_group,
                                                           run_extender):
    run_extender(delay=1, max_in_flight=3)
    # Nodes take 4 s to appear, so that a fourth claim would show while three wait.
    group = make_group(node_class=karpenter.node_class("slow-4s", registration_delay="4s"))
    fill_first_node(api_client, namespace, group)
    names = [f"p{i:02d}" for i in range(20)]
    for name in names:
        create_pod(api_client, namespace, gpu_pod(name, group.name, "60Gi"))

    deadline = time.monotonic() + 600
    most_in_flight = 0
    while time.monotonic() < deadline:
        waiting = group.in_flight()
        most_in_flight = max(most_in_flight, len(waiting))
        assert len(waiting) <= 3, [c["metadata"]["name"] for c in waiting]
        if all(node_of(api_client, namespace, n) for n in names):
            break
        karpenter.check_alive()
        time.sleep(0.5)
    placed = {n: node_of(api_client, namespace, n) for n in names}
    assert all(placed.values()), {n: node for n, node in placed.items() if not node}
    assert len(set(placed.values())) == 20  # each on a node of its own
    assert len(group.expansion_claims()) == 21  # and no node more (the filler's first one included)
    assert most_in_flight == 3


def test_small_pods_that_fit_one_new_node_make_one_claim(api_client, namespace, group, run_extender):
    run_extender(delay=1)
    fill_first_node(api_client, namespace, group)  # 20Gi left on its GPU
    names = ["s1", "s2", "s3"]
    uids = [create_pod(api_client, namespace, gpu_pod(name, group.name, "25Gi"))["uid"] for name in names]
    for name in names:
        wait_for_event(api_client, namespace, name, "NodeExpansionCheck")
    nodes = {cpl.wait_for_pod_bound(api_client, namespace, n, timeout=120).spec.node_name for n in names}
    assert len(nodes) == 1
    claims = [c for uid in uids for c in group.claims_for(uid)]
    assert len(claims) == 1
    claims = group.registered_claims_for(next(uid for uid in uids if group.claims_for(uid)))
    assert claims[0]["status"]["nodeName"] in nodes
    assert len(group.expansion_claims()) == 2


def test_pod_whose_node_selector_matches_no_node_makes_no_claim(api_client, namespace, group, run_extender):
    run_extender(delay=1)
    fill_first_node(api_client, namespace, group)
    pod = create_pod(api_client, namespace,
                     gpu_pod("nowhere", group.name, "10Gi", node_selector={ZONE: "zone-nowhere"}))
    cpl.wait_until(lambda: cpl.scheduling_failure(api_client, namespace, "nowhere"), 60,
                   what="PodScheduled=False")
    time.sleep(5)
    assert group.claims_for(pod["uid"]) == [] and len(group.karpenter.claims(group.nodepool)) == 1
    assert cpl.pod_events(api_client, namespace, "nowhere", "NodeExpansionCheck") == []
    failed = cpl.pod_events(api_client, namespace, "nowhere", "NodeExpansionFailed")
    assert failed == [] or "excludes its nodes" in failed[0].message


def test_gpu_nodes_not_owned_by_karpenter_fail_without_a_claim(api_client, namespace, karpenter, run_extender,
                                                               make_node):
    """A node someone made by hand (no Karpenter NodeClaim): nothing can be copied. No NodePool here.
    Karpenter only: with the default (auto) such a pod gets a Cluster Autoscaler placeholder instead
    (tests/e2e/test_autoscaler_pods.py)."""
    run_extender(delay=1, node_provisioner="karpenter")
    name = uuid.uuid4().hex[:8]
    node = make_node(f"plain-{name}", labels={GROUP: name, INSTANCE_TYPE: "gpu-a100-1", ZONE: "zone-a"})
    karpenter.give_gpus(node, POOL)
    filler = create_pod(api_client, namespace, gpu_pod("filler", name, "60Gi"))
    cpl.wait_for_pod_bound(api_client, namespace, filler["name"], timeout=60)
    pod = create_pod(api_client, namespace, gpu_pod("orphan", name, "60Gi"))
    failed = wait_for_event(api_client, namespace, "orphan", "NodeExpansionFailed")
    assert "not owned by a Karpenter NodePool" in failed.message
    assert karpenter.claims(label_selector=f"{EXPANSION_POD_UID}={pod['uid']}") == []
    assert node_of(api_client, namespace, "orphan") is None
    karpenter.reset()


def test_pod_deleted_while_queued_makes_no_claim(api_client, namespace, group, run_extender):
    run_extender(delay=5)
    fill_first_node(api_client, namespace, group)
    pod = create_pod(api_client, namespace, gpu_pod("gone", group.name, "60Gi"))
    wait_for_event(api_client, namespace, "gone", "NodeExpansionCheck")
    client.CoreV1Api(api_client).delete_namespaced_pod("gone", namespace, grace_period_seconds=0)
    cpl.wait_for_pod_gone(api_client, namespace, "gone", timeout=30)
    time.sleep(8)
    assert group.claims_for(pod["uid"]) == [] and len(group.expansion_claims()) == 1

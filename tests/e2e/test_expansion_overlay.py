"""One provisioner per pod, with the real Karpenter provisioning GPU-blind for GPU pods (NodeOverlay on).

With the overlay Karpenter believes GPU nodes offer ``tensor-fusion.ai/index_*`` and launches a NodeClaim
for a pending GPU pod within its batch window (1-3 s here), long before a node boots (30 s here). The
expander must count that claim as capacity in flight (its Nominated event names it) and create nothing:
one pod, one node.
"""

from __future__ import annotations

import time

import pytest

from tests import harness as cpl
from tests.harness.expansion import (
    create_pod,
    gpu_pod,
    make_group_fixture,
    run_extender_fixture,
    wait_for_event,
)
from tests.harness.karpenter import karpenter_fixture

pytestmark = pytest.mark.e2e

karpenter = karpenter_fixture(node_overlay=True)
FIXTURES = (make_group_fixture, run_extender_fixture)


def test_a_pod_karpenter_provides_for_gets_no_second_node(api_client, namespace, karpenter, make_group,
                                                          run_extender):
    run_extender(delay=3)  # the expander looks after Karpenter's batch window
    group = make_group(node_class=karpenter.node_class("boot-30s", registration_delay="30s"))
    started = time.monotonic()
    create_pod(api_client, namespace, gpu_pod("only", group.name, "10Gi"))

    claims = cpl.wait_until(lambda: karpenter.claims(group.nodepool), 60, what="Karpenter's NodeClaim")
    claim = claims[0]["metadata"]["name"]
    nominated = wait_for_event(api_client, namespace, "only", "Nominated", timeout=30)
    assert f"nodeclaim/{claim}" in nominated.message
    waiting = wait_for_event(api_client, namespace, "only", "NodeExpansionWaiting", timeout=60)
    assert f"Karpenter's NodeClaim {claim}" in waiting.message

    node = cpl.wait_for_pod_bound(api_client, namespace, "only", timeout=150).spec.node_name
    landed = time.monotonic() - started
    time.sleep(5)  # nothing else comes
    names = [c["metadata"]["name"] for c in karpenter.claims(group.nodepool)]
    assert names == [claim], names
    assert [n.metadata.name for n in karpenter.nodes(group.nodepool)] == [node]
    assert cpl.pod_events(api_client, namespace, "only", "NodeExpansionCompleted") == []
    assert landed >= 30  # it waited for the slow node rather than buying another
    print(f"one pod, one node: landed {landed:.1f}s after creation on Karpenter's node {node}")

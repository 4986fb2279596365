"""Gang scale-up with the real Karpenter (KWOK provider, NodeOverlay off, as tests/e2e/test_expansion.py): a
gang larger than its pool buys every node it needs in one batch, and binds whole once they join; a gang whose
batch exceeds --max-inflight-nodes buys nothing (never part of its nodes)."""

from __future__ import annotations

import time

import pytest

from extender.common.timefmt import parse_time
from tests import harness as cpl
from tests.harness.expansion import (
    create_pod,
    fill_first_node,
    gpu_pod,
    group_fixture,
    make_group_fixture,
    node_of,
    run_extender_fixture,
    wait_for_event,
)
from tests.harness.karpenter import karpenter_fixture

pytestmark = pytest.mark.e2e

karpenter = karpenter_fixture(node_overlay=False)
FIXTURES = (group_fixture, make_group_fixture, run_extender_fixture)


def gang_member(name: str, group: str, namespace: str, members: int) -> dict:
    body = gpu_pod(name, group, "60Gi")  # one member per node: the GPUs are 80Gi
    body["metadata"]["annotations"].update({  # as the webhook stamps the pods of one workload
        "tensor-fusion.ai/gang-group-key": f"{namespace}/trainer",
        "tensor-fusion.ai/gang-desired-members": str(members),
        "tensor-fusion.ai/gang-required-members": str(members)})
    return body


def test_a_gang_larger_than_its_pool_buys_its_nodes_in_one_batch(api_client, namespace, group, run_extender):
    run_extender(delay=1)
    filler_node = fill_first_node(api_client, namespace, group)  # 20Gi left: no member fits
    names = ["m0", "m1", "m2"]
    uids = [create_pod(api_client, namespace, gang_member(n, group.name, namespace, 3))["uid"] for n in names]
    for name in names:
        wait_for_event(api_client, namespace, name, "NodeExpansionCompleted", timeout=90)
    claims = [c for uid in uids for c in group.claims_for(uid)]
    assert len(claims) == 3
    created = sorted(t for c in claims if (t := parse_time(c["metadata"]["creationTimestamp"])))
    # one batch, not one claim per retry
    assert len(created) == 3 and (created[-1] - created[0]).total_seconds() <= 2, created
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        bound = {n: node_of(api_client, namespace, n) for n in names}
        if all(bound.values()):
            break
        group.karpenter.check_alive()
        time.sleep(0.5)
    assert all(bound.values()), bound
    assert len(set(bound.values())) == 3 and filler_node not in bound.values()
    assert len(group.expansion_claims()) == 4  # the filler's node and the gang's three, nothing more
    for name in names:
        assert cpl.pod_events(api_client, namespace, name, "GangPlaced")


def test_a_gang_whose_batch_exceeds_the_in_flight_limit_buys_nothing(api_client, namespace, group,
                                                                    run_extender):
    run_extender(delay=1, max_in_flight=2)
    fill_first_node(api_client, namespace, group)
    names = ["m0", "m1", "m2"]
    uids = [create_pod(api_client, namespace, gang_member(n, group.name, namespace, 3))["uid"] for n in names]
    waiting = wait_for_event(api_client, namespace, "m0", "NodeExpansionWaiting", timeout=90)
    assert "needs 3 or more new nodes at once" in waiting.message, waiting.message
    time.sleep(5)
    assert [c for uid in uids for c in group.claims_for(uid)] == []  # not two of the three nodes
    assert all(node_of(api_client, namespace, n) is None for n in names)

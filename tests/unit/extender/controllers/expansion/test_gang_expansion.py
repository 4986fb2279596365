"""Scale-up for a gang as one demand: every claim the unmet members need in one batch, or none."""

from __future__ import annotations

import datetime as dt
from typing import Any

from extender.controllers.expansion.detect import REASON_CHECK, REASON_COMPLETED
from extender.controllers.expansion.worker import REASON_WAITING
from tests.unit.fixtures.expansion import CAPACITY_ONLY, FakePort, later, make
from tests.unit.fixtures.expansion import port as port  # the fixture

ZONE = "topology.kubernetes.io/zone"


def gang_pod(port: FakePort, name: str, gang: str = "train", members: int = 4, **kw: Any) -> dict[str, Any]:
    pod = port.add_pod(name, **kw)
    pod["metadata"]["annotations"].update({
        "tensor-fusion.ai/gang-group-key": f"ns/{gang}",
        "tensor-fusion.ai/gang-required-members": str(members),
        "tensor-fusion.ai/gang-desired-members": str(members)})
    return pod


async def test_a_gang_buys_every_node_it_needs_in_one_batch(port: FakePort) -> None:
    expander, clock = make(port)  # the template node has one 80Gi GPU: one 60Gi member per node
    for i in range(3):
        expander.notice(gang_pod(port, f"w{i}", members=3), CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert len(port.created) == 3
    for i in range(3):
        assert port.reasons(f"w{i}") == [REASON_CHECK, REASON_COMPLETED]


async def test_small_members_share_the_nodes_bought_for_their_gang(port: FakePort) -> None:
    expander, clock = make(port)
    for i in range(4):  # 4 x 20Gi fit one 80Gi GPU
        expander.notice(gang_pod(port, f"w{i}", vram="20Gi"), CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert len(port.created) == 1
    claim = port.created[0]["metadata"]["name"]
    assert sum(1 for i in range(4) if port.reasons(f"w{i}") == [REASON_CHECK, REASON_WAITING]) == 3
    assert all(claim in port.messages(f"w{i}", REASON_WAITING)[0] for i in range(1, 4))


async def test_a_gang_that_does_not_fit_the_in_flight_budget_buys_nothing(port: FakePort) -> None:
    expander, clock = make(port, max_in_flight=2)
    for i in range(3):
        expander.notice(gang_pod(port, f"w{i}", members=3), CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert port.created == []  # never two nodes for a gang of three that needs three
    message = port.messages("w0", REASON_WAITING)[0]
    assert "gang ns/train needs 3 or more new nodes at once" in message and "at most 2" in message
    await later(expander, clock, 60)
    assert port.created == [] and port.reasons("w0") == [REASON_CHECK, REASON_WAITING]  # said once


async def test_a_members_node_selector_narrows_what_is_bought_for_it(port: FakePort) -> None:
    expander, clock = make(port)
    expander.notice(gang_pod(port, "w0", members=2), CAPACITY_ONLY, ["n1"])
    odd = gang_pod(port, "w1", members=2, nodeSelector={ZONE: "z2"})
    expander.notice(odd, CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert len(port.created) == 2
    zones = [[r["values"] for r in c["spec"]["requirements"] if r["key"] == ZONE] for c in port.created]
    assert sorted(zones) == [[], [["z2"]]]


async def test_the_nodes_bought_for_a_deleted_gang_are_released(port: FakePort) -> None:
    expander, clock = make(port)
    for i in range(2):
        expander.notice(gang_pod(port, f"w{i}", members=2), CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert len(port.created) == 2
    del port.pods["ns/w0"]  # one member gone (its controller makes another): the gang still needs both
    await later(expander, clock, 1)
    assert port.deleted == []
    names = [c["metadata"]["name"] for c in port.created]
    del port.pods["ns/w1"]  # the whole gang gone
    await later(expander, clock, 1)
    assert sorted(port.deleted) == sorted(names) and len(expander.inflight) == 0


async def test_a_claim_bought_for_a_pod_outside_gangs_is_kept_when_the_pod_goes(port: FakePort) -> None:
    expander, clock = make(port)
    expander.notice(port.add_pod("solo"), CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    del port.pods["ns/solo"]
    await later(expander, clock, 1)
    assert port.deleted == []  # the single-pod rules are unchanged


async def test_a_gang_whose_timeout_passed_buys_nothing(port: FakePort) -> None:
    expander, clock = make(port)
    for i in range(2):
        pod = gang_pod(port, f"w{i}", members=2)
        pod["metadata"]["annotations"]["tensor-fusion.ai/gang-timeout"] = "600s"
        pod["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z"
        expander.notice(pod, CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert port.created == []


async def test_the_nodes_bought_for_a_gang_whose_timeout_passed_are_released(port: FakePort) -> None:
    expander, clock = make(port)
    for i in range(2):
        pod = gang_pod(port, f"w{i}", members=2)
        pod["metadata"]["annotations"]["tensor-fusion.ai/gang-timeout"] = "600s"
        pod["metadata"]["creationTimestamp"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        expander.notice(pod, CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert len(port.created) == 2
    for i in range(2):  # the gang's timeout passes before the nodes come
        port.pods[f"ns/w{i}"]["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z"
    await later(expander, clock, 1)
    assert sorted(port.deleted) == sorted(c["metadata"]["name"] for c in port.created)

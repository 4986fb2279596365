"""The expander next to the real Karpenter: its claims count as in flight (one provisioner per pod), pools
grow from zero out of their NodePool, and GPU NodePools that consolidate GPU-blind get a warning."""

from __future__ import annotations

from typing import Any

import pytest

from extender.common.labels import EXPANSION_INSTANCE_TYPE, EXPANSION_NODEPOOL, INSTANCE_TYPE, NODEPOOL_LABEL
from extender.controllers.expansion.detect import REASON_CHECK, REASON_COMPLETED, REASON_FAILED
from extender.controllers.expansion.karpenter import (
    claim_devices,
    node_usable,
    nominated_claims,
    pool_nodepools,
)
from extender.controllers.expansion.worker import REASON_CONSOLIDATION, REASON_SKIPPED, REASON_WAITING
from extender.scheduling.state import FilterOutcome
from tests.unit.fixtures.expansion import CAPACITY_ONLY, FakePort, later, make
from tests.unit.fixtures.expansion import port as port  # the fixture

GFD = {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
       "nvidia.com/gpu.memory": "81920"}
NO_GPU_OF_POOL = FilterOutcome([], {}, {"cpu-1": "no GPU in pool pool-a on this node"}, None, False)


def karpenter_claim(port: FakePort, name: str, labels: dict[str, str] | None = None,
                    conditions: list[dict[str, str]] | None = None) -> None:
    port.claims[name] = {"metadata": {"name": name, "labels": {NODEPOOL_LABEL: "gpu", **(labels or {})}},
                         "spec": {}, "status": {"conditions": conditions or []}}


def nominated(port: FakePort, pod: str, claim: str, stamp: str = "2026-01-01T00:00:00Z") -> None:
    port.pod_event_list.append({"reason": "Nominated", "involvedObject": {"uid": f"uid-{pod}"},
                                "lastTimestamp": stamp,
                                "message": f"Pod should schedule on: nodeclaim/{claim}"})


def gpu_nodepool(port: FakePort, name: str = "gpu-zero", labels: dict[str, str] | None = None,
                 instance_types: tuple[str, ...] = ("gpu-a100-1",), **spec: Any) -> None:
    port.nodepools[name] = {"metadata": {"name": name, "uid": f"uid-{name}"}, "spec": {
        "template": {"metadata": {"labels": {"tensor-fusion.ai/gpupool": "pool-a", **GFD, **(labels or {})}},
                     "spec": {"nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass",
                                               "name": "default"},
                              "requirements": [{"key": INSTANCE_TYPE, "operator": "In",
                                                "values": list(instance_types)}]}},
        "disruption": {"consolidationPolicy": "WhenEmpty"}, **spec}}


# -- one provisioner per pod ------------------------------------------------------------------------------


async def test_a_karpenter_claim_with_room_for_the_pod_means_no_second_node(port: FakePort) -> None:
    expander, clock = make(port)
    karpenter_claim(port, "gpu-abc", GFD | {"tensor-fusion.ai/gpupool": "pool-a"})
    expander.notice(port.add_pod("p"), CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert port.created == []
    assert port.reasons("p") == [REASON_CHECK, REASON_WAITING]
    assert "Karpenter's NodeClaim gpu-abc" in port.messages("p", REASON_WAITING)[0]
    # a second pod that still fits the same node waits for it too; a third does not fit any more
    expander.notice(port.add_pod("q", vram="10Gi"), CAPACITY_ONLY, ["n1"])
    expander.notice(port.add_pod("r"), CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert port.reasons("q") == [REASON_CHECK, REASON_WAITING]
    assert port.reasons("r") == [REASON_CHECK, REASON_COMPLETED] and len(port.created) == 1


async def test_a_claim_karpenter_nominated_the_pod_to_holds_it_even_when_its_gpus_are_unknown(
        port: FakePort) -> None:
    expander, clock = make(port)
    karpenter_claim(port, "gpu-xyz")  # no GPU labels, no node of its type yet
    nominated(port, "p", "gpu-old", "2026-01-01T00:00:00Z")
    nominated(port, "p", "gpu-xyz", "2026-01-01T00:00:05Z")
    expander.notice(port.add_pod("p"), CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert port.created == [] and "gpu-xyz" in port.messages("p", REASON_WAITING)[0]
    # its node registers with GPUs: the claim leaves; the pod may expand again at a failure after the grace
    port.karpenter_delivers("gpu-xyz")
    await later(expander, clock, 1)
    assert "gpu-xyz" not in expander.inflight and "uid-p" in expander.flagged
    await later(expander, clock, 15)
    assert "uid-p" not in expander.flagged


@pytest.mark.parametrize(("case", "rejected_in_grace", "bound_by_then", "claims"), [
    ("rejected before the scheduler saw the node, then placed", True, True, 1),
    ("rejected although the node arrived: it went elsewhere", True, False, 2),
    ("not rejected in the grace: waits for its next failure", False, False, 1),
])
async def test_a_rejection_just_after_the_node_arrived_waits_for_the_grace(
        port: FakePort, case: str, rejected_in_grace: bool, bound_by_then: bool, claims: int) -> None:
    expander, clock = make(port, delay_seconds=1.0)
    pod = port.add_pod("p")
    expander.notice(pod, CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 1)
    assert len(port.created) == 1
    port.karpenter_delivers(port.created[0]["metadata"]["name"])
    await later(expander, clock, 1)
    assert len(expander.inflight) == 0
    if rejected_in_grace:
        expander.notice(pod, CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 5)
    assert len(port.created) == 1, case  # nothing at once
    if bound_by_then:
        port.pods["ns/p"]["spec"]["nodeName"] = "node-of-new"
    await later(expander, clock, 10)
    assert len(port.created) == claims, case
    if not rejected_in_grace:
        expander.notice(pod, CAPACITY_ONLY, ["n1"])  # a later failure flags it again
        await later(expander, clock, 1)
        assert len(port.created) == 2, case


@pytest.mark.parametrize(("case", "conditions", "deleting"), [
    ("initialized", [{"type": "Initialized", "status": "True"}], False),
    ("ready", [{"type": "Ready", "status": "True"}], False),
    ("being deleted", [], True),
])
async def test_karpenter_claims_that_are_done_or_going_are_not_in_flight(
        port: FakePort, case: str, conditions: Any, deleting: bool) -> None:
    expander, clock = make(port)
    karpenter_claim(port, "gpu-done", GFD | {"tensor-fusion.ai/gpupool": "pool-a"}, conditions)
    if deleting:
        port.claims["gpu-done"]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    expander.notice(port.add_pod("p"), CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert len(port.created) == 1, case


async def test_karpenter_claims_do_not_use_up_the_in_flight_limit(port: FakePort) -> None:
    expander, clock = make(port, max_in_flight=1)
    for i in range(3):
        karpenter_claim(port, f"gpu-other-{i}")  # unknown shape, nominated to nobody here
    expander.notice(port.add_pod("p"), CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert len(port.created) == 1


def test_nominated_claims_newest_first_without_duplicates() -> None:
    events = [
        {"reason": "Nominated", "lastTimestamp": "2026-01-01T00:00:01Z",
         "message": "Pod should schedule on: nodeclaim/gpu-a, node/kwok-gpu-a-x"},
        {"reason": "Nominated", "lastTimestamp": "2026-01-01T00:00:03Z",
         "message": "Pod should schedule on: nodeclaim/gpu-b"},
        {"reason": "FailedScheduling", "message": "nodeclaim/gpu-c"},
        {"reason": "Nominated", "lastTimestamp": "2026-01-01T00:00:02Z", "message": "Pod should schedule on: "
                                                                                   "node/plain"},
        {"reason": "Nominated", "eventTime": "2026-01-01T00:00:00.5Z",
         "message": "Pod should schedule on: nodeclaim/gpu-a"},
    ]
    assert nominated_claims(events) == ["gpu-b", "gpu-a"]


def test_claim_gpus_come_from_labels_else_from_a_node_of_the_same_nodepool_and_type(port: FakePort) -> None:
    labelled = {"metadata": {"name": "c1", "labels": GFD | {"tensor-fusion.ai/gpupool": "pool-a"}}}
    devices = claim_devices(labelled, [], port.node_gpus)
    assert [(d.node, d.pool, d.capacity_vram) for d in devices] == [("c1", "pool-a", 80 << 30)]
    launched = {"metadata": {"name": "c2", "labels": {NODEPOOL_LABEL: "gpu", INSTANCE_TYPE: "p4d.24xlarge"}}}
    assert [d.name for d in claim_devices(launched, port.all_nodes(), port.node_gpus)] == ["n1-g0"]
    other = {"metadata": {"name": "c3", "labels": {NODEPOOL_LABEL: "gpu", INSTANCE_TYPE: "other"}}}
    assert claim_devices(other, port.all_nodes(), port.node_gpus) == []


# -- scale from zero ---------------------------------------------------------------------------------------


async def test_a_pool_with_no_gpu_node_grows_from_its_nodepool(port: FakePort) -> None:
    gpu_nodepool(port)
    expander, clock = make(port)
    pod = port.add_pod("p")
    expander.notice(pod, NO_GPU_OF_POOL, ["cpu-1"])
    assert port.reasons("p") == [REASON_CHECK]
    await later(expander, clock, 10)
    assert len(port.created) == 1
    claim = port.created[0]
    assert claim["metadata"]["labels"][NODEPOOL_LABEL] == "gpu-zero"
    assert {"key": INSTANCE_TYPE, "operator": "In", "values": ["gpu-a100-1"]} in claim["spec"]["requirements"]
    assert claim["spec"]["nodeClassRef"]["name"] == "default"
    assert "from the NodePool's template" in port.messages("p", REASON_COMPLETED)[0]
    # a second pod that fits the node on its way waits for it
    expander.notice(port.add_pod("q", vram="10Gi"), NO_GPU_OF_POOL, ["cpu-1"])
    await later(expander, clock, 10)
    assert len(port.created) == 1 and port.reasons("q") == [REASON_CHECK, REASON_WAITING]


async def test_static_gpu_nodes_full_grow_from_the_pools_nodepool(port: FakePort) -> None:
    """A pool of GPU nodes Karpenter did not make (none can be copied) with a NodePool for bursts: the
    claim comes from the NodePool, as with no GPU node at all; without a NodePool the reason names the
    node."""
    port.add_template("static-1", karpenter=False)
    expander, clock = make(port)
    expander.notice(port.add_pod("p"), CAPACITY_ONLY, ["static-1"])
    await later(expander, clock, 10)
    assert port.created == []
    assert "static-1: not owned by a Karpenter NodePool" in port.messages("p", REASON_FAILED)[0]
    gpu_nodepool(port)
    expander.notice(port.add_pod("q"), CAPACITY_ONLY, ["static-1"])
    await later(expander, clock, 10)
    # q, and p on its retry: one one-GPU node each
    assert [c["metadata"]["labels"][NODEPOOL_LABEL] for c in port.created] == ["gpu-zero", "gpu-zero"]
    assert port.reasons("q")[-1] == REASON_COMPLETED and port.reasons("p")[-1] == REASON_COMPLETED


async def test_a_pod_the_scheduler_never_sent_to_the_extender_also_grows_the_pool(port: FakePort) -> None:
    gpu_nodepool(port)
    expander, clock = make(port)
    pod = port.add_pod("p", schedulerName="tensor-fusion-scheduler")
    expander.pod_changed(pod)  # still pending, not marked Unschedulable yet: nothing
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    other = port.add_pod("o", schedulerName="default-scheduler")
    other["status"]["conditions"] = pod["status"]["conditions"]
    expander.pod_changed(other)
    expander.pod_changed(pod)
    expander.pod_changed(pod)
    await later(expander, clock, 10)
    assert len(port.created) == 1 and port.reasons("p") == [REASON_CHECK, REASON_COMPLETED]
    assert port.reasons("o") == []


async def test_a_pod_the_extender_has_seen_with_candidates_is_not_taken_for_a_zero_candidate_one(
        port: FakePort) -> None:
    gpu_nodepool(port)
    expander, clock = make(port)
    pod = port.add_pod("p", schedulerName="tensor-fusion-scheduler")
    expander.notice(pod, FilterOutcome([], {}, {"n1": "no GPU of model H100"}, None, False), ["n1"])
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    expander.pod_changed(pod)
    await later(expander, clock, 10)
    assert port.created == [] and port.events == []


@pytest.mark.parametrize(("case", "setup", "wanted"), [
    ("annotation names the NodePool and the instance type",
     lambda port: (gpu_nodepool(port, "named", instance_types=("gpu-a100-1", "gpu-a100-2")),
                   port.nodepools["named"]["spec"]["template"]["metadata"]["labels"].pop(
                       "tensor-fusion.ai/gpupool"),
                   port.gpupools.update({"pool-a": {"metadata": {"name": "pool-a", "annotations": {
                       EXPANSION_NODEPOOL: "named", EXPANSION_INSTANCE_TYPE: "gpu-a100-2"}}}})),
     ("named", ["gpu-a100-2"])),
    ("several instance types and no annotation: Karpenter picks",
     lambda port: gpu_nodepool(port, "multi", instance_types=("gpu-a100-1", "gpu-a100-2")),
     ("multi", ["gpu-a100-1", "gpu-a100-2"])),
])
async def test_which_nodepool_and_instance_type_a_pool_grows_from(port: FakePort, case: str, setup: Any,
                                                                   wanted: tuple[str, list[str]]) -> None:
    setup(port)
    expander, clock = make(port)
    expander.notice(port.add_pod("p"), NO_GPU_OF_POOL, ["cpu-1"])
    await later(expander, clock, 10)
    claim = port.created[0]
    types = next(r["values"] for r in claim["spec"]["requirements"] if r["key"] == INSTANCE_TYPE)
    assert (claim["metadata"]["labels"][NODEPOOL_LABEL], types) == wanted, case


@pytest.mark.parametrize(("case", "labels", "reason"), [
    ("no GPU labels", {"nvidia.com/gpu.count": None}, "no GPU discovery labels"),
    ("unknown product", {"nvidia.com/gpu.product": "Acme-X"}, "not a known model"),
    ("too small", {"nvidia.com/gpu.product": "NVIDIA-A10", "nvidia.com/gpu.memory": "24576"},
     "even an empty node would not fit"),
    ("another pool's nodes", {"tensor-fusion.ai/gpupool": "pool-b"}, "puts nodes in GPU pool pool-b"),
])
async def test_a_nodepool_that_cannot_make_a_fitting_node_fails_with_the_reason(
        port: FakePort, case: str, labels: dict[str, Any], reason: str) -> None:
    gpu_nodepool(port)
    port.gpupools["pool-a"] = {"metadata": {"name": "pool-a",
                                            "annotations": {EXPANSION_NODEPOOL: "gpu-zero"}}}
    template = port.nodepools["gpu-zero"]["spec"]["template"]["metadata"]["labels"]
    for key, value in labels.items():
        if value is None:
            template.pop(key)
        else:
            template[key] = value
    expander, clock = make(port)
    expander.notice(port.add_pod("p", nodeSelector={"team": "a"}), NO_GPU_OF_POOL, ["cpu-1"])
    await later(expander, clock, 10)
    assert port.created == [], case
    assert reason in port.messages("p", REASON_FAILED)[0], case


@pytest.mark.parametrize(("case", "nodepool"), [("no NodePool", False), ("its nodes not selected", True)])
async def test_without_a_nodepool_for_the_pod_hopeless_pods_start_nothing(port: FakePort, case: str,
                                                                          nodepool: bool) -> None:
    if nodepool:
        gpu_nodepool(port)
    expander, clock = make(port)
    expander.notice(port.add_pod("p", nodeSelector={INSTANCE_TYPE: "cpu-8"}), NO_GPU_OF_POOL, ["cpu-1"])
    await later(expander, clock, 10)
    assert port.created == [] and port.reasons("p") == [], case
    assert REASON_SKIPPED not in port.reasons("p")


def test_pool_nodepools_by_annotation_or_template_label() -> None:
    a = {"metadata": {"name": "a"}, "spec": {"template": {"metadata": {"labels": {
        "tensor-fusion.ai/gpupool": "p"}}}}}
    b = {"metadata": {"name": "b"}, "spec": {}}
    assert pool_nodepools(None, "p", [b, a]) == [a]
    assert pool_nodepools({"metadata": {"annotations": {EXPANSION_NODEPOOL: "b"}}}, "p", [a, b]) == [b]
    assert pool_nodepools(None, "q", [a, b]) == []


# -- GPU-blind consolidation ---------------------------------------------------------------------------------


async def test_gpu_nodepools_that_consolidate_when_underutilized_get_one_warning(port: FakePort) -> None:
    gpu_nodepool(port, "risky", disruption={"consolidationPolicy": "WhenEmptyOrUnderutilized"})
    gpu_nodepool(port, "safe")
    port.nodepools["cpu"] = {"metadata": {"name": "cpu", "uid": "c"}, "spec": {"template": {}}}
    port.nodepools["gpu"]["spec"]["disruption"] = {}  # Karpenter's default policy; its node n1 has GPUs
    expander, clock = make(port)
    for _ in range(3):
        await later(expander, clock, 31)
    warned = [(name, reason) for name, reason, _ in port.events]
    assert sorted(warned) == [("gpu", REASON_CONSOLIDATION), ("risky", REASON_CONSOLIDATION)]
    assert "WhenEmpty" in port.messages("risky", REASON_CONSOLIDATION)[0]
    port.nodepools["risky"]["spec"]["disruption"]["consolidationPolicy"] = "WhenEmpty"
    port.nodepools["safe"]["spec"]["disruption"]["consolidationPolicy"] = "WhenEmptyOrUnderutilized"
    await later(expander, clock, 31)
    assert [name for name, _, _ in port.events].count("safe") == 1


@pytest.mark.parametrize(("case", "node", "usable"), [
    ("ready", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}, True),
    ("not ready yet", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}, False),
    ("no conditions", {}, False),
    ("Karpenter has not registered it", {
        "spec": {"taints": [{"key": "karpenter.sh/unregistered", "effect": "NoExecute"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}}, False),
    ("other taints are the scheduler's business", {
        "spec": {"taints": [{"key": "example.com/gpu", "effect": "PreferNoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}}, True),
    ("cordoned", {"spec": {"unschedulable": True},
                  "status": {"conditions": [{"type": "Ready", "status": "True"}]}}, False),
])
def test_a_claims_node_counts_as_arrived_only_once_the_scheduler_can_use_it(case: str, node: dict[str, Any],
                                                                          usable: bool) -> None:
    assert node_usable(node) is usable, case

"""The expander's behaviour as a user sees it (claims created, events on the pod), with the cluster
behind a small in-memory port and a hand-driven clock."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from extender.common.labels import DO_NOT_DISRUPT, INSTANCE_TYPE, NODEPOOL_LABEL
from extender.controllers.expansion.config import ExpansionConfig
from extender.controllers.expansion.detect import REASON_CHECK, REASON_COMPLETED, REASON_FAILED
from extender.controllers.expansion.worker import REASON_SKIPPED, REASON_WAITING, Expander
from extender.scheduling.state import FilterOutcome
from tests.unit.fixtures.expansion import CAPACITY_ONLY, Clock, FakePort, gpu, later, make
from tests.unit.fixtures.expansion import port as port  # the fixture


def metric(expander: Expander, name: str, **labels: str) -> float:
    return expander.metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_capacity_only_failure_creates_one_claim_after_the_delay(port: FakePort) -> None:
    expander, clock = make(port)
    pod = port.add_pod("p")
    for _ in range(5):  # the scheduler retries
        expander.notice(pod, CAPACITY_ONLY, ["n1"])
    assert port.reasons("p") == [REASON_CHECK]
    assert metric(expander, "tf_extender_capacity_only_failures_total", pool="pool-a") == 1
    await later(expander, clock, 9)
    assert port.created == []  # the scheduler may still find room on existing nodes
    await later(expander, clock, 1)
    assert len(port.created) == 1
    assert metric(expander, "tf_extender_nodeclaims_created_total", nodepool="gpu") == 1
    claim = port.created[0]
    assert claim["metadata"]["labels"][NODEPOOL_LABEL] == "gpu"
    assert DO_NOT_DISRUPT not in claim["metadata"]["annotations"]
    assert port.reasons("p") == [REASON_CHECK, REASON_COMPLETED]
    assert claim["metadata"]["name"] in port.messages("p", REASON_COMPLETED)[0]
    for _ in range(3):  # flagged once: later rejections start nothing
        expander.notice(pod, CAPACITY_ONLY, ["n1"])
        await later(expander, clock, 20)
    assert len(port.created) == 1


@pytest.mark.parametrize(("case", "change"), [
    ("bound", lambda pod: pod["spec"].update(nodeName="n1")),
    ("nominated", lambda pod: pod["status"].update(nominatedNodeName="n1")),
    ("being deleted", lambda pod: pod["metadata"].update(deletionTimestamp="2024-01-01T00:00:00Z")),
    ("recreated under the same name", lambda pod: pod["metadata"].update(uid="other")),
])
async def test_a_pod_that_moved_on_during_the_delay_creates_nothing(port: FakePort, case: str,
                                                                   change: Any) -> None:
    expander, clock = make(port)
    pod = port.add_pod("p")
    expander.notice(pod, CAPACITY_ONLY, ["n1"])
    change(port.pods["ns/p"])
    await later(expander, clock, 10)
    assert port.created == [] and port.reasons("p") == [REASON_CHECK], case


async def test_a_pod_deleted_while_queued_creates_nothing(port: FakePort) -> None:
    expander, clock = make(port)
    expander.notice(port.add_pod("p"), CAPACITY_ONLY, ["n1"])
    del port.pods["ns/p"]
    await later(expander, clock, 10)
    assert port.created == [] and expander.queued == 0


async def test_small_pods_that_fit_one_new_node_create_one_claim(port: FakePort) -> None:
    expander, clock = make(port)
    for name in ("a", "b", "c", "d"):
        expander.notice(port.add_pod(name, vram="20Gi"), CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert len(port.created) == 1
    claim = port.created[0]["metadata"]["name"]
    for name in ("b", "c", "d"):
        assert port.reasons(name) == [REASON_CHECK, REASON_WAITING]
        assert claim in port.messages(name, REASON_WAITING)[0]
    expander.notice(port.add_pod("e", vram="20Gi"), CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert len(port.created) == 2  # four 20Gi pods fill the 80Gi GPU


async def test_gpu_nodes_not_owned_by_karpenter_fail_with_the_reason() -> None:
    port = FakePort()
    port.add_template(karpenter=False)
    expander, clock = make(port)
    expander.notice(port.add_pod("p"), CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert port.created == []
    assert port.reasons("p") == [REASON_CHECK, REASON_FAILED]
    assert "n1: not owned by a Karpenter NodePool" in port.messages("p", REASON_FAILED)[0]


@pytest.mark.parametrize(("case", "break_it", "reason"), [
    ("no claim owns the node", lambda p: p.claims.clear(), "no Karpenter NodeClaim owns it"),
    ("the NodePool is gone", lambda p: p.nodepools.clear(), "NodePool gpu was not found"),
    ("even an empty node is too small", lambda p: p.gpus.update(n1=[gpu("g", "n1", vram=40)]),
     "even an empty copy would not fit"),
])
async def test_no_template_means_no_claim(port: FakePort, case: str, break_it: Any, reason: str) -> None:
    expander, clock = make(port)
    expander.notice(port.add_pod("p"), CAPACITY_ONLY, ["n1"])
    break_it(port)
    await later(expander, clock, 10)
    assert port.created == [], case
    assert reason in port.messages("p", REASON_FAILED)[0], case


async def test_candidates_without_gpus_are_left_to_karpenter(port: FakePort) -> None:
    expander, clock = make(port)
    expander.notice(port.add_pod("p"), CAPACITY_ONLY, ["cpu-1", "cpu-2"])
    await later(expander, clock, 10)
    assert port.created == []
    assert "no NodePool is configured for it" in port.messages("p", REASON_SKIPPED)[0]


async def test_max_in_flight_makes_pods_wait_for_a_slot(port: FakePort) -> None:
    expander, clock = make(port, max_in_flight=2)
    for name in ("a", "b", "c", "d"):
        expander.notice(port.add_pod(name), CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert len(port.created) == 2 and expander.queued == 2
    assert port.reasons("c") == [REASON_CHECK, REASON_WAITING]
    await later(expander, clock, 60)
    assert len(port.created) == 2 and port.reasons("c") == [REASON_CHECK, REASON_WAITING]  # said once
    port.karpenter_delivers(port.created[0]["metadata"]["name"])
    await later(expander, clock, 1)  # the claim leaves; waiting pods retry after the delay
    assert len(port.created) == 2 and len(expander.inflight) == 1
    await later(expander, clock, 10)
    assert len(port.created) == 3 and expander.queued == 1
    assert len(expander.inflight) == 2


async def test_a_claim_without_a_node_times_out_and_says_so(port: FakePort) -> None:
    expander, clock = make(port, claim_timeout_seconds=120)
    pod = port.add_pod("p")
    expander.notice(pod, CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    await later(expander, clock, 121)
    assert len(expander.inflight) == 0
    assert "got no node within 120s" in port.messages("p", REASON_FAILED)[0]
    expander.notice(pod, CAPACITY_ONLY, ["n1"])  # considered again
    await later(expander, clock, 10)
    assert len(port.created) == 2


@pytest.mark.parametrize("mode", ["Karpenter", "Provisioned"])
async def test_pools_not_in_autoselect_mode_are_not_expanded(port: FakePort, mode: str) -> None:
    port.gpupools["pool-a"] = {"metadata": {"name": "pool-a"},
                               "spec": {"nodeManagerConfig": {"provisioningMode": mode}}}
    expander, clock = make(port)
    expander.notice(port.add_pod("p"), CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert port.created == [] and port.events == []


async def test_the_expander_can_be_turned_off(port: FakePort) -> None:
    expander, clock = make(port, enabled=False)
    expander.notice(port.add_pod("p"), CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert port.created == [] and port.events == []


async def test_other_failures_start_nothing(port: FakePort) -> None:
    expander, clock = make(port)
    pod = port.add_pod("p")
    expander.notice(pod, FilterOutcome([], {}, {"n1": "no GPU of model H100"}, None, False), ["n1"])
    expander.notice(pod, FilterOutcome(["n1"], {}, {}, None, False), ["n1"])
    expander.notice(pod, CAPACITY_ONLY, [])
    expander.notice({"metadata": "garbage"}, CAPACITY_ONLY, ["n1"])  # never raises
    await later(expander, clock, 10)
    assert port.created == [] and port.events == []


async def test_a_failed_create_is_reported_and_retried_at_the_next_rejection(port: FakePort) -> None:
    expander, clock = make(port)
    pod = port.add_pod("p")
    port.fail_create = RuntimeError("HTTP 422: spec.requirements invalid")
    expander.notice(pod, CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert "HTTP 422" in port.messages("p", REASON_FAILED)[0]
    port.fail_create = None
    expander.notice(pod, CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert len(port.created) == 1


async def test_only_the_lease_holder_creates_claims(port: FakePort) -> None:
    expander, clock = make(port)
    expander.notice(port.add_pod("p"), CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 30, leader=False)
    assert port.created == []
    await later(expander, clock, 1)
    assert len(port.created) == 1


async def test_claims_in_flight_before_a_restart_still_count(port: FakePort) -> None:
    first, clock = make(port)
    first.notice(port.add_pod("a", vram="20Gi"), CAPACITY_ONLY, ["n1"])
    await later(first, clock, 10)
    restarted, clock = make(port)
    restarted.adopt_existing_claims()
    assert len(restarted.inflight) == 1
    restarted.notice(port.add_pod("b", vram="20Gi"), CAPACITY_ONLY, ["n1"])
    await later(restarted, clock, 10)
    assert len(port.created) == 1 and port.reasons("b") == [REASON_CHECK, REASON_WAITING]


async def test_a_standby_that_takes_over_counts_the_claims_its_leader_made_while_it_stood_by(
        port: FakePort) -> None:
    """Two replicas: the standby's passes run from the start (nothing to adopt then), the leader buys a
    node for a pod and dies before it lands; the standby, leading now, is asked about the same pod and a
    small one: both wait for the claim already on its way, nothing is bought twice."""
    leader, clock = make(port)
    standby, standby_clock = make(port)
    await later(standby, standby_clock, 1, leader=False)
    pod = port.add_pod("p")
    leader.notice(pod, CAPACITY_ONLY, ["n1"])
    await later(leader, clock, 10)
    assert len(port.created) == 1
    claim = port.created[0]["metadata"]["name"]
    await later(standby, standby_clock, 1, leader=False)  # the claim reaches the standby's cache
    standby.notice(pod, CAPACITY_ONLY, ["n1"])  # its kube-scheduler leads now and turns the pod away
    standby.notice(port.add_pod("small", vram="20Gi"), CAPACITY_ONLY, ["n1"])
    await later(standby, standby_clock, 10)
    await later(standby, standby_clock, 10)
    assert len(port.created) == 1
    assert claim in port.messages("p", REASON_WAITING)[0]
    assert claim in port.messages("small", REASON_WAITING)[0]  # the 20Gi the 60Gi pod leaves on its GPU


# --- level triggering: pending pods are reconsidered when their inputs change -----------------------------

NO_GPU_OF_POOL = FilterOutcome([], {}, {"cpu1": "no GPU of pool pool-a"}, None, False)


def burst_nodepool() -> dict[str, Any]:
    """A NodePool the pool grows from zero out of (pool label and GPU discovery labels on its template)."""
    return {"metadata": {"name": "burst", "uid": "b"}, "spec": {"template": {
        "metadata": {"labels": {"tensor-fusion.ai/gpupool": "pool-a", "nvidia.com/gpu.count": "1",
                                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},
        "spec": {"nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "c"},
                 "requirements": [{"key": INSTANCE_TYPE, "operator": "In", "values": ["gpu-a100-1"]}]}},
        "disruption": {"consolidationPolicy": "WhenEmpty"}}}


class Refilter:
    """The filter on the current picture: what the test says the candidates hold now."""

    def __init__(self, outcome: FilterOutcome) -> None:
        self.outcome = outcome
        self.calls = 0

    def __call__(self, pod: dict[str, Any], candidates: Sequence[str]) -> FilterOutcome:
        self.calls += 1
        return self.outcome


def leveled(port: FakePort, refilter: Refilter | None = None) -> tuple[Expander, Clock]:
    clock = Clock()
    ids = iter(f"e{i}" for i in range(1000))
    config = ExpansionConfig(delay_seconds=10.0, claim_timeout_seconds=300.0)
    expander = Expander(config, port, clock=clock, new_id=lambda: next(ids), refilter=refilter)
    return expander, clock


def unschedulable_pod(port: FakePort, name: str) -> dict[str, Any]:
    pod = port.add_pod(name, schedulerName="tensor-fusion-scheduler")
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    return pod


async def test_a_pod_turned_away_before_its_nodepool_was_known_expands_once_it_is() -> None:
    """The defect: the only rejection came while the caches knew no NodePool, and nothing looked again
    until kube-scheduler's retry five minutes later."""
    port = FakePort()
    expander, clock = leveled(port, Refilter(NO_GPU_OF_POOL))
    pod = port.add_pod("burst-1")
    expander.notice(pod, NO_GPU_OF_POOL, ["cpu1"])
    await later(expander, clock, 30)
    assert port.created == [] and port.events == []  # nothing to grow from yet
    port.nodepools["burst"] = burst_nodepool()
    expander.wake()
    await later(expander, clock, 1)
    assert len(port.created) == 1  # turned away 31 s ago: the delay is over, so at once
    assert port.reasons("burst-1") == [REASON_CHECK, REASON_COMPLETED]
    assert port.created[0]["metadata"]["labels"][NODEPOOL_LABEL] == "burst"
    for _ in range(10):  # many passes, one node's worth of demand: one claim
        expander.wake()
        await later(expander, clock, 5)
    assert len(port.created) == 1 and port.reasons("burst-1") == [REASON_CHECK, REASON_COMPLETED]


async def test_a_standby_taking_over_a_scale_from_zero_fills_the_node_its_leader_bought() -> None:
    """Both replicas watched the pods turned away; the leader bought a node from the NodePool for the first
    and died. The standby, leading now, lets that pod wait for it and puts a small one that came later on
    the same node (the GPUs the claim's discovery labels name): nothing more is bought."""
    port = FakePort()
    port.nodepools["burst"] = burst_nodepool()
    leader, clock = leveled(port)
    standby, standby_clock = leveled(port)
    big = unschedulable_pod(port, "big")
    for replica in (leader, standby):
        replica.pod_changed(big)
    await later(standby, standby_clock, 1, leader=False)
    await later(leader, clock, 10)
    assert len(port.created) == 1
    claim = port.created[0]["metadata"]["name"]
    small = port.add_pod("small", vram="20Gi", schedulerName="tensor-fusion-scheduler")
    small["status"]["conditions"] = big["status"]["conditions"]
    standby.pod_changed(small)
    await later(standby, standby_clock, 10, leader=False)
    for _ in range(3):
        await later(standby, standby_clock, 10)
    assert len(port.created) == 1
    assert claim in port.messages("big", REASON_WAITING)[0]
    assert claim in port.messages("small", REASON_WAITING)[0]


async def test_a_pod_the_scheduler_never_sent_expands_once_its_nodepool_exists() -> None:
    port = FakePort()
    expander, clock = leveled(port)
    pod = unschedulable_pod(port, "alone")
    expander.pod_changed(pod)
    await later(expander, clock, 20)
    assert port.created == []
    port.nodepools["burst"] = burst_nodepool()
    await later(expander, clock, 5)  # no wake-up at all: the periodic pass finds it
    assert len(port.created) == 1
    pod["spec"]["nodeName"] = "new-node"
    expander.pod_changed(pod)  # bound: no longer pending
    assert "uid-alone" not in expander.pending


async def test_a_pending_pod_that_fits_now_is_left_to_the_scheduler() -> None:
    port = FakePort()
    refilter = Refilter(NO_GPU_OF_POOL)
    expander, clock = leveled(port, refilter)
    expander.notice(port.add_pod("p"), NO_GPU_OF_POOL, ["cpu1"])
    refilter.outcome = FilterOutcome(["cpu1"], {}, {}, None, False)  # GPUs appeared on cpu1
    port.nodepools["burst"] = burst_nodepool()
    await later(expander, clock, 30)
    assert refilter.calls >= 1 and port.created == []


async def test_a_pod_parked_without_a_template_expands_when_one_appears_and_is_told_once() -> None:
    port = FakePort()
    port.add_template(karpenter=False)  # a GPU node no NodeClaim owns: nothing to copy
    expander, clock = leveled(port, Refilter(CAPACITY_ONLY))
    expander.notice(port.add_pod("p"), CAPACITY_ONLY, ["n1"])
    for _ in range(6):
        await later(expander, clock, 10)
    assert port.created == [] and port.reasons("p") == [REASON_CHECK, REASON_FAILED]  # not once a pass
    port.add_template()  # now Karpenter owns it
    expander.wake()
    await later(expander, clock, 1)
    assert len(port.created) == 1


async def test_a_pod_is_not_reconsidered_on_stale_candidates_right_after_a_node_arrived() -> None:
    port = FakePort()
    expander, clock = leveled(port, Refilter(NO_GPU_OF_POOL))
    expander.notice(port.add_pod("p"), NO_GPU_OF_POOL, ["cpu1"])
    port.nodepools["burst"] = burst_nodepool()
    port.added_at = clock.now + 1  # a node joined after the pod was turned away
    await later(expander, clock, 10)
    assert port.created == []  # kube-scheduler tries the new node first
    await later(expander, clock, 10)
    assert len(port.created) == 1  # it did not take the pod: the pod grows its own


async def test_a_failed_create_is_tried_again_without_a_new_rejection(port: FakePort) -> None:
    expander, clock = leveled(port, Refilter(CAPACITY_ONLY))
    expander.notice(port.add_pod("p"), CAPACITY_ONLY, ["n1"])
    port.fail_create = RuntimeError("HTTP 500")
    await later(expander, clock, 10)
    assert port.reasons("p") == [REASON_CHECK, REASON_FAILED] and port.created == []
    port.fail_create = None
    await later(expander, clock, 20)
    assert port.created == []  # not before the retry interval
    for _ in range(3):
        await later(expander, clock, 10)
    assert len(port.created) == 1


async def test_deleted_pods_leave_the_pending_set(port: FakePort) -> None:
    expander, clock = leveled(port, Refilter(CAPACITY_ONLY))
    expander.notice(port.add_pod("p"), FilterOutcome([], {}, {"n1": "other"}, None, False), ["n1"])
    assert "uid-p" in expander.pending
    del port.pods["ns/p"]
    await later(expander, clock, 6)
    assert not expander.pending


async def test_a_pending_pod_with_a_bad_request_is_dropped_quietly(
        port: FakePort, caplog: pytest.LogCaptureFixture) -> None:
    expander, clock = leveled(port, Refilter(CAPACITY_ONLY))
    pod = port.add_pod("bad")
    expander.notice(pod, FilterOutcome([], {}, {"n1": "other"}, None, False), ["n1"])
    pod["metadata"]["annotations"]["tensor-fusion.ai/tflops-request"] = "lots"
    await later(expander, clock, 6)
    assert not expander.pending and port.created == [] and port.events == []
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


async def test_a_follower_settles_claims_in_flight_but_creates_none(port: FakePort) -> None:
    leader, clock = make(port)
    leader.notice(port.add_pod("a", vram="20Gi"), CAPACITY_ONLY, ["n1"])
    await later(leader, clock, 10)
    (claim,) = port.created
    follower, clock = make(port)
    await later(follower, clock, 0, leader=False)  # its first pass adopts the claim
    assert len(follower.inflight) == 1
    follower.notice(port.add_pod("b", vram="80Gi"), CAPACITY_ONLY, ["n1"])
    await later(follower, clock, 30, leader=False)
    assert len(port.created) == 1 and follower.queued == 1  # flagged and queued, but only a leader decides
    port.karpenter_delivers(claim["metadata"]["name"])
    await later(follower, clock, 1, leader=False)
    assert len(follower.inflight) == 0  # the claim's node arrived: settled on the follower too


async def test_the_leader_pass_runs_again_when_the_next_pod_is_due(port: FakePort) -> None:
    expander, clock = make(port)
    assert await later(expander, clock, 0) == 1.0  # nothing due: the tick
    expander.notice(port.add_pod("p"), CAPACITY_ONLY, ["n1"])
    assert await later(expander, clock, 9.75) == pytest.approx(0.25)
    await later(expander, clock, 0.25)
    assert len(port.created) == 1


async def test_on_the_runner_only_the_leader_creates_claims(port: FakePort) -> None:
    import asyncio

    from extender.common.tasks import cancel_and_wait
    from extender.controllers.runner import Runner
    from tests.unit.fixtures.fakes import eventually

    class Lead:
        is_leader = False

    expander, _ = make(port, delay_seconds=0.0)
    claims, decisions = expander.controllers
    assert (claims.leader_only, decisions.leader_only) == (False, True)
    lead = Lead()
    runner = Runner(lead)
    tasks = [asyncio.create_task(runner.run(c)) for c in expander.controllers]
    try:
        expander.notice(port.add_pod("p"), CAPACITY_ONLY, ["n1"])
        await eventually(lambda: expander.queued == 1)
        await asyncio.sleep(0.2)
        assert port.created == []
        lead.is_leader = True
        await eventually(lambda: len(port.created) == 1)
    finally:
        await cancel_and_wait(tasks)

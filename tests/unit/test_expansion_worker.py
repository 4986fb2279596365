"""The expander's behaviour as a user sees it (claims created, events on the pod), with the cluster
behind a small in-memory port and a hand-driven clock."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from extender.common.labels import DO_NOT_DISRUPT, INSTANCE_TYPE, NODEPOOL_LABEL
from extender.controllers.expansion.config import ExpansionConfig
from extender.controllers.expansion.detect import REASON_CHECK, REASON_COMPLETED, REASON_FAILED
from extender.controllers.expansion.worker import REASON_SKIPPED, REASON_WAITING, Expander
from extender.scheduling.inventory import NANO, GPUDevice
from extender.scheduling.state import FilterOutcome

Gi = 1 << 30
CAPACITY_ONLY = FilterOutcome([], {"n1": "busy"}, {}, None, True)


def gpu(name: str, node: str, vram: int = 80) -> GPUDevice:
    return GPUDevice(name=name, node=node, pool="pool-a", model="A100", vendor="NVIDIA", index=0,
                     phase="Running", used_by="tensor-fusion", isolation_mode="soft",
                     capacity_tflops=312 * NANO, capacity_vram=vram * Gi)


class FakePort:
    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.gpus: dict[str, list[GPUDevice]] = {}
        self.claims: dict[str, dict[str, Any]] = {}
        self.nodepools: dict[str, dict[str, Any]] = {}
        self.gpupools: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[str, str, str]] = []
        self.created: list[dict[str, Any]] = []
        self.fail_create: Exception | None = None
        self.pod_event_list: list[dict[str, Any]] = []
        self.added_at: float | None = None

    # cluster view
    def node(self, name: str) -> Mapping[str, Any] | None:
        return self.nodes.get(name)

    def node_gpus(self, name: str) -> Sequence[GPUDevice]:
        return self.gpus.get(name, [])

    def nodeclaims(self) -> Sequence[Mapping[str, Any]]:
        return list(self.claims.values())

    def nodeclaim(self, name: str) -> Mapping[str, Any] | None:
        return self.claims.get(name)

    def nodepool(self, name: str) -> Mapping[str, Any] | None:
        return self.nodepools.get(name)

    def gpupool(self, name: str) -> Mapping[str, Any] | None:
        return self.gpupools.get(name)

    def node_arrived(self, node_name: str, provider_id: str) -> bool:
        return node_name in self.nodes and bool(self.gpus.get(node_name))

    def all_nodes(self) -> Sequence[Mapping[str, Any]]:
        return list(self.nodes.values())

    def all_nodepools(self) -> Sequence[Mapping[str, Any]]:
        return list(self.nodepools.values())

    async def pod_events(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        return [e for e in self.pod_event_list if e["involvedObject"]["uid"] == uid]

    def record(self, obj: Mapping[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        self.events.append((obj["metadata"]["name"], reason, message))

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        pod = self.pods.get(f"{namespace}/{name}")
        return copy.deepcopy(pod) if pod else None

    def cached_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.pods.get(f"{namespace}/{name}")

    def node_added_at(self) -> float | None:
        return self.added_at

    async def create_nodeclaim(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.fail_create is not None:
            raise self.fail_create
        created = copy.deepcopy(body)
        created["metadata"]["name"] = f"{body['metadata']['generateName']}{len(self.created)}"
        self.claims[created["metadata"]["name"]] = created
        self.created.append(created)
        return created

    # the test plays the cluster
    def add_template(self, node: str = "n1", karpenter: bool = True) -> None:
        labels = {INSTANCE_TYPE: "p4d.24xlarge"}
        if karpenter:
            labels[NODEPOOL_LABEL] = "gpu"
            self.claims[f"claim-{node}"] = {"metadata": {"name": f"claim-{node}"}, "spec": {
                "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "c"},
                "requirements": []}, "status": {"nodeName": node}}
        self.nodes[node] = {"metadata": {"name": node, "labels": labels}, "spec": {}}
        self.gpus[node] = [gpu(f"{node}-g0", node)]
        self.nodepools["gpu"] = {"metadata": {"name": "gpu", "uid": "u"}, "spec": {"template": {
            "metadata": {"annotations": {DO_NOT_DISRUPT: "true"}},
            "spec": {"requirements": [{"key": INSTANCE_TYPE, "operator": "Exists"}]}},
            "disruption": {"consolidationPolicy": "WhenEmpty"}}}

    def add_pod(self, name: str, vram: str = "60Gi", **spec: Any) -> dict[str, Any]:
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": {
                   "tensor-fusion.ai/gpupool": "pool-a", "tensor-fusion.ai/tflops-request": "10",
                   "tensor-fusion.ai/vram-request": vram}},
               "spec": dict(spec), "status": {"phase": "Pending"}}
        self.pods[f"ns/{name}"] = pod
        return pod

    def karpenter_delivers(self, claim: str) -> None:
        node = f"node-of-{claim}"
        self.nodes[node] = {"metadata": {"name": node, "labels": {}}, "spec": {}}
        self.gpus[node] = [gpu(f"{node}-g0", node)]
        self.claims[claim]["status"] = {"nodeName": node}

    def reasons(self, pod: str) -> list[str]:
        return [reason for name, reason, _ in self.events if name == pod]

    def messages(self, pod: str, reason: str) -> list[str]:
        return [message for name, r, message in self.events if name == pod and r == reason]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def port() -> FakePort:
    p = FakePort()
    p.add_template()
    return p


def make(port: FakePort, **config: Any) -> tuple[Expander, Clock]:
    clock = Clock()
    settings = {"delay_seconds": 10.0, "claim_timeout_seconds": 300.0} | config
    ids = iter(f"e{i}" for i in range(1000))
    expander = Expander(ExpansionConfig(**settings), port, clock=clock, new_id=lambda: next(ids))
    return expander, clock


async def later(expander: Expander, clock: Clock, seconds: float, *, leader: bool = True) -> float | None:
    """Advance the clock and run one pass as the runner would: the every-replica reconcile, then (on the
    leader) the leader-only one; the leader's requeue."""
    clock.now += seconds
    await expander.reconcile_claims()
    return await expander.reconcile_decisions() if leader else None


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

    from extender_fakes import eventually

    from extender.common.tasks import cancel_and_wait
    from extender.controllers.runner import Runner

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

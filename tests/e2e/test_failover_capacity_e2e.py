"""Failover while the pool is buying capacity: two kube-scheduler + tf-extender replicas, as the chart runs
them, and the leading pair gone in the middle of a purchase. Another replica takes over and finishes it;
nothing is bought twice.

- A Provisioned pool on moto's EC2 server (tests/harness/cloud.py): pods that each need a VM of their own
  arrive, the leader starts buying, and goes while its second RunInstances is on the wire (the proxy in
  front of moto holds that call, then lets it reach the cloud: a VM bought for a claim its buyer may never
  record). ``CloudInit`` boots every VM into a kwok Node. Three ways to go: SIGKILLed (the call lands
  after its caller died); a rolling update (a new pair up first, the leader SIGTERMed, the cloud answering
  while it terminates, then a second new pair and the old standby SIGTERMed); cut off from the API server
  but not from the cloud (it steps down, its held call is answered after that, and it must neither buy
  nor finish anything more, then or once the network heals).
- Node expansion with the real Karpenter (KWOK provider, tests/harness/karpenter.py): pods that each need a
  node of their own, in a pool with no node yet, grow it from its NodePool; the leader is killed right
  after it created the first NodeClaims, whose nodes take longer to come than the takeover (a registration
  delay), so the standby leads while they are still on their way.

Each ends with every pod bound once to GPUs of its own node, no GPU over its capacity, as many VMs or
NodeClaims as the pods needed and none bought twice (one VM per GPUNodeClaim, one NodeClaim per pod), and
the takeover timed: the standby leads within the Lease duration plus one retry (the next round after a
SIGTERM, which releases the Leases), and the first pod is bound within a few seconds of that.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from extender.controllers import LEASE_DURATION_SECONDS, LEASE_RENEW_DEADLINE_SECONDS, LEASE_RENEW_SECONDS
from extender.controllers.runner import LEADER_POLL_SECONDS
from tests import harness as cpl
from tests.harness import cloud
from tests.harness.expansion import EXPANSION_LABEL, EXPANSION_POD_UID
from tests.harness.karpenter import Karpenter, karpenter_fixture
from tests.harness.provisioned import POOL_LABEL, CloudInit, claims_of, provisioned_pool_body, release_pool
from tests.harness.replicas import (
    Binds,
    Replica,
    ReplicaSet,
    canonical_gpu_pod,
    placement_problems,
    start_two,
    when_both_lead,
)

pytestmark = pytest.mark.e2e

TAKEOVER = LEASE_DURATION_SECONDS + LEASE_RENEW_SECONDS  # the Lease duration plus one retry
CLUSTER = "e2e-failover-capacity"
VMS = 4  # pods, each asking for a whole A10G: one g5.xlarge each
A10G_TFLOPS = 70  # what the GPU model table says of the A10G GPU Feature Discovery names
NODES = 3  # pods, each asking for 60Gi of an 80Gi A100: a node each
A100_TFLOPS = 312
REGISTRATION_DELAY = 30  # seconds a Karpenter node takes to come: longer than a takeover

# the Provisioned pool's leader-only controllers (extender/controllers/capacity/controller.py)
PROVISIONED_CONTROLLERS = ("provisioner", "provisioned-launch", "provisioned-registration",
                           "provisioned-termination", "provisioned-garbagecollection")

karpenter = karpenter_fixture(node_overlay=False)


def slack() -> float:
    return 3.0 * cpl.TIMEOUT_SCALE  # sampling and a loaded machine


# --- a Provisioned pool on EC2 -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ec2() -> Iterator[tuple[cloud.MotoServer, cloud.CapacityProxy, cloud.EC2World]]:
    with cloud.ec2_cloud() as (moto, proxy):
        yield moto, proxy, cloud.seed(proxy.url)


@dataclass
class ProvisionedPairs:
    pairs: ReplicaSet
    pool: str
    args: list[str]
    proxy: cloud.CapacityProxy
    boot: CloudInit


@pytest.fixture
def provisioned(control_plane, kwok, e2e_binaries, namespace, api_client, ec2,
                tmp_path: Path) -> Iterator[ProvisionedPairs]:
    """Two pairs' makings (not started) with a Provisioned pool of g5.xlarge in one zone, no minimum: what
    it buys, its pods asked for. The pool is released while the pairs still run, so the leader's finalizers
    terminate the VMs."""
    _, proxy, world = ec2
    profile = f"tf-fc-{uuid.uuid4().hex[:6]}"
    pool = f"{profile}-pool"
    cpl.create_cluster_object(api_client, "gpunodeclasses", cloud.node_class_body(pool, world))
    body = provisioned_pool_body(pool, [
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["g5.xlarge"]},
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]}])
    del body["spec"]["capacityConfig"]
    cpl.create_cluster_object(api_client, "gpupools", body)
    vendor = cloud.vendor_file(proxy.url, tmp_path)
    args = ["--capacity-interval", "1", "--computing-vendor", str(vendor), "--cluster-name", CLUSTER,
            "--node-join-timeout", "120", "--orphan-grace", "120", "--node-protection-time", "600",
            "--capacity-error-backoff", "120", "--log-level", "debug",
            # the claims record the vendor they were bought through; its endpoint and key files are the
            # emulator's and this test's, and their VMs are terminated through them
            "--cloud-endpoint-allow", "http://127.0.0.1", "--cloud-key-dir", str(tmp_path)]
    pairs = ReplicaSet(control_plane, e2e_binaries["kube-scheduler"], namespace, profile)
    boot = cloud.ec2_cloud_init(api_client, proxy.url, CLUSTER)
    try:
        yield ProvisionedPairs(pairs, pool, args, proxy, boot)
    finally:
        proxy.release()
        boot.stop()
        with contextlib.suppress(Exception):
            client.CoreV1Api(api_client).delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        release_pool(api_client, pool)
        pairs.close()


def pool_gpus(core: client.CoreV1Api, pool: str) -> dict[str, str]:
    """GPU name -> node, for the pool's nodes (GPUs from GPU Feature Discovery labels are named so)."""
    gpus: dict[str, str] = {}
    for node in core.list_node(label_selector=f"{POOL_LABEL}={pool}").items:
        count = int((node.metadata.labels or {}).get("nvidia.com/gpu.count") or 0)
        gpus.update({f"{node.metadata.name}-gpu-{i}": node.metadata.name for i in range(count)})
    return gpus


def vm_problems(endpoint: str, pool: str, claims: list[dict[str, Any]], wanted: int) -> list[str]:
    """What a bill would show for the pool: a claim without exactly one VM, a VM no claim recorded, more or
    fewer VMs than the pods needed, or one bought and terminated on the way (the cloud is the module's: the
    VMs of an earlier test's pool are there, terminated)."""
    every = cloud.instances(endpoint, **{cloud.CLUSTER_TAG: CLUSTER, POOL_LABEL: pool})
    live = [i for i in every if i["State"]["Name"] in ("pending", "running")]
    tagged: Counter[str] = Counter()
    for instance in every:
        tags = {t["Key"]: t["Value"] for t in instance.get("Tags") or []}
        tagged[tags.get(cloud.CLAIM_TAG, "")] += 1
    problems = []
    if len(every) != wanted or len(live) != wanted:
        problems.append(f"{len(every)} VMs launched, {len(live)} live, for {wanted} pods that each need one")
    if len(claims) != wanted:
        problems.append(f"{len(claims)} GPUNodeClaims for {wanted} pods")
    recorded = {str((c.get("status") or {}).get("instanceID") or "") for c in claims}
    for claim in claims:
        name = claim["metadata"]["name"]
        if tagged[name] != 1:
            problems.append(f"claim {name}: {tagged[name]} VMs tagged with it")
    problems += [f"VM {i['InstanceId']}: no claim recorded it"
                 for i in live if i["InstanceId"] not in recorded]
    return problems


@dataclass
class Disruption:
    """How the leading pair goes while its second RunInstances is held on the wire: ``before`` runs before
    any pod, ``disrupt`` ends the leader's term and returns when a scheduler and an extender of the rest
    led, ``then`` runs once a pod was bound after it, ``settle`` once every pod is. ``within`` bounds the
    seconds from the disruption to the extender's takeover."""

    pairs: ReplicaSet
    proxy: cloud.CapacityProxy
    args: list[str]
    leader: Replica
    standby: Replica
    at: float = 0.0
    note: str = ""  # what the variant saw, for the printed line

    def within(self) -> tuple[float, float]:
        return 0.0, TAKEOVER + slack()

    def before(self) -> None:
        pass

    def disrupt(self) -> dict[str, float]:
        raise NotImplementedError

    def then(self) -> None:
        pass

    def settle(self) -> None:
        pass


class SigKill(Disruption):
    """A node lost: the pair SIGKILLed; the held call reaches the cloud after its caller died, a VM nobody
    recorded."""

    def disrupt(self) -> dict[str, float]:
        self.leader.kill()
        self.at = time.monotonic()
        self.proxy.release()
        return when_both_lead(self.standby)


class RollingUpdate(Disruption):
    """maxSurge 1, maxUnavailable 0: a new pair up before any old one goes, then the old leader SIGTERMed
    (the cloud answers its held call while it terminates), a second new pair, then the old standby, which
    may lead and be buying by then."""

    new: list[Replica]

    def within(self) -> tuple[float, float]:
        return 0.0, LEASE_RENEW_SECONDS + 5.0 * cpl.TIMEOUT_SCALE  # released on SIGTERM: no expiry to wait

    def before(self) -> None:
        self.new = [self.pairs.start(extra_args=self.args)]

    def disrupt(self) -> dict[str, float]:
        self.at = time.monotonic()
        answer = threading.Timer(1.0, self.proxy.release)
        answer.start()
        self.leader.stop()
        answer.join()
        return when_both_lead(self.standby, *self.new)

    def then(self) -> None:
        self.note = "; the old standby's extender led" if self.standby.extender_leads() else \
            "; a new pair's extender led"
        self.new.append(self.pairs.start(extra_args=self.args))
        self.standby.stop()

    def settle(self) -> None:
        assert [r for r in self.pairs.replicas if r.alive()] == self.new
        cpl.wait_until(lambda: sum(r.extender_leads() for r in self.new) == 1, 3 * LEASE_RENEW_SECONDS,
                       interval=0.2, what="one new extender to lead")


class Partition(Disruption):
    """The leader cut off from the API server (not from the cloud): its extender steps down within its renew
    deadline, its held call is answered after that, and it buys nothing more; the standby takes over once
    the Lease expired. Healed at the end, it stays a follower and still buys nothing."""

    stepped_down = 0.0
    bought_cut_off = 0  # RunInstances calls after the step-down, before the standby led: the cut-off one's
    passes_at_step_down = 0.0

    def passes(self) -> float:
        """Passes of the Provisioned-pool controllers the cut-off extender finished (a cancelled one is not
        counted)."""
        return sum(self.leader.extender_metric("controller_runtime_reconcile_total", controller=name)
                   for name in PROVISIONED_CONTROLLERS)

    def within(self) -> tuple[float, float]:
        return LEASE_DURATION_SECONDS - LEASE_RENEW_SECONDS, TAKEOVER + LEASE_RENEW_SECONDS + slack()

    def disrupt(self) -> dict[str, float]:
        self.leader.proxy.cut()
        self.at = time.monotonic()
        cpl.wait_until(lambda: not self.leader.extender_leads(), 30, interval=0.2,
                       what="the cut-off extender to step down")
        self.stepped_down = time.monotonic() - self.at
        self.note = f"; the cut-off extender stepped down after {self.stepped_down:.1f} s"
        # its passes in flight stop within a leader poll; the launch pass waits on the held call till then
        time.sleep(LEADER_POLL_SECONDS + 1.0)
        self.passes_at_step_down = self.passes()
        self.proxy.release()
        launched = self.proxy.launches

        def count() -> None:
            launches = self.proxy.launches  # read first: the standby did not lead when it was read
            if not self.standby.extender_leads():
                self.bought_cut_off = launches - launched

        return when_both_lead(self.standby, meanwhile=count)

    def then(self) -> None:
        # the cut-off kube-scheduler exits once it cannot renew (leader election lost)
        cpl.wait_until(lambda: not self.leader.scheduler.alive(), 60, interval=0.5,
                       what="the cut-off scheduler to exit")

    def settle(self) -> None:
        assert self.stepped_down <= LEASE_RENEW_DEADLINE_SECONDS + 2.0 * cpl.TIMEOUT_SCALE
        assert self.bought_cut_off == 0, f"{self.bought_cut_off} RunInstances after the leader stepped down"
        launched = self.proxy.launches
        self.leader.proxy.heal()
        time.sleep(LEASE_RENEW_SECONDS * 2 + 2)  # a few renew rounds and capacity passes
        assert self.standby.extender_leads() and not self.leader.extender_leads()  # the healed one follows
        assert self.proxy.launches == launched, "RunInstances after the partition healed"
        # what a pass in flight had still to do (the next claim and its VM, a claim's phase) is not done
        # when the answer comes or the network heals: the pass stopped with the leadership
        finished = self.passes() - self.passes_at_step_down
        assert finished == 0, f"the cut-off extender finished {finished:g} passes after it stepped down"


@pytest.mark.parametrize("disruption", [SigKill, RollingUpdate, Partition],
                         ids=["sigkill", "rolling-update", "partition"])
def test_the_leader_gone_while_buying_vms_for_a_provisioned_pool(api_client, provisioned, namespace,
                                                                 disruption: type[Disruption]):
    core = client.CoreV1Api(api_client)
    proxy, pool = provisioned.proxy, provisioned.pool
    leader, standby = start_two(provisioned.pairs, provisioned.args)
    how = disruption(provisioned.pairs, proxy, provisioned.args, leader, standby)
    how.before()
    launched_before = proxy.launches
    proxy.hold_after(1)  # the leader's second RunInstances waits on the wire
    binds = Binds(core, namespace)
    try:
        for i in range(VMS):
            cpl.create_pod(api_client, namespace, canonical_gpu_pod(
                f"needs-a-vm-{i}", provisioned.pairs.profile, pool, str(A10G_TFLOPS), "20Gi", index=i + 1))
        cpl.wait_until(lambda: proxy.holding, 60, interval=0.05, what="the leader's second RunInstances")
        at_disruption = [c["metadata"]["name"] for c in claims_of(api_client, pool)]
        led = how.disrupt()
        scheduler_led, extender_led = led["scheduler"] - how.at, led["extender"] - how.at
        recovered = binds.first_bind_after(how.at) - how.at
        how.then()
        binds.wait(VMS, 180)
        print(f"provisioned, {disruption.__name__}: {len(at_disruption)} claims made, "
              f"{binds.bound_at(how.at)} of {VMS} pods bound at the disruption; scheduler led after "
              f"{scheduler_led:.1f} s, extender after {extender_led:.1f} s, first bind after "
              f"{recovered:.1f} s, all {VMS} bound after {binds.samples[-1][0] - how.at:.1f} s{how.note}")
        low, high = how.within()
        assert low <= extender_led <= high
        # the new nodes' pool label and the claims' Bound phase are the leader's to write: a bind follows
        # within a few capacity passes of the extender leading
        assert recovered <= max(scheduler_led, extender_led) + slack()
        pods = core.list_namespaced_pod(namespace).items
        assert len(pods) == VMS
        problems = placement_problems(pods, pool_gpus(core, pool), A10G_TFLOPS)
        claims = claims_of(api_client, pool)
        problems += vm_problems(proxy.url, pool, claims, VMS)
        assert not problems, problems
        launches = proxy.launches - launched_before
        assert launches == VMS, f"{launches} RunInstances calls for {VMS} VMs"
        assert len({p.spec.node_name for p in pods}) == VMS
        assert set(at_disruption) <= {c["metadata"]["name"] for c in claims}  # the old leader's carried on
        how.settle()
    finally:
        binds.stop()


# --- node expansion with the real Karpenter ------------------------------------------------------------


@dataclass
class ExpansionPairs:
    pairs: ReplicaSet
    pool: str
    nodepool: str
    args: list[str]


@pytest.fixture
def expansion(cluster, karpenter: Karpenter, e2e_binaries, namespace, api_client) -> Iterator[ExpansionPairs]:
    """Two pairs' makings (not started) with a GPUPool that has no node and a NodePool to grow it from
    (one A100 per node, its nodes registering ``REGISTRATION_DELAY`` seconds after launch)."""
    profile = f"tf-fx-{uuid.uuid4().hex[:6]}"
    pool = f"{profile}-pool"
    cpl.create_cluster_object(api_client, "gpupools", {
        "apiVersion": f"{cpl.TF_GROUP}/{cpl.TF_VERSION}", "kind": "GPUPool", "metadata": {"name": pool},
        "spec": {}})
    node_class = karpenter.node_class(f"{profile}-slow", registration_delay=f"{REGISTRATION_DELAY}s")
    nodepool = karpenter.nodepool(pool, name=f"{profile}-np", node_class=node_class,
                                  labels={"e2e-failover": profile})
    args = ["--expansion-delay", "1", "--max-inflight-nodes", "15", "--expansion-claim-timeout", "600",
            "--expansion-scheduler-name", profile, "--log-level", "debug"]
    pairs = ReplicaSet(cluster, e2e_binaries["kube-scheduler"], namespace, profile)
    try:
        yield ExpansionPairs(pairs, pool, nodepool, args)
    finally:
        with contextlib.suppress(Exception):
            client.CoreV1Api(api_client).delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        pairs.close()
        karpenter.reset()
        with contextlib.suppress(Exception):
            client.CustomObjectsApi(api_client).delete_cluster_custom_object(
                cpl.TF_GROUP, cpl.TF_VERSION, "gpupools", pool)


def test_the_leader_killed_right_after_it_created_nodeclaims(api_client, expansion, karpenter, namespace):
    core = client.CoreV1Api(api_client)
    pool, nodepool, profile = expansion.pool, expansion.nodepool, expansion.pairs.profile
    leader, standby = start_two(expansion.pairs, expansion.args)
    binds = Binds(core, namespace)

    def ours() -> list[dict[str, Any]]:
        return karpenter.claims(nodepool, EXPANSION_LABEL)

    try:
        uids = []
        for i in range(NODES):
            body = canonical_gpu_pod(f"needs-a-node-{i}", profile, pool, "10", "60Gi", index=i + 1)
            body["spec"]["nodeSelector"] = {"e2e-failover": profile}
            uids.append(cpl.create_pod(api_client, namespace, body).metadata.uid)
        cpl.wait_until(ours, 60, interval=0.05, what="the leader's first NodeClaim")
        leader.kill()
        killed = time.monotonic()
        at_kill = [c["metadata"]["name"] for c in ours()]
        led = when_both_lead(standby)
        scheduler_led, extender_led = led["scheduler"] - killed, led["extender"] - killed
        binds.wait(NODES, 180)
        recovered = binds.first_bind_after(killed) - killed
        time.sleep(3)  # a claim bought twice shows by now: the standby decided long before the nodes came
        claims = ours()
        print(f"expansion: killed with {len(at_kill)} of {NODES} NodeClaims made; scheduler led after "
              f"{scheduler_led:.1f} s, extender after {extender_led:.1f} s, first bind after "
              f"{recovered:.1f} s (nodes register {REGISTRATION_DELAY} s after launch), "
              f"{len(claims)} NodeClaims in all")
        assert extender_led <= TAKEOVER + slack()
        bought_for = {c["metadata"]["name"]: (c["metadata"].get("labels") or {}).get(EXPANSION_POD_UID)
                      for c in claims}
        per_pod = Counter(bought_for.values())
        assert len(claims) == NODES and all(per_pod[uid] == 1 for uid in uids), bought_for
        assert set(at_kill) <= {c["metadata"]["name"] for c in claims}
        pods = core.list_namespaced_pod(namespace).items
        problems = placement_problems(pods, pool_gpus(core, pool), A100_TFLOPS)
        assert not problems, problems
        assert len({p.spec.node_name for p in pods}) == NODES
        assert {p.spec.node_name for p in pods} == {n.metadata.name for n in karpenter.nodes(nodepool)}
    finally:
        binds.stop()

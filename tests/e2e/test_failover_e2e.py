"""Two kube-scheduler + tf-extender replicas, as the chart runs them, through a 300-pod burst: the leading
pair SIGKILLed midway, a rolling update (a new pair up before an old one goes, maxUnavailable 0), and the
leader cut off from the API server. Each ends with every pod bound, each to GPUs of its own node, no GPU over
its capacity, and the time to recover measured: the standby leads within the Lease duration plus one
retry, and answers its first filter from a ledger its watches kept synced."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from kubernetes import client

from extender.controllers import (
    LEADER_LEASE,
    LEASE_DURATION_SECONDS,
    LEASE_RENEW_DEADLINE_SECONDS,
    LEASE_RENEW_SECONDS,
)
from tests import harness as cpl
from tests.harness.replicas import (
    Binds,
    ReplicaSet,
    canonical_gpu_pod,
    make_gpu_nodes,
    placement_problems,
    start_two,
    when_both_lead,
)

pytestmark = pytest.mark.e2e

NODES, GPUS_PER_NODE, PODS = 10, 2, 300
GPU_TFLOPS, GPU_VRAM_GI = 150, 150
POD_TFLOPS, POD_VRAM_GI = 10, 10  # 15 pods fill a GPU: the 20 GPUs hold exactly the 300 pods
# kube-scheduler's own leader election: 15 s Lease, 2 s retry (its defaults, the shipped configuration)
TAKEOVER = LEASE_DURATION_SECONDS + LEASE_RENEW_SECONDS


@pytest.fixture
def replicas(control_plane, kwok, e2e_binaries, namespace, api_client, make_node, make_gpu):
    profile = f"tf-ha-{uuid.uuid4().hex[:6]}"
    pool = f"{profile}-pool"
    cpl.create_cluster_object(api_client, "gpupools", {
        "apiVersion": f"{cpl.TF_GROUP}/{cpl.TF_VERSION}", "kind": "GPUPool", "metadata": {"name": pool},
        "spec": {}})
    gpus = make_gpu_nodes(make_node, make_gpu, profile, pool, NODES, GPUS_PER_NODE, GPU_TFLOPS, GPU_VRAM_GI)
    pairs = ReplicaSet(control_plane, e2e_binaries["kube-scheduler"], namespace, profile)
    pairs.pool, pairs.gpus = pool, gpus  # type: ignore[attr-defined]
    try:
        yield pairs
    finally:
        pairs.close()
        with contextlib.suppress(Exception):
            client.CustomObjectsApi(api_client).delete_cluster_custom_object(
                cpl.TF_GROUP, cpl.TF_VERSION, "gpupools", pool)


def burst(api_client, pairs: ReplicaSet, namespace: str) -> Callable[[], None]:
    """Creates the PODS pods from 8 threads in the background; returns a join."""
    pool = pairs.pool  # type: ignore[attr-defined]

    def create(i: int) -> None:
        cpl.create_pod(api_client, namespace, canonical_gpu_pod(
            f"burst-{i:03d}", pairs.profile, pool, str(POD_TFLOPS), f"{POD_VRAM_GI}Gi", index=i % 128 + 1))

    executor = ThreadPoolExecutor(max_workers=8)
    futures = [executor.submit(create, i) for i in range(PODS)]

    def join() -> None:
        for f in futures:
            f.result()
        executor.shutdown()

    return join


def check_nothing_lost(core: client.CoreV1Api, namespace: str, pairs: ReplicaSet) -> None:
    pods = core.list_namespaced_pod(namespace).items
    assert len(pods) == PODS
    problems = placement_problems(pods, pairs.gpus, GPU_TFLOPS)  # type: ignore[attr-defined]
    assert not problems, f"{len(problems)} problems, e.g. {problems[:5]}"


def not_ready_filters(replica) -> float:
    return replica.extender_metric("tf_extender_requests_total", verb="filter", outcome="not_ready")


def test_the_leading_pair_killed_mid_burst(api_client, replicas, namespace):
    core = client.CoreV1Api(api_client)
    leader, standby = start_two(replicas)
    binds = Binds(core, namespace)
    try:
        join = burst(api_client, replicas, namespace)
        binds.wait(PODS // 3, 180)
        leader.kill()
        killed = time.monotonic()
        led = when_both_lead(standby)
        led_at = led["scheduler"]
        scheduler_led, extender_led = led["scheduler"] - killed, led["extender"] - killed
        join()
        binds.wait(PODS, 300)
        recovered = binds.first_bind_after(led_at) - killed  # binds sent before the kill may land after it
        print(f"killed with {max(n for t, n in binds.samples if t <= killed)} of {PODS} bound; scheduler led "
              f"after {scheduler_led:.1f} s, extender after {extender_led:.1f} s, first bind after "
              f"{recovered:.1f} s")
        slack = 3.0 * cpl.TIMEOUT_SCALE  # sampling and a loaded machine
        assert extender_led <= TAKEOVER + slack
        # kube-scheduler's own takeover (client-go, jittered retries) is not ours to time; once it leads,
        # its extender answers at once
        assert recovered - scheduler_led <= slack
        assert not_ready_filters(standby) == 0  # its first filter came from a synced ledger
        check_nothing_lost(core, namespace, replicas)
        # an operator asks who leads now
        report = json.loads(cpl.run_console_script("tf-extender", "status", "-o", "json", "--kubeconfig",
                                                    replicas.cp.kubeconfig))
        held = {x["lease"]: x["holder"] for x in report["leaders"]}
        assert held[f"{namespace}/{LEADER_LEASE}"] == standby.extender_identity()
    finally:
        binds.stop()


def test_a_rolling_update_with_max_unavailable_zero(api_client, replicas, namespace):
    core = client.CoreV1Api(api_client)
    old_leader, old_standby = start_two(replicas)
    # maxSurge 1, maxUnavailable 0: the first new pod is up (a third standby) before an old one stops, and
    # the old ones stop one at a time; the leader goes first (the worst order)
    new_first = replicas.start()
    binds = Binds(core, namespace)
    try:
        join = burst(api_client, replicas, namespace)
        binds.wait(PODS // 4, 180)
        stopped = time.monotonic()
        old_leader.stop()
        cpl.wait_until(lambda: replicas.leading() is not None, 60, interval=0.2, what="a scheduler to lead")
        led_at = time.monotonic()
        gap_first = binds.first_bind_after(led_at) - stopped
        new_second = replicas.start()
        old_standby.stop()
        join()
        binds.wait(PODS, 300)
        print(f"rolling update: first bind {gap_first:.1f} s after the old leader stopped")
        new = [r for r in replicas.replicas if r.alive()]
        assert new == [new_first, new_second]
        # the old standby released the Leases on SIGTERM: a new replica takes them at its next round
        cpl.wait_until(lambda: sum(r.extender_leads() for r in new) == 1, 3 * LEASE_RENEW_SECONDS,
                       interval=0.2, what="one new extender to lead")
        # released on SIGTERM: no wait for a Lease to expire
        assert gap_first <= LEASE_RENEW_SECONDS + 5.0 * cpl.TIMEOUT_SCALE
        assert all(not_ready_filters(r) == 0 for r in new)
        check_nothing_lost(core, namespace, replicas)
    finally:
        binds.stop()


def test_the_leader_cut_off_from_the_api_server(api_client, replicas, namespace):
    core = client.CoreV1Api(api_client)
    leader, standby = start_two(replicas)
    binds = Binds(core, namespace)
    try:
        join = burst(api_client, replicas, namespace)
        binds.wait(PODS // 3, 180)
        leader.proxy.cut()
        cut = time.monotonic()
        # the old extender stops acting on its own, within its renew deadline
        cpl.wait_until(lambda: not leader.extender_leads(), 30, interval=0.2,
                       what="the cut-off extender to step down")
        stepped_down = time.monotonic() - cut
        led = when_both_lead(standby)
        led_at = led["scheduler"]
        extender_led = led["extender"] - cut
        # the cut-off kube-scheduler exits once it cannot renew (leader election lost)
        cpl.wait_until(lambda: not leader.scheduler.alive(), 60, interval=0.5,
                       what="the cut-off scheduler to exit")
        join()
        binds.wait(PODS, 300)
        recovered = binds.first_bind_after(led_at) - cut
        print(f"partition: old extender stepped down after {stepped_down:.1f} s, the standby's led after "
              f"{extender_led:.1f} s, first bind after {recovered:.1f} s")
        assert stepped_down <= LEASE_RENEW_DEADLINE_SECONDS + 2.0 * cpl.TIMEOUT_SCALE
        assert extender_led >= LEASE_DURATION_SECONDS - LEASE_RENEW_SECONDS  # never two leaders
        assert extender_led <= TAKEOVER + LEASE_RENEW_SECONDS + 3.0 * cpl.TIMEOUT_SCALE
        assert recovered - (led_at - cut) <= 3.0 * cpl.TIMEOUT_SCALE
        assert not_ready_filters(standby) == 0
        leader.proxy.heal()
        check_nothing_lost(core, namespace, replicas)
        time.sleep(LEASE_RENEW_SECONDS * 2)
        assert standby.extender_leads() and not leader.extender_leads()  # the healed one follows
    finally:
        binds.stop()

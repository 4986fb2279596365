"""Defragmentation on the real control plane: kube-controller-manager recreates the evicted pods and keeps
the PodDisruptionBudgets' status, the Eviction API enforces them, kube-scheduler and the extender place the
replacements, and ``tf-extender serve`` runs the defragmenter. Runs are started with the manual-trigger
annotation (the cron schedule is unit-tested with a fake clock).

The load already on the fuller nodes is placed by hand (``place_by_hand``): those pods never move, so a
controller behind them would add nothing. Where a workload has to start on a particular light node without
being pinned there, the other nodes are cordoned while its pod is placed, then uncordoned: that is the
history that leaves a real cluster fragmented.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from typing import Any

import pytest
from kubernetes import client

from tests import harness as cpl
from tests.harness import workloads as wl

pytestmark = pytest.mark.e2e

TF = "tensor-fusion.ai/"
MANUAL = TF + "manual-defrag"
NEVER = "0 0 1 1 *"  # the schedule: not during a test run


# ------------------------------------------------------------------------------------------ helpers


@pytest.fixture
def defrag_pool(api_client, webhook):
    """defrag_pool(**defrag settings) -> the name of a new GPUPool with defragmentation enabled."""
    custom = client.CustomObjectsApi(api_client)
    created: list[str] = []

    def factory(**settings: Any) -> str:
        name = f"defrag-{uuid.uuid4().hex[:8]}"
        defrag = {"enabled": True, "schedule": NEVER, "timezone": "UTC", **settings}
        cpl.create_cluster_object(api_client, "gpupools", {
            "apiVersion": f"{cpl.TF_GROUP}/{cpl.TF_VERSION}", "kind": "GPUPool", "metadata": {"name": name},
            "spec": {"nodeManagerConfig": {"nodeCompaction": {"defrag": defrag}}},
        })
        created.append(name)
        cpl.wait_for_webhook_pool(api_client, name)
        return name

    yield factory
    for name in created:
        custom.delete_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION, "gpupools", name)


def gpu_node(make_node, make_gpu, pool: str, name: str, labels: dict[str, str] | None = None,
             **node_kw: Any) -> str:
    node = make_node(f"{name}-{uuid.uuid4().hex[:6]}", labels=labels, **node_kw)
    for i in range(4):
        make_gpu(f"{node}-gpu-{i}", node, pool=pool, tflops="100", vram="40Gi", index=i)
    return node


def fill(api_client, namespace: str, pool: str, node: str, gpus: int, tflops: str = "10",
         vram: str = "4Gi") -> None:
    for i in range(gpus):
        cpl.place_by_hand(api_client, namespace, f"load-{node}-{i}", pool, node, [f"{node}-gpu-{i}"], tflops,
                          vram)


def cordon(api_client, nodes: list[str], flag: bool = True) -> None:
    core = client.CoreV1Api(api_client)
    for node in nodes:
        core.patch_node(node, {"spec": {"unschedulable": flag}})


def worker_pod(pool: str, vram: str = "4Gi", pin: str | None = None) -> dict:
    return cpl.gpu_pod_body("ignored", pool=pool, tflops="10", vram=vram,
                            node_selector={"kubernetes.io/hostname": pin} if pin else None)


def pods_on(api_client, node: str) -> list[Any]:
    pods = client.CoreV1Api(api_client).list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
    return [p for p in pods.items if p.metadata.deletion_timestamp is None]


def pool_events(api_client, pool: str) -> list[Any]:
    events = client.CoreV1Api(api_client).list_namespaced_event(
        "default", field_selector=f"involvedObject.kind=GPUPool,involvedObject.name={pool}").items
    return sorted(events, key=lambda e: (e.first_timestamp or e.event_time, e.metadata.name))


def run_now(api_client, pool: str, timeout: float = 180) -> list[Any]:
    """Start a run with the manual-trigger annotation; wait for its DefragFinished; the pool's events."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    client.CustomObjectsApi(api_client).patch_cluster_custom_object(
        cpl.TF_GROUP, cpl.TF_VERSION, "gpupools", pool, {"metadata": {"annotations": {MANUAL: stamp}}})
    cpl.wait_until(lambda: any(e.reason == "DefragFinished" for e in pool_events(api_client, pool)),
                   timeout, interval=0.5, what=f"DefragFinished on GPUPool {pool}")
    # events are posted by a few posters at once: one recorded before DefragFinished may land just after it
    time.sleep(1)
    return pool_events(api_client, pool)


def wait_older_than(api_client, namespace: str, seconds: float) -> None:
    """Until every pod in the namespace is older than ``seconds`` (maxDuration: younger ones never move)."""
    core = client.CoreV1Api(api_client)

    def old_enough() -> bool:
        now = dt.datetime.now(dt.UTC)
        return all((now - p.metadata.creation_timestamp).total_seconds() > seconds + 1
                   for p in core.list_namespaced_pod(namespace).items)

    cpl.wait_until(old_enough, seconds + 60, interval=1, what=f"pods older than {seconds}s")


class ReadySampler:
    """Samples, every 0.2 s, how many pods of a selector are Ready and which nodes they are bound to."""

    def __init__(self, api_client, namespace: str, selector: str) -> None:
        self.core = client.CoreV1Api(api_client)
        self.namespace, self.selector = namespace, selector
        self.min_ready: int | None = None
        self.nodes: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            pods = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector).items
            ready = 0
            for p in pods:
                if p.spec.node_name:
                    self.nodes.add(p.spec.node_name)
                conditions = {c.type: c.status for c in (p.status.conditions or [])}
                if p.metadata.deletion_timestamp is None and conditions.get("Ready") == "True":
                    ready += 1
            self.min_ready = ready if self.min_ready is None else min(self.min_ready, ready)
            self._stop.wait(0.2)

    def __enter__(self) -> ReadySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def place_on(api_client, namespace: str, node: str, others: list[str], create) -> None:
    """Run ``create()`` (a Deployment change adding one pod) while every node but ``node`` is cordoned."""
    cordon(api_client, others)
    try:
        create()
    finally:
        cordon(api_client, others, False)


# ------------------------------------------------------------------------------------------- tests


def test_manual_run_moves_light_nodes_onto_the_fullest_node_within_the_pdb(
        api_client, gpu_cluster, extender, defrag_pool, make_node, make_gpu, namespace):
    pool = defrag_pool(maxDuration="40s")
    heavy_a = gpu_node(make_node, make_gpu, pool, "heavy-a")
    heavy_b = gpu_node(make_node, make_gpu, pool, "heavy-b")
    light_a = gpu_node(make_node, make_gpu, pool, "light-a")
    light_b = gpu_node(make_node, make_gpu, pool, "light-b")
    fill(api_client, namespace, pool, heavy_a, 3)
    fill(api_client, namespace, pool, heavy_b, 4)
    everyone = [heavy_a, heavy_b, light_a, light_b]

    # "web": two replicas, one on each light node, covered by a PDB that allows one disruption at a time
    apps = client.AppsV1Api(api_client)

    def first() -> None:
        wl.create_deployment(api_client, namespace, wl.deployment_body("web", worker_pod(pool), replicas=1))
        wl.wait_running(api_client, namespace, "app=web", 1)

    def second() -> None:
        apps.patch_namespaced_deployment_scale("web", namespace, {"spec": {"replicas": 2}})
        wl.wait_running(api_client, namespace, "app=web", 2)

    place_on(api_client, namespace, light_a, [n for n in everyone if n != light_a], first)
    place_on(api_client, namespace, light_b, [n for n in everyone if n != light_b], second)
    before = {p.spec.node_name: p.metadata.name for p in wl.pods_of(api_client, namespace, "app=web")}
    assert set(before) == {light_a, light_b}
    wl.create_pdb(api_client, namespace, wl.pdb_body("web", {"app": "web"}, max_unavailable=1))
    wait_older_than(api_client, namespace, 40)

    with ReadySampler(api_client, namespace, "app=web") as sampler:
        events = run_now(api_client, pool)
        pods = wl.wait_running(api_client, namespace, "app=web", 2)

    reasons = sorted(e.reason for e in events)
    assert reasons == ["DefragFinished", "DefragPodEvicted", "DefragPodEvicted", "DefragStarted"], reasons
    evicted = [e.message for e in events if e.reason == "DefragPodEvicted"]
    assert sorted(evicted) == sorted(
        f"evicted pod {namespace}/{before[n]} from node {n} (planned onto {heavy_b})"
        for n in (light_a, light_b))
    finished = next(e.message for e in events if e.reason == "DefragFinished")
    assert "2 nodes emptied" in finished and "2 pods moved" in finished, finished
    assert "stopped" not in finished, finished
    # the light nodes are empty, every replica Running on the fullest node, and never below the PDB
    assert pods_on(api_client, light_a) == [] and pods_on(api_client, light_b) == []
    assert [p.spec.node_name for p in pods] == [heavy_b, heavy_b]
    assert sampler.min_ready is not None and sampler.min_ready >= 1, sampler.min_ready
    assert sampler.nodes <= {light_a, light_b, heavy_b}, sampler.nodes  # no replacement went elsewhere
    assert extender.metric("tf_extender_defrag_evictions_total", pool=pool) == 2
    assert extender.metric("tf_extender_defrag_nodes_emptied_total", pool=pool) == 2
    assert extender.metric("tf_extender_defrag_runs_total", pool=pool, trigger="manual",
                           outcome="completed") == 1


def test_nodes_that_cannot_be_emptied_safely_are_left_with_their_reason(
        api_client, gpu_cluster, extender, defrag_pool, make_node, make_gpu, namespace):
    pool = defrag_pool(maxDuration="20s")
    full = gpu_node(make_node, make_gpu, pool, "full")
    fill(api_client, namespace, pool, full, 4)  # room left for 4 GiB workers, not for a 40 GiB one
    no_pdb = gpu_node(make_node, make_gpu, pool, "no-pdb")
    keep = gpu_node(make_node, make_gpu, pool, "keep", labels={TF + "do-not-disrupt": "true"})
    native = gpu_node(make_node, make_gpu, pool, "native", extra_allocatable={"nvidia.com/gpu": "4"})
    cordoned = gpu_node(make_node, make_gpu, pool, "cordoned")
    no_room = gpu_node(make_node, make_gpu, pool, "no-room")
    everyone = [full, no_pdb, keep, native, cordoned, no_room]

    for name, node in (("loner", no_pdb), ("kept", keep), ("beside-cuda", native), ("fenced", cordoned)):
        wl.create_deployment(api_client, namespace, wl.deployment_body(name, worker_pod(pool, pin=node)))
        wl.wait_running(api_client, namespace, f"app={name}", 1)
        if name != "loner":
            wl.create_pdb(api_client, namespace, wl.pdb_body(name, {"app": name}))
    place_on(api_client, namespace, no_room, [n for n in everyone if n != no_room], lambda: (
        wl.create_deployment(api_client, namespace, wl.deployment_body("big", worker_pod(pool, vram="40Gi"))),
        wl.wait_running(api_client, namespace, "app=big", 1)))
    wl.create_pdb(api_client, namespace, wl.pdb_body("big", {"app": "big"}))
    # a pod using GPUs outside tensor-fusion, as the device plugin would run it (no scheduler involved)
    cuda = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cuda"},
            "spec": {"schedulerName": "e2e-manual", "terminationGracePeriodSeconds": 0, "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    cpl.create_pod(api_client, namespace, cuda)
    cpl.bind_pod(api_client, namespace, "cuda", native)
    cordon(api_client, [cordoned])
    before = {n: sorted(p.metadata.name for p in pods_on(api_client, n)) for n in everyone}
    wait_older_than(api_client, namespace, 20)

    events = run_now(api_client, pool)

    by_reason: dict[str, list[str]] = {}
    for e in events:
        by_reason.setdefault(e.reason, []).append(e.message)
    loner = next(p.metadata.name for p in wl.pods_of(api_client, namespace, "app=loner"))
    assert by_reason["DefragSkipMissingPDB"] == [
        f"no PodDisruptionBudget covers pod {namespace}/{loner} on node {no_pdb}"]
    skipped = sorted(by_reason["DefragSkipNode"])
    expected = sorted([
        f"node {keep} is labelled {TF}do-not-disrupt=true (do-not-disrupt)",
        f"pod {namespace}/cuda on node {native} uses nvidia.com/gpu outside tensor-fusion (native-gpu-pod)",
        f"node {cordoned} is cordoned (cordoned)",
    ])
    assert [s for s in skipped if "no-room" not in s] == expected, skipped
    big = next(p.metadata.name for p in wl.pods_of(api_client, namespace, "app=big"))
    assert [s for s in skipped if "no-room" in s] == [
        f"pod {namespace}/{big} fits on no node of the pool that is at least as full (no-room)"]
    assert "DefragPodEvicted" not in by_reason
    assert "0 nodes emptied" in by_reason["DefragFinished"][0]
    # nothing moved
    assert {n: sorted(p.metadata.name for p in pods_on(api_client, n)) for n in everyone} == before
    for reason in ("missing-pdb", "do-not-disrupt", "native-gpu-pod", "cordoned", "no-room"):
        assert extender.metric("tf_extender_defrag_skips_total", pool=pool, reason=reason) == 1, reason


def test_a_run_stops_at_max_duration(api_client, gpu_cluster, extender, defrag_pool, make_node, make_gpu,
                                     namespace):
    pool = defrag_pool(maxDuration="15s")
    full = gpu_node(make_node, make_gpu, pool, "full")
    fill(api_client, namespace, pool, full, 3)
    light = gpu_node(make_node, make_gpu, pool, "light")
    place_on(api_client, namespace, light, [full], lambda: (
        wl.create_deployment(api_client, namespace, wl.deployment_body("stuck", worker_pod(pool))),
        wl.wait_running(api_client, namespace, "app=stuck", 1)))
    # a PDB that allows no disruption: every eviction is refused, and the run keeps asking until maxDuration
    wl.create_pdb(api_client, namespace, wl.pdb_body("stuck", {"app": "stuck"}, max_unavailable=0))
    (pod,) = wl.pods_of(api_client, namespace, "app=stuck")
    wait_older_than(api_client, namespace, 15)

    events = run_now(api_client, pool)

    started = next(e for e in events if e.reason == "DefragStarted")
    finished = next(e for e in events if e.reason == "DefragFinished")
    assert "stopped early: maxDuration 0:00:15 reached" in finished.message, finished.message
    assert "0 pods moved" in finished.message
    took = (finished.first_timestamp - started.first_timestamp).total_seconds()
    assert 14 <= took <= 20, took  # second-resolution timestamps; it stopped at the bound, not later
    (still,) = wl.pods_of(api_client, namespace, "app=stuck")
    assert (still.metadata.name, still.spec.node_name) == (pod.metadata.name, light)
    assert extender.metric("tf_extender_defrag_runs_total", pool=pool, trigger="manual",
                           outcome="stopped") == 1

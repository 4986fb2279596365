"""GPU reservation pods: which GPUs get one, what one looks like, and how the set is kept exact."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from extender.common.labels import NVIDIA_GPU, RESERVATION_LABEL, RESERVED_GPU, SAFE_TO_EVICT
from extender.controllers.expansion.placeholder_pods import reservation_body, reservation_name
from extender.controllers.expansion.reservations import plan, wanted
from extender.kube.informer import WatchCache
from extender.kube.resources import NODES, PODS

NS = "tensor-fusion-sys"


def node(name: str, gpus: str | None = "4") -> dict[str, Any]:
    allocatable = {"cpu": "8"} | ({NVIDIA_GPU: gpus} if gpus is not None else {})
    return {"metadata": {"name": name, "uid": f"uid-{name}"}, "status": {"allocatable": allocatable}}


def node_cache(*items: dict[str, Any]) -> WatchCache:
    """The extender's Node cache, filled by hand (never run: no API server in a unit test)."""
    cache = WatchCache(None, NODES)  # type: ignore[arg-type]
    for item in items:
        cache.handle("ADDED", item)
    return cache


def reservation_cache() -> WatchCache:
    """The keeper's cache of its pods (never run)."""
    from extender.controllers.expansion.reservations import RESERVATION_SELECTOR

    return WatchCache(None, PODS, namespace=NS, label_selector=RESERVATION_SELECTOR,  # type: ignore[arg-type]
                      name="gpu-reservations")


def existing(gpu: str, node_name: str, phase: str = "Running", deleting: bool = False) -> dict[str, Any]:
    body = reservation_body(gpu, node(node_name), namespace=NS, image="pause", priority_class="pc")
    body["metadata"]["uid"] = f"uid-{body['metadata']['name']}"
    body["status"] = {"phase": phase}
    if deleting:
        body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return body


def test_a_reservation_pod_is_bound_to_its_node_and_holds_one_gpu() -> None:
    body = reservation_body("node-a-gpu-0", node("node-a"), namespace=NS, image="pause",
                            priority_class="tensor-fusion-gpu-reservation")
    meta, spec = body["metadata"], body["spec"]
    assert meta["namespace"] == NS and meta["labels"][RESERVATION_LABEL] == "true"
    assert meta["annotations"] == {RESERVED_GPU: "node-a-gpu-0", SAFE_TO_EVICT: "false"}
    assert meta["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": "node-a",
                                        "uid": "uid-node-a", "controller": False,
                                        "blockOwnerDeletion": False}]
    assert spec["nodeName"] == "node-a"  # bound directly: no scheduler, never in a bind's way
    assert spec["containers"][0]["resources"] == {"requests": {NVIDIA_GPU: "1"}, "limits": {NVIDIA_GPU: "1"}}
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["priorityClassName"] == "tensor-fusion-gpu-reservation"


@given(st.text(min_size=1, max_size=300))
def test_reservation_names_are_stable_valid_and_distinct_per_gpu(gpu: str) -> None:
    name = reservation_name(gpu)
    assert name == reservation_name(gpu)
    assert len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)
    assert name != reservation_name(gpu + "x")


def test_only_held_gpus_on_nodes_advertising_nvidia_gpu_are_reserved() -> None:
    nodes = {"a": node("a"), "b": node("b", gpus=None), "c": node("c", gpus="1")}
    held = {"a-g0": "a", "a-g1": "a", "b-g0": "b", "c-g1": "c", "c-g0": "c", "x-g0": "x"}
    assert wanted(held, nodes.get) == {"a-g0": "a", "a-g1": "a", "c-g0": "c"}


def test_the_plan_creates_missing_deletes_stale_and_replaces_refused_pods() -> None:
    want = {"a-g0": "a", "a-g1": "a", "b-g0": "b", "moved": "b"}
    pods = [existing("a-g0", "a"), existing("gone", "a"), existing("moved", "a"),
            existing("b-g0", "b", phase="Failed"), existing("a-g1", "a", deleting=True)]
    todo = plan(want, pods)
    assert todo.create == []  # a-g1 waits for its terminating pod; "moved" waits for its deletion
    whys = {name: why for name, _, why in todo.delete}
    assert whys == {reservation_name("gone"): "no pod holds a share of its GPU any more",
                    reservation_name("moved"): "its GPU is on node b now",
                    reservation_name("b-g0"): "the node refused it"}
    after = [existing("a-g0", "a")]
    assert todo.refused == ["b-g0"]
    assert plan(want, after).create == [("a-g1", "a"), ("b-g0", "b"), ("moved", "b")]
    assert plan(want, after, failed_recently=lambda gpu: gpu == "b-g0").create == [("a-g1", "a"),
                                                                                  ("moved", "b")]


def test_after_a_restart_the_same_ledger_gives_the_same_pods() -> None:
    want = {"a-g0": "a", "a-g1": "a"}
    pods = [existing(gpu, n) for gpu, n in want.items()]
    todo = plan(want, pods)
    assert todo.create == [] and todo.delete == []
    assert plan({}, pods).create == [] and len(plan({}, pods).delete) == 2


# --- the keeper against an in-memory cluster ----------------------------------------------------------


class Writer:
    """Stands in for the API server: created pods appear in the keeper's cache, deleted ones leave it."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.created: list[str] = []
        self.deleted: list[str] = []

    async def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        created = {**body, "metadata": {**body["metadata"], "uid": f"uid-{len(self.created)}"},
                   "status": {"phase": "Running"}}
        self.created.append(body["metadata"]["annotations"][RESERVED_GPU])
        self.cache.handle("ADDED", created)
        return created

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self.deleted.append(name)
        pod = self.cache.get(name, namespace)
        if pod is not None:
            self.cache.handle("DELETED", pod)


async def test_the_keeper_follows_the_ledger_and_backs_off_from_refused_pods() -> None:
    from extender.controllers.expansion.provisioner import AutoscalerConfig
    from extender.controllers.expansion.reservations import RETRY_FAILED_SECONDS, ReservationKeeper
    from extender.scheduling.state import ClusterState, Kind
    from tests.unit.fixtures.fakes import gpu, pod

    now = [0.0]
    state = ClusterState()
    nodes = node_cache(node("a"))
    state.apply(Kind.GPU, "ADDED", gpu("a-g0", "a"))
    keeper = ReservationKeeper(AutoscalerConfig(namespace=NS), None, state, nodes,  # type: ignore[arg-type]
                               reservation_cache(), clock=lambda: now[0])
    writer = Writer(keeper.cache)
    keeper.writer = writer  # type: ignore[assignment]
    await keeper.reconcile()
    assert writer.created == []  # nobody holds a share yet

    state.apply(Kind.POD, "ADDED", pod("p", "u1", node="a", gpu_ids="a-g0", phase="Running"))
    await keeper.reconcile()
    await keeper.reconcile()
    assert writer.created == ["a-g0"]  # once, then it exists
    assert keeper.gauge._value.get() == 1

    (held,) = keeper.cache.list()
    keeper.cache.handle("MODIFIED", {**held, "status": {"phase": "Failed"}})  # the kubelet refused it
    await keeper.reconcile()
    assert writer.deleted == [held["metadata"]["name"]] and writer.created == ["a-g0"]
    now[0] += RETRY_FAILED_SECONDS + 1
    await keeper.reconcile()
    assert writer.created == ["a-g0", "a-g0"]

    state.apply(Kind.POD, "DELETED", pod("p", "u1", node="a", gpu_ids="a-g0", phase="Running"))
    await keeper.reconcile()
    assert keeper.cache.list() == [] and keeper.gauge._value.get() == 0


async def test_a_node_whose_gpus_are_advertised_after_its_pods_bound_is_reserved_at_once() -> None:
    """A new node's allocatable nvidia.com/gpu often lands after the first pod is bound there; the keeper
    reconciles on that change instead of at its 30 s resync (by then the Cluster Autoscaler had found the
    node idle and drained it). The clock stands still, so only the node event can bring the pod."""
    import asyncio

    from extender.controllers.expansion.provisioner import AutoscalerConfig
    from extender.controllers.expansion.reservations import ReservationKeeper
    from extender.controllers.runner import Runner
    from extender.scheduling.state import ClusterState, Kind
    from tests.unit.fixtures.fakes import eventually, gpu, pod

    state = ClusterState()
    nodes = node_cache(node("a", gpus=None))
    nodes.synced.set()
    state.apply(Kind.GPU, "ADDED", gpu("a-g0", "a"))

    keeper = ReservationKeeper(AutoscalerConfig(namespace=NS), None, state, nodes,  # type: ignore[arg-type]
                               reservation_cache(), caches=[nodes], clock=lambda: 0.0)
    writer = Writer(keeper.cache)
    keeper.writer = writer  # type: ignore[assignment]
    keeper.cache.synced.set()  # its watch, as the service runs it, has listed
    task = asyncio.create_task(Runner().run(keeper.controller))
    try:
        state.apply(Kind.POD, "ADDED", pod("p", "u1", node="a", gpu_ids="a-g0", phase="Running"))
        await asyncio.sleep(1.2)  # two polls: the ledger changed, but the node advertises no GPU yet
        assert writer.created == []
        nodes.handle("MODIFIED", node("a"))  # its allocatable arrives
        await eventually(lambda: writer.created)
        assert writer.created == ["a-g0"]
        keeper.controller.wake.event.clear()  # no await in between: nothing else can set it
        relabelled = {**node("a"), "metadata": {"name": "a", "uid": "uid-a", "labels": {"x": "1"}}}
        nodes.handle("MODIFIED", relabelled)
        assert not keeper.controller.wake.event.is_set()  # a change that keeps the count wakes nothing
        nodes.handle("DELETED", node("a"))
        assert keeper._advertised == {}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

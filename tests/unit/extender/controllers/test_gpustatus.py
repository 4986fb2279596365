"""--write-gpu-status: what the GPU and GPUPool status say, and how often they are written."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from extender.controllers.gpustatus import (
    WORK_PER_SLICE,
    GPUStatusWriter,
    StatusSettings,
    pool_health,
    stored_part,
)
from extender.scheduling.state import ClusterState, Kind
from tests.unit.fixtures.fakes import POOL, gpu, pod


class Store:
    """The watch caches of GPUs, pools and pods; ``patch_status`` stores like the API server does."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []
        self.rv = 0
        self.fail = False

    def view(self, plural: str) -> _View:
        return _View(self, plural)

    def put(self, plural: str, obj: dict[str, Any]) -> None:
        self.objects[(plural, obj["metadata"]["name"])] = copy.deepcopy(obj)

    async def patch_status(self, plural: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.writes.append((plural, name))
        if self.fail:
            raise RuntimeError("API server unavailable")
        obj = self.objects[(plural, name)]
        merged = obj.setdefault("status", {})
        for key, value in status.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key].update(value)
            else:
                merged[key] = value
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(obj)


class _View:
    def __init__(self, store: Store, plural: str) -> None:
        self.store, self.plural = store, plural

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        key = f"{namespace}/{name}" if namespace else name
        return self.store.objects.get((self.plural, key))

    def list(self) -> list[dict[str, Any]]:
        return [o for (p, _), o in self.store.objects.items() if p == self.plural]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _setup(**settings: Any) -> tuple[ClusterState, Store, GPUStatusWriter, Clock]:
    state = ClusterState()
    store = Store()
    for g in (gpu("g0", "n1"), gpu("g1", "n1", vram="80Gi"), gpu("g2", "n2")):
        g["status"]["available"] = {"compute": "100"}  # someone else's key: left alone
        g["metadata"]["resourceVersion"] = "1"
        state.apply(Kind.GPU, "ADDED", g)
        store.put("gpus", g)
    pool = {"metadata": {"name": POOL, "resourceVersion": "1"}, "spec": {}}
    state.apply(Kind.POOL, "ADDED", pool)
    store.put("gpupools", pool)
    clock = Clock()
    writer = GPUStatusWriter(state, store, gpus=store.view("gpus"), pools=store.view("gpupools"),
                             pods=store.view("pods"), settings=StatusSettings(**settings), clock=clock)
    return state, store, writer, clock


def _bind(state: ClusterState, store: Store, name: str, gpu_ids: str, node: str = "n1",
          tflops: str = "30", workload: str | None = None, vram: str = "4Gi") -> dict[str, Any]:
    p = pod(name, f"uid-{name}", tflops=tflops, node=node, gpu_ids=gpu_ids, phase="Running")
    p["metadata"]["annotations"]["tensor-fusion.ai/vram-request"] = vram
    if workload:
        p["metadata"]["labels"]["tensor-fusion.ai/workload"] = workload
    state.apply(Kind.POD, "ADDED", p)
    store.put("pods", {**p, "metadata": {**p["metadata"], "name": f"ml/{name}"}})
    return p


def test_first_pass_writes_every_gpu_and_the_pool_then_nothing_until_a_change():
    state, store, writer, clock = _setup()
    _bind(state, store, "a", "g0", workload="train")
    _bind(state, store, "b", "g0", tflops="10", workload="train")
    asyncio.run(writer.step())
    assert sorted(store.writes) == [("gpupools", POOL), ("gpus", "g0"), ("gpus", "g1"), ("gpus", "g2")]
    g0 = store.objects[("gpus", "g0")]["status"]
    assert g0["available"] == {"compute": "100", "tflops": "60", "vram": "32Gi"}
    assert g0["runningApps"] == [{
        "name": "train", "namespace": "ml", "count": 2,
        "pods": [
            {"name": "a", "namespace": "ml", "qos": "high",
             "requests": {"tflops": "30", "vram": "4Gi"}, "limits": {"tflops": "30", "vram": "4Gi"}},
            {"name": "b", "namespace": "ml", "qos": "high",
             "requests": {"tflops": "10", "vram": "4Gi"}, "limits": {"tflops": "10", "vram": "4Gi"}},
        ]}]
    assert store.objects[("gpus", "g1")]["status"]["available"]["vram"] == "80Gi"
    assert store.objects[("gpus", "g2")]["status"]["runningApps"] == []
    pool = dict(store.objects[("gpupools", POOL)]["status"])
    conditions = pool.pop("conditions")
    assert pool == {"totalNodes": 2, "totalGPUs": 3, "totalTFlops": "300", "totalVRAM": "160Gi",
                    "allocatedTFlops": "40", "allocatedVRAM": "8Gi", "availableTFlops": "260",
                    "availableVRAM": "152Gi", "partiallyUsedGPUs": 1,
                    "phase": "Running", "readyNodes": 2, "notReadyNodes": 0}  # no Node cache: all Ready
    assert [(c["type"], c["status"], c["reason"]) for c in conditions] == [("Ready", "True", "NodesReady")]
    store.writes.clear()
    clock.now += 100  # a pass with nothing changed writes nothing
    asyncio.run(writer.step())
    assert store.writes == []


def test_a_burst_of_binds_costs_one_write_per_touched_gpu_per_pass():
    state, store, writer, clock = _setup(pool_interval=5.0)
    asyncio.run(writer.step())
    store.writes.clear()
    for i in range(1000):  # small enough that all 1,000 fit: the ledger counts no pod over capacity
        _bind(state, store, f"p{i}", "g1", tflops="0.05", vram="64Mi")
    clock.now += 1
    asyncio.run(writer.step())
    assert store.writes == [("gpus", "g1")]  # the pool waits for its own interval
    apps = store.objects[("gpus", "g1")]["status"]["runningApps"]
    assert sum(app["count"] for app in apps) == 1000
    assert store.objects[("gpus", "g1")]["status"]["available"]["tflops"] == "50"
    clock.now += 5
    store.writes.clear()
    asyncio.run(writer.step())
    assert store.writes == [("gpupools", POOL)]
    assert store.objects[("gpupools", POOL)]["status"]["allocatedTFlops"] == "50"


def test_freed_shares_come_back_and_a_gone_pod_leaves_running_apps():
    state, store, writer, clock = _setup()
    p = _bind(state, store, "a", "g2", node="n2", tflops="100")
    asyncio.run(writer.step())
    assert store.objects[("gpus", "g2")]["status"]["available"]["tflops"] == "0"
    state.apply(Kind.POD, "DELETED", p)
    clock.now += 10
    asyncio.run(writer.step())
    status = store.objects[("gpus", "g2")]["status"]
    assert status["available"]["tflops"] == "100"
    assert status["runningApps"] == []


def test_a_failed_write_is_retried_next_pass_and_counted():
    _state, store, writer, clock = _setup()
    store.fail = True
    asyncio.run(writer.step())
    assert writer.metrics.writes.labels("gpu", "error")._value.get() == 3
    store.fail = False
    store.writes.clear()
    clock.now += 5
    asyncio.run(writer.step())  # nothing changed in the ledger: the failed objects alone are retried
    assert sorted(store.writes) == [("gpupools", POOL), ("gpus", "g0"), ("gpus", "g1"), ("gpus", "g2")]
    assert stored_part(store.objects[("gpus", "g0")], ["available"])["available"]["tflops"] == "100"
    assert writer.metrics.writes.labels("gpu", "ok")._value.get() == 3


def test_status_overwritten_by_someone_else_is_repaired_when_its_watch_event_arrives():
    state, store, writer, clock = _setup()
    asyncio.run(writer.step())
    store.objects[("gpus", "g0")]["status"]["available"]["tflops"] = "1"
    store.objects[("gpus", "g0")]["metadata"]["resourceVersion"] = "999"
    store.writes.clear()
    clock.now += 100
    asyncio.run(writer.step())
    assert store.writes == []  # nothing in the change log yet
    state.apply(Kind.GPU, "MODIFIED", store.objects[("gpus", "g0")])  # what the GPU watch delivers
    asyncio.run(writer.step())
    assert store.writes == [("gpus", "g0")]
    assert store.objects[("gpus", "g0")]["status"]["available"]["tflops"] == "100"


def test_a_pool_created_later_gets_its_totals_without_any_gpu_change():
    state, store, writer, clock = _setup()
    asyncio.run(writer.step())
    late = {"metadata": {"name": "late", "resourceVersion": "1"}, "spec": {}}
    store.put("gpupools", late)
    g = gpu("x0", "n9")
    g["metadata"]["labels"]["tensor-fusion.ai/gpupool"] = "late"
    state.apply(Kind.GPU, "ADDED", g)
    store.put("gpus", g)
    clock.now += 5
    asyncio.run(writer.step())
    assert store.objects[("gpupools", "late")]["status"]["totalGPUs"] == 1
    store.put("gpupools", {"metadata": {"name": "empty", "resourceVersion": "1"}, "spec": {}})
    clock.now += 5
    asyncio.run(writer.step())
    assert store.objects[("gpupools", "empty")]["status"]["totalTFlops"] == "0"


def test_a_node_that_leaves_drops_out_of_the_pool_totals():
    state, store, writer, clock = _setup()
    asyncio.run(writer.step())
    assert store.objects[("gpupools", POOL)]["status"]["totalNodes"] == 2
    state.apply(Kind.GPU, "DELETED", store.objects[("gpus", "g2")])
    clock.now += 5
    asyncio.run(writer.step())
    assert store.objects[("gpupools", POOL)]["status"]["totalNodes"] == 1
    assert store.objects[("gpupools", POOL)]["status"]["totalGPUs"] == 2


def test_cache_lagging_behind_our_own_write_does_not_cause_a_second_write():
    state, store, writer, clock = _setup()
    asyncio.run(writer.step())
    # the watch has not delivered our write yet: the cache still shows the old status
    store.objects[("gpus", "g0")]["status"]["available"] = {"compute": "100"}
    store.objects[("gpus", "g0")]["status"].pop("runningApps")
    store.objects[("gpus", "g0")]["metadata"]["resourceVersion"] = "0"
    store.writes.clear()
    clock.now += 1
    state.apply(Kind.GPU, "MODIFIED", store.objects[("gpus", "g0")])  # marks n1 changed
    asyncio.run(writer.step())
    assert ("gpus", "g0") not in store.writes


def test_gpus_without_objects_are_skipped():
    state = ClusterState()
    store = Store()
    state.apply(Kind.NODE, "ADDED", {"metadata": {"name": "gfd", "labels": {
        "nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}})
    writer = GPUStatusWriter(state, store, gpus=store.view("gpus"), pools=store.view("gpupools"),
                             pods=store.view("pods"))
    assert state.nodes() == ["gfd"]
    assert asyncio.run(writer.step()) == 0


@pytest.mark.parametrize("tick_from_start", [True, False])
def test_changed_since_reports_touched_nodes(tick_from_start: bool):
    state, store, _writer, _clock = _setup()
    changed, tick = state.changed_since(0)
    assert changed == {"n1", "n2"}
    if tick_from_start:
        _bind(state, store, "a", "g2", node="n2")
        assert state.changed_since(tick)[0] == {"n2"}
    else:
        assert state.changed_since(tick) == (set(), tick)


def test_the_writer_runs_only_with_write_gpu_status():
    from kubernetes import client

    from extender import cli
    from extender.service import ExtenderService, Settings

    args = cli.build_parser().parse_args(["serve", "--write-gpu-status", "--gpu-status-interval", "0.5"])
    assert (args.write_gpu_status, args.gpu_status_interval) == (True, 0.5)
    assert cli.build_parser().parse_args(["serve"]).write_gpu_status is False
    api = client.ApiClient()
    try:
        assert "gpustatus" not in ExtenderService(api, Settings()).parts
        service = ExtenderService(api, Settings(controllers={"gpustatus": StatusSettings(interval=0.5)}))
        assert service.parts["gpustatus"].settings.interval == 0.5
    finally:
        api.close()


def test_a_pass_over_many_nodes_lets_other_work_run_in_between():
    state, store, writer, _clock = _setup()
    for n in range(2 * WORK_PER_SLICE):
        g = gpu(f"many-{n}", f"many-node-{n}")
        state.apply(Kind.GPU, "ADDED", g)
        store.put("gpus", g)
    ticks = 0

    async def main() -> None:
        nonlocal ticks
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        before = ticks
        await writer.step()
        done.set()
        await task
        ticks -= before

    asyncio.run(main())
    assert ticks >= 2  # at least once per slice of work


def _node(name: str, ready: str | None) -> dict[str, Any]:
    conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    return {"metadata": {"name": name}, "status": {"conditions": conditions}}


@pytest.mark.parametrize(("pool", "ready", "phase", "status", "reason", "message"), [
    ({}, {"n1": True, "n2": True}, "Running", "True", "NodesReady", "all 2 nodes Ready"),
    ({}, {"n1": True, "n2": False}, "Updating", "False", "NodesNotReady", "1 of 2 nodes not Ready: n2"),
    ({}, {f"n{i}": False for i in range(8)}, "Updating", "False", "NodesNotReady",
     "8 of 8 nodes not Ready: n0, n1, n2, n3, n4 and 3 more"),
    ({}, {}, "Running", "True", "NodesReady", "no nodes, none asked for (minResources 0)"),
    ({"spec": {"capacityConfig": {"minResources": {"tflops": "0", "vram": "0"}}}}, {}, "Running", "True",
     "NodesReady", "no nodes"),
    ({"spec": {"capacityConfig": {"minResources": {"tflops": "100"}}}}, {}, "Updating", "False", "NoNodes",
     "minResources asks for capacity"),
    ({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}, {"n1": True}, "Destroying", "False",
     "Deleting", "being deleted"),
])
def test_pool_phase_is_tensorfusions_and_the_ready_condition_names_the_cause(
    pool: dict[str, Any], ready: dict[str, bool], phase: str, status: str, reason: str, message: str
) -> None:
    health = pool_health(pool, ready)
    assert health["phase"] == phase
    assert health["readyNodes"] + health["notReadyNodes"] == len(ready)
    condition = health["condition"]
    assert (condition["type"], condition["status"], condition["reason"]) == ("Ready", status, reason)
    assert message in condition["message"]


def test_a_node_going_not_ready_moves_the_pool_to_updating_and_back_keeping_other_conditions():
    _state, store, writer, clock = _setup()
    nodes = {"n1": _node("n1", "True"), "n2": _node("n2", "True")}
    writer.nodes = type("Nodes", (), {"get": lambda self, name, namespace=None: nodes.get(name),
                                      "list": lambda self: list(nodes.values())})()
    capacity = {"type": "NodeProvisionerReady", "status": "True", "reason": "Ready", "message": "ok",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}
    store.objects[("gpupools", POOL)]["status"] = {"conditions": [capacity]}
    asyncio.run(writer.step())
    status = store.objects[("gpupools", POOL)]["status"]
    assert status["phase"] == "Running" and status["conditions"][0] == capacity
    since = status["conditions"][1]["lastTransitionTime"]

    nodes["n2"] = _node("n2", "Unknown")
    clock.now += 10
    asyncio.run(writer.step())
    status = store.objects[("gpupools", POOL)]["status"]
    assert (status["phase"], status["readyNodes"], status["notReadyNodes"]) == ("Updating", 1, 1)
    ready = status["conditions"][1]
    assert ready["reason"] == "NodesNotReady" and ready["message"] == "1 of 2 nodes not Ready: n2"
    assert status["conditions"][0] == capacity

    store.writes.clear()
    clock.now += 10
    asyncio.run(writer.step())
    assert store.writes == []  # nothing changed: nothing written, the transition time stays

    nodes["n2"] = _node("n2", "True")
    clock.now += 10
    asyncio.run(writer.step())
    status = store.objects[("gpupools", POOL)]["status"]
    assert status["phase"] == "Running" and status["conditions"][1]["status"] == "True"
    assert status["conditions"][1]["lastTransitionTime"] >= since

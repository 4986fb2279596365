"""GPUNode objects from the ledger: what they say, when they are written (one write per node per pass,
however many binds), who owns them, and compaction reading their phase and age."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
from typing import Any

from extender.controllers.gpunode.config import GPUNodeConfig
from extender.controllers.gpunode.writer import GPUNodeWriter
from extender.planning.inputs import Inputs, claim_pool
from extender.scheduling.state import ClusterState, Kind
from tests.unit.fixtures.fakes import POOL, gpu, pod


class Api:
    """GPUNodes as the API server stores them (status only through the status subresource)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.rv = 0
        self.fail = False
        self.synced = asyncio.Event()
        self._listeners: list[Any] = []

    # the cache's face
    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self.objects.get(name)

    def list(self) -> list[dict[str, Any]]:
        return list(self.objects.values())

    def subscribe(self, listener: Any) -> None:
        self._listeners.append(listener)

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(obj)

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", body["metadata"]["name"]))
        if self.fail:
            raise RuntimeError("API server unavailable")
        obj = copy.deepcopy(body)
        obj.pop("status", None)
        obj["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
        self.objects[body["metadata"]["name"]] = obj
        return self._bump(obj)

    async def patch(self, name: str, body: dict[str, Any], status: bool = False) -> dict[str, Any]:
        self.calls.append(("status" if status else "labels", name))
        if self.fail:
            raise RuntimeError("API server unavailable")
        obj = self.objects[name]
        if status:
            obj["status"] = {**(obj.get("status") or {}), **body["status"]}
        else:
            labels = obj["metadata"].setdefault("labels", {})
            for k, v in body["metadata"]["labels"].items():
                if v is None:
                    labels.pop(k, None)
                else:
                    labels[k] = v
        return self._bump(obj)

    async def delete(self, name: str) -> None:
        self.calls.append(("delete", name))
        del self.objects[name]


class Nodes:
    def __init__(self, *names: str) -> None:
        self.objects = {n: {"metadata": {"name": n, "uid": f"uid-{n}"}} for n in names}

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self.objects.get(name)

    def list(self) -> list[dict[str, Any]]:
        return list(self.objects.values())


def _setup() -> tuple[ClusterState, Api, Nodes, GPUNodeWriter]:
    state = ClusterState()
    for g in (gpu("g0", "n1"), gpu("g1", "n1", vram="80Gi"), gpu("g2", "n2")):
        state.apply(Kind.GPU, "ADDED", g)
    for n in ("n1", "n2"):
        state.apply(Kind.NODE, "ADDED", {"metadata": {"name": n, "uid": f"uid-{n}"}})
    api, nodes = Api(), Nodes("n1", "n2")
    writer = GPUNodeWriter(GPUNodeConfig(), state, api, nodes=nodes, gpunodes=api)  # type: ignore[arg-type]
    return state, api, nodes, writer


def _bind(state: ClusterState, name: str, gpu_ids: str, node: str = "n1", tflops: str = "30") -> None:
    state.apply(
        Kind.POD,
        "ADDED",
        pod(name, f"uid-{name}", tflops=tflops, node=node, gpu_ids=gpu_ids, phase="Running"),
    )


def test_one_gpunode_per_gpu_node_with_totals_availability_labels_and_the_node_as_owner() -> None:
    state, api, _, writer = _setup()
    _bind(state, "a", "g0")
    asyncio.run(writer.step())
    n1 = api.objects["n1"]
    assert n1["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "tensor-fusion-extender",
        "tensor-fusion.ai/managed-by": POOL,
        f"tensor-fusion.ai/pool-{POOL}": "true",
    }
    assert n1["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-n1"}
    ]
    assert n1["status"] == {
        "phase": "Running",
        "totalTFlops": "200",
        "totalVRAM": "120Gi",
        "availableTFlops": "170",
        "availableVRAM": "116Gi",
        "virtualTFlops": "200",
        "virtualVRAM": "120Gi",
        "totalGPUs": 2,
        "managedGPUs": 2,
        "managedGPUDeviceIDs": ["g0", "g1"],
        "totalGPUPods": 1,
    }
    assert api.objects["n2"]["status"]["availableTFlops"] == "100"


def test_a_burst_of_binds_costs_one_status_write_per_node_per_pass_and_a_quiet_pass_none() -> None:
    state, api, _, writer = _setup()
    asyncio.run(writer.step())
    api.calls.clear()
    for i in range(20):
        _bind(state, f"p{i}", "g1", tflops="1")
    asyncio.run(writer.step())
    assert api.calls == [("status", "n1")]
    assert api.objects["n1"]["status"]["availableTFlops"] == "180"
    api.calls.clear()
    asyncio.run(writer.step())
    assert api.calls == []


def test_a_failed_write_is_retried_on_the_next_pass() -> None:
    _, api, _, writer = _setup()
    api.fail = True
    asyncio.run(writer.step())
    assert "n1" not in api.objects
    api.fail = False
    asyncio.run(writer.step())
    assert api.objects["n1"]["status"]["phase"] == "Running"


def test_a_node_that_goes_takes_its_gpunode_and_someone_elses_gpunode_is_never_touched() -> None:
    state, api, nodes, writer = _setup()
    api.objects["n2"] = {
        "metadata": {"name": "n2", "labels": {"tensor-fusion.ai/managed-by": POOL}},
        "status": {"phase": "Running", "totalTFlops": "1"},
    }  # TensorFusion's own
    asyncio.run(writer.step())
    assert api.objects["n2"]["status"] == {"phase": "Running", "totalTFlops": "1"}
    del nodes.objects["n1"]
    state.apply(Kind.NODE, "DELETED", {"metadata": {"name": "n1"}})
    for g in ("g0", "g1"):
        state.apply(Kind.GPU, "DELETED", gpu(g, "n1"))
    asyncio.run(writer.step())
    assert "n1" not in api.objects and "n2" in api.objects


def test_pool_labels_follow_the_gpus_and_other_labels_stay() -> None:
    state, api, _, writer = _setup()
    asyncio.run(writer.step())
    api.objects["n1"]["metadata"]["labels"]["team"] = "ml"
    for g in ("g0", "g1"):
        moved = gpu(g, "n1")
        moved["metadata"]["labels"]["tensor-fusion.ai/gpupool"] = "other"
        state.apply(Kind.GPU, "MODIFIED", moved)
    asyncio.run(writer.step())
    assert api.objects["n1"]["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "tensor-fusion-extender",
        "team": "ml",
        "tensor-fusion.ai/managed-by": "other",
        "tensor-fusion.ai/pool-other": "true",
    }


def test_compaction_waits_for_a_running_gpunode_and_counts_the_nodes_age() -> None:
    state = ClusterState()
    state.apply(Kind.GPU, "ADDED", gpu("g0", "n1"))
    node = {"metadata": {"name": "n1", "creationTimestamp": "2026-01-01T00:00:00Z"}}
    now = dt.datetime(2026, 1, 1, 1, tzinfo=dt.UTC)

    def origin(gpunodes: dict[str, Any]) -> dt.datetime | None:
        inputs = Inputs(now=now, state=state, nodes={"n1": node}, gpunodes=gpunodes)
        (pool_node,) = inputs.pool_nodes(POOL)
        return pool_node.created

    born = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert origin({}) == born  # no GPUNodes kept: the Node's age
    gpunode = {
        "metadata": {"name": "n1", "creationTimestamp": "2026-01-01T00:00:03Z"},
        "status": {"phase": "Running"},
    }
    assert origin({"n1": gpunode}) == born
    assert origin({"n1": {**gpunode, "status": {"phase": "Pending"}}}) is None  # never old enough
    assert origin({"n1": {**gpunode, "status": {}}}) is None  # created, its status not yet written


def test_a_claim_belongs_to_the_pool_either_label_names() -> None:
    def claim(labels: dict[str, str]) -> dict[str, Any]:
        return {"metadata": {"name": "c", "labels": labels}}

    assert claim_pool(claim({"tensor-fusion.ai/managed-by": "kp"})) == "kp"  # TensorFusion's
    assert claim_pool(claim({"tensor-fusion.ai/gpupool": "kp"})) == "kp"  # ours, before
    assert claim_pool(claim({"tensor-fusion.ai/managed-by": "kp", "tensor-fusion.ai/gpupool": "kp"})) == "kp"
    assert claim_pool(claim({})) == ""


def test_a_gpunode_another_replica_created_first_is_no_error_and_written_next_pass() -> None:
    from kubernetes.client import ApiException

    _, api, _, writer = _setup()
    real_create = api.create

    async def conflict(body: dict[str, Any]) -> dict[str, Any]:
        await real_create(body)  # the other replica's create lands first
        raise ApiException(status=409)

    api.create = conflict  # type: ignore[method-assign]
    asyncio.run(writer.step())
    assert writer.metrics.writes.labels("create", "error")._value.get() == 0
    api.create = real_create  # type: ignore[method-assign]
    asyncio.run(writer.step())
    assert api.objects["n1"]["status"]["phase"] == "Running"

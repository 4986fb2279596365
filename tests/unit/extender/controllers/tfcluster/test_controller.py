"""A TensorFusionCluster's status: Running when its pools are in step, Updating while they change, the pools'
totals summed, and not ready when the vendor check fails."""

from __future__ import annotations

from extender.controllers.tfcluster import derive, vendor
from extender.controllers.tfcluster.controller import cluster_status
from tests.unit.fixtures.tfcluster import SHARED, cluster, derived


def test_status_running_when_in_step_updating_while_changing_and_totals_summed() -> None:
    c = cluster(("a", False, SHARED), ("b", False, SHARED))
    pools = [derived(c, "a", SHARED), derived(c, "b", SHARED)]
    pools[0]["status"] = {
        "totalNodes": 2,
        "totalGPUs": 4,
        "totalTFlops": "500",
        "totalVRAM": "96Gi",
        "availableTFlops": "300",
        "availableVRAM": "64Gi",
    }
    pools[1]["status"] = {
        "totalNodes": 1,
        "totalGPUs": 1,
        "totalTFlops": "125",
        "totalVRAM": "24Gi",
        "availableTFlops": "bad",
        "availableVRAM": "24Gi",
    }
    plan = derive.plan(c, pools)
    status = cluster_status(c, plan, pools, vendor.Connection(True, "CloudVendorConnectionOK", ""), "T1")
    assert status["phase"] == "Running"
    assert (status["totalPools"], status["totalNodes"], status["totalGPUs"]) == (2, 3, 5)
    assert (status["totalTFlops"], status["totalVRAM"]) == ("625", "120Gi")
    assert (status["availableTFlops"], status["availableVRAM"]) == ("300", "88Gi")  # a bad value counts 0
    assert status["readyGPUPools"] == ["tf-a", "tf-b"] and status["notReadyGPUPools"] == []
    kinds = {x["type"]: x["status"] for x in status["conditions"]}
    assert kinds == {"Ready": "True", "GPUPoolReady": "True", "CloudVendorConnectionReady": "True"}
    changing = cluster_status(c, derive.plan(c, pools[:1]), pools[:1], None, "T2")
    assert changing["phase"] == "Updating"
    assert {x["type"]: x["status"] for x in changing["conditions"]}["GPUPoolReady"] == "False"


def test_a_failed_vendor_check_makes_the_cluster_not_ready() -> None:
    c = cluster(("a", False, SHARED))
    plan = derive.plan(c, [derived(c, "a", SHARED)])
    bad = vendor.Connection(False, "NotYetSupported", "computingVendor.type aws: not yet")
    status = cluster_status(c, plan, [], bad, "T")
    conditions = {x["type"]: x for x in status["conditions"]}
    assert status["phase"] == "Updating"
    assert conditions["CloudVendorConnectionReady"]["status"] == "False"
    assert conditions["Ready"]["reason"] == "NotYetSupported"


def test_the_package_builds_one_leader_only_reconciler_woken_by_clusters_and_pools() -> None:
    import types
    from typing import Any

    from kubernetes import client

    from extender.controllers import tfcluster
    from extender.controllers.runner import Reconciler
    from extender.controllers.tfcluster.config import TFClusterConfig
    from extender.controllers.tfcluster.controller import TFClusterController
    from extender.kube.informer import Informers
    from extender.kube.resources import GPU_POOLS, TENSOR_FUSION_CLUSTERS

    informers = Informers(client.ApiClient(client.Configuration()))
    pools = informers.cache(GPU_POOLS, name="gpupools", optional=True)
    deps: Any = types.SimpleNamespace(api_client=None, informers=informers, recorder=None,
                                      core=types.SimpleNamespace(gpupools=pools))
    off = TFClusterConfig(enabled=False)
    assert tfcluster.NAME == "tfcluster" and off == tfcluster.DEFAULT
    assert tfcluster.build(deps, off) is None
    built = tfcluster.build(deps, TFClusterConfig(interval_seconds=7.0))
    assert built is not None
    [reconciler] = built.controllers
    assert isinstance(reconciler, Reconciler) and isinstance(built.part, TFClusterController)
    assert reconciler.name == "tensorfusioncluster" and reconciler.leader_only and reconciler.interval == 7.0
    clusters = informers.cache(TENSOR_FUSION_CLUSTERS, optional=True, name="tensorfusionclusters")
    assert built.part.clusters is clusters and built.part.pools is pools  # the process's shared caches
    assert tuple(reconciler.caches) == (clusters, pools)
    for cache in (clusters, pools):
        reconciler.wake.event.clear()
        cache.handle("ADDED", {"metadata": {"name": "x", "resourceVersion": "1"}})
        assert reconciler.wake.event.is_set()


async def test_a_cluster_that_fails_is_evented_once_and_the_others_are_reconciled() -> None:
    import datetime as dt
    from typing import Any

    from extender.controllers.tfcluster.config import TFClusterConfig
    from extender.controllers.tfcluster.controller import TFClusterController

    class Cache:
        def __init__(self, objects: list[dict[str, Any]]) -> None:
            self.objects = objects

        def list(self) -> list[dict[str, Any]]:
            return list(self.objects)

    class Events:
        def __init__(self) -> None:
            self.events: list[tuple[str, str]] = []

        def record(self, obj: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
            self.events.append((obj["metadata"]["name"], reason))

    first, second = cluster(("a", False, SHARED)), cluster(("b", False, SHARED))
    first["metadata"]["name"], second["metadata"]["name"] = "a-broken", "b-fine"
    events = Events()
    controller = TFClusterController(TFClusterConfig(), None, pools=Cache([]),  # type: ignore[arg-type]
                                     clusters=Cache([first, second]), recorder=events)  # type: ignore[arg-type]
    done: list[str] = []

    async def reconcile_one(c: dict[str, Any], pools: Any, now: Any) -> None:
        if c["metadata"]["name"] == "a-broken":
            raise KeyError("status")
        done.append(c["metadata"]["name"])

    controller.reconcile_one = reconcile_one  # type: ignore[method-assign]
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    await controller.reconcile(now)
    await controller.reconcile(now)
    assert done == ["b-fine", "b-fine"]
    assert events.events == [("a-broken", "ReconcileFailed")]  # once per change, not per pass

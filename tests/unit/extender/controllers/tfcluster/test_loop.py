"""A TensorFusionCluster's status: Running when its pools are in step, Updating while they change, the pools'
totals summed, and not ready when the vendor check fails."""

from __future__ import annotations

from extender.controllers.tfcluster import derive, vendor
from extender.controllers.tfcluster.loop import cluster_status
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


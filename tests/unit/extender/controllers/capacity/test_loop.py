"""The capacity controllers' loop: which filter outcomes wake the launcher."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry

from extender.controllers.capacity.config import CapacityConfig
from extender.scheduling.state import ClusterState
from tests.unit.fixtures.capacity import Store, autoselect_pool, karpenter_pool


async def test_a_pod_of_a_karpenter_pool_that_fits_nowhere_wakes_the_provisioner() -> None:
    from extender.controllers.capacity.loop import CapacityControllers
    from extender.scheduling.state import FilterOutcome

    async def ready() -> None:
        return None

    pools = Store([karpenter_pool(), autoselect_pool()])
    controllers = CapacityControllers(
        CapacityConfig(),
        None,
        ClusterState(),
        nodes=Store(),
        pools=pools,  # type: ignore[arg-type]
        pods=Store(),
        recorder=None,
        registry=CollectorRegistry(),  # type: ignore[arg-type]
        ready=ready,
    )
    controllers._wake = asyncio.Event()
    nowhere = FilterOutcome([], {"n1": "full"}, {}, None, True)

    def pod(pool: str) -> dict[str, Any]:
        return {"metadata": {"annotations": {"tensor-fusion.ai/gpupool": pool}}}

    controllers.observe(pod("auto"), nowhere)  # AutoSelect: node expansion's business
    controllers.observe(pod("kp"), FilterOutcome(["n1"], {}, {}, None, False))  # it fits
    assert not controllers._wake.is_set()
    controllers.observe(pod("kp"), nowhere)
    assert controllers._wake.is_set()


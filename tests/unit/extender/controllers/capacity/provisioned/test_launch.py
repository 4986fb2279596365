"""Provisioned mode's launch reconciler: a capacity error moves to the next offering (the refused one put
aside), any other launch error holds the pool, and bad credentials stop the vendor until a connection test
passes; the pool's condition says which."""

from __future__ import annotations

from typing import Any

import pytest

from extender.cloud.provider import AuthFailure, CapacityUnavailable, InvalidRequest
from tests.unit.fixtures.capacity import NOW, Provisioned
from tests.unit.fixtures.capacity import catalog_file as catalog_file  # the fixture


def _posted(world: Provisioned) -> list[dict[str, Any]]:
    return [c[2] for c in world.port.calls if c[0] == "POST" and c[1] == "gpunodeclaims"]


TWO_ZONES = """
replaceDefaults: true
instanceTypes:
- {name: small.x1, gpuModel: A10G, tflopsPerGPU: "100", vramPerGPU: 24Gi, prices: {on-demand: 1.0},
   zones: [z1, z2]}
"""


async def test_a_capacity_error_puts_the_offering_aside_and_launches_the_next(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(TWO_ZONES)
    world = Provisioned(tmp_path, monkeypatch, str(catalog))
    world.provider.fail = [CapacityUnavailable("InsufficientInstanceCapacity", "none left")]
    actions = await world.capacity.launch.reconcile(NOW)
    first, second = _posted(world)
    refused = (first["spec"]["instanceType"], first["spec"]["capacityType"], first["spec"].get("zone", ""))
    assert (second["spec"]["capacityType"], second["spec"].get("zone", "")) != refused[1:]
    assert [a.action for a in actions] == ["launch", "launch"]
    # the refused claim goes (no VM: no finalizer work), the next one gets its VM
    name = first["metadata"]["name"]
    assert ("PATCH", "gpunodeclaims", name, None, {"metadata": {"finalizers": None}}) in world.port.calls
    assert ("DELETE", "gpunodeclaims", name) in world.port.calls
    assert await world.provider.find(second["metadata"]["name"]) is not None
    assert world.events() == ["InsufficientCapacity", "GPUNodeClaimCreated"]
    assert refused in world.capacity.cloud.unavailable
    assert world.metric("tf_extender_cloud_api_errors_total", vendor="aws", kind="capacity") == 1
    assert world.conditions()[-1]["reason"] == "Ready"


async def test_a_failed_launch_holds_the_pool(
        catalog_file: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    world = Provisioned(tmp_path, monkeypatch, catalog_file)
    world.provider.fail = [InvalidRequest("InvalidAMIID.NotFound", "no such image")]
    await world.capacity.launch.reconcile(NOW)
    assert world.events() == ["LaunchFailed"]
    assert world.conditions()[-1]["reason"] == "LaunchFailed"
    assert "pp" in world.capacity.cloud.held
    world.port.calls.clear()
    await world.capacity.launch.reconcile(NOW)  # the pool waits out its back-off
    assert not _posted(world)
    assert world.conditions()[-1]["reason"] == "LaunchFailed"


async def test_bad_credentials_stop_the_vendor_until_a_connection_test_passes(
        catalog_file: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    world = Provisioned(tmp_path, monkeypatch, catalog_file)
    world.provider.fail = [AuthFailure("UnauthorizedOperation", "not allowed")]
    await world.capacity.launch.reconcile(NOW)
    assert world.conditions()[-1]["reason"] == "AuthFailed"
    assert "pp" not in world.capacity.cloud.held  # not a back-off: the vendor itself is out
    assert world.metric("tf_extender_cloud_api_errors_total", vendor="aws", kind="auth") == 1
    world.port.calls.clear()
    await world.capacity.launch.reconcile(NOW)  # no retest yet: nothing launched
    assert not _posted(world)
    assert world.conditions()[-1]["reason"] == "ConnectionFailed"

"""Provisioned mode's launch reconciler: a capacity error moves to the next offering (the refused one put
aside), any other launch error holds the pool, and bad credentials stop the vendor until a connection test
passes; the pool's condition says which."""

from __future__ import annotations

import re
from typing import Any

import pytest

from extender.cloud.provider import AuthFailure, CapacityUnavailable, InvalidRequest
from extender.controllers.capacity.provisioned.backoff import provisioning_phase
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


async def test_every_offering_in_back_off_is_said_once_with_the_clouds_error_and_the_next_try(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both zones refused: the pool's requirements match, so no NoEligibleInstanceType blaming them, but one
    CapacityBackoff naming each offering with the cloud's words and the next try; later passes in the same
    back-off add no event; the condition CapacityAvailable says it until an offering can be tried again."""
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(TWO_ZONES)
    world = Provisioned(tmp_path, monkeypatch, str(catalog))
    world.provider.fail = [CapacityUnavailable("InsufficientInstanceCapacity", "none left in z1"),
                           CapacityUnavailable("InsufficientInstanceCapacity", "none left in z2")]
    await world.capacity.launch.reconcile(NOW)
    for _ in range(5):  # a pass every few seconds, in the same back-off
        await world.capacity.launch.reconcile(NOW)
    events = world.events()
    assert "NoEligibleInstanceType" not in events
    assert events.count("CapacityBackoff") == 1, events
    (message,) = [e[2] for e in world.port.events if e[1] == "CapacityBackoff"]
    assert "small.x1 (on-demand in z1)" in message and "none left in z1" in message
    assert "small.x1 (on-demand in z2)" in message and "none left in z2" in message
    assert re.search(r"; next try at \d{4}-\d\d-\d\dT\S+Z \(in (5m|4m\d+s)\)$", message), message
    written = world.conditions("CapacityAvailable")
    assert [(c["status"], c["reason"], c["message"]) for c in written[-5:]] == [
        ("False", "CapacityBackoff", message)] * 5  # the same words each pass: no status churn

    world.capacity.cloud.unavailable.clear()  # the back-off is over: the pool may launch again
    await world.capacity.launch.reconcile(NOW)
    assert world.conditions("CapacityAvailable")[-1]["status"] == "True"


def _claim(pool: str, phase: str, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"{pool}-{phase}", "labels": {"tensor-fusion.ai/gpupool": pool}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase}}


@pytest.mark.parametrize(("claims", "phase"), [
    ([], None),  # never provisioned: the CRD's default None stays
    ([_claim("pp", "Pending")], "Provisioning"),
    ([_claim("pp", "Bound"), _claim("pp", "Creating")], "Provisioning"),
    ([_claim("pp", "Bound"), _claim("pp", "Pending", deleting=True), _claim("other", "Pending")],
     "Completed"),
])
def test_provisioning_phase_is_tensorfusions(claims: list[dict[str, Any]], phase: str | None) -> None:
    assert provisioning_phase("pp", claims) == phase


async def test_the_provisioning_phase_is_written_when_it_changes_only(
        catalog_file: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    world = Provisioned(tmp_path, monkeypatch, catalog_file)
    await world.capacity.launch._provisioning_phase("pp", [_claim("pp", "Creating")])
    patches = [c for c in world.port.calls if c[0] == "PATCH" and c[1] == "gpupools"]
    assert patches[-1][4] == {"status": {"provisioningPhase": "Provisioning"}}
    pool = world.capacity.cloud.view.pools.get("pp")
    assert pool is not None
    pool.setdefault("status", {})["provisioningPhase"] = "Provisioning"  # as the watch brings it back
    world.port.calls.clear()
    await world.capacity.launch._provisioning_phase("pp", [_claim("pp", "Creating")])
    assert world.port.calls == []

"""Provisioned mode's registration reconciler: a Pending claim's VM is asked for again and the cloud hands
back the one already tagged with the claim; a claim whose Node does not join within the join timeout, or
whose VM is gone, is deleted."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests.unit.fixtures.capacity import NOW, Provisioned
from tests.unit.fixtures.capacity import catalog_file as catalog_file  # the fixture


async def test_a_pending_claim_whose_vm_exists_gets_that_vm_not_another(
        catalog_file: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    world = Provisioned(tmp_path, monkeypatch, catalog_file)
    claim = await world.launched()
    name, instance_id = claim["metadata"]["name"], claim["status"]["instanceID"]
    world.claims.objects[name] = {**claim, "status": {"phase": "Pending"}}  # killed before the status write
    await world.capacity.registration.reconcile(NOW)
    assert len(world.provider.instances) == 1
    assert ("PATCH", "gpunodeclaims", name, "status",
            {"status": {"phase": "Creating", "instanceID": instance_id}}) in world.port.calls


async def test_a_claim_whose_node_never_joins_is_deleted_after_the_join_timeout(
        catalog_file: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    world = Provisioned(tmp_path, monkeypatch, catalog_file, join_timeout_seconds=600)
    claim = await world.launched(created="2026-01-01T11:55:00Z")
    name = claim["metadata"]["name"]
    await world.capacity.registration.reconcile(NOW)  # 5 minutes: it may still join
    assert not [c for c in world.port.calls if c[0] == "DELETE"]
    world.claims.objects[name] = {**claim, "metadata": {**claim["metadata"],
                                                        "creationTimestamp": "2026-01-01T11:49:00Z"}}
    await world.capacity.registration.reconcile(NOW)
    assert ("DELETE", "gpunodeclaims", name) in world.port.calls
    assert (name, "NodeNotJoined") in [(e[0], e[1]) for e in world.port.events]
    assert world.events() == ["NodeNotJoined"]
    assert world.metric("tf_extender_cloud_instances_terminated_total", reason="not_joined") == 1


async def test_a_claim_whose_vm_is_gone_is_deleted(
        catalog_file: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    world = Provisioned(tmp_path, monkeypatch, catalog_file)
    claim = await world.launched()
    name, instance_id = claim["metadata"]["name"], claim["status"]["instanceID"]
    world.provider.instances[instance_id] = replace(world.provider.instances[instance_id], state="terminated")
    await world.capacity.registration.reconcile(NOW)
    assert ("DELETE", "gpunodeclaims", name) in world.port.calls
    assert [(e[0], e[1]) for e in world.port.events] == [(name, "InstanceGone")]


async def test_a_claims_recorded_vendor_never_redirects_a_launch(
        catalog_file: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Pending claim without a VM is launched through its pool's vendor, not the vendor its annotation
    records (which whoever may patch the claim can edit): that one only describes and terminates."""
    from extender.common.labels import COMPUTING_VENDOR
    from extender.controllers.capacity.provisioned import cloud as cloud_module
    from tests.unit.fixtures.capacity import FakeProvider

    world = Provisioned(tmp_path, monkeypatch, catalog_file)
    claim = await world.launched()
    by_region: dict[str, FakeProvider] = {}
    monkeypatch.setattr(cloud_module, "make_provider",
                        lambda config: by_region.setdefault(config.region, FakeProvider()))
    world.capacity.cloud.vendors.clear()
    name = claim["metadata"]["name"]
    annotations = {**claim["metadata"].get("annotations", {}),
                   COMPUTING_VENDOR: '{"type":"aws","authType":"serviceAccountRole",'
                                     '"params":{"defaultRegion":"ap-south-1"}}'}
    world.claims.objects[name] = {**claim, "metadata": {**claim["metadata"], "annotations": annotations},
                                  "status": {"phase": "Pending"}}
    await world.capacity.registration.reconcile(NOW)
    assert ("create", name) in by_region["us-east-1"].calls  # the pool's (the --computing-vendor file's)
    assert not [c for c in by_region.get("ap-south-1", FakeProvider()).calls if c[0] == "create"]

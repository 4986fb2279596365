"""Provisioned mode's garbage collection: a VM tagged for the cluster is terminated only when no claim owns
it and it is older than the grace, and the cloud is listed at most every so often."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

import pytest

from extender.cloud.provider import Instance
from tests.unit.fixtures.capacity import NOW, Provisioned
from tests.unit.fixtures.capacity import catalog_file as catalog_file  # the fixture


async def test_only_old_vms_no_claim_owns_are_terminated(
        catalog_file: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    world = Provisioned(tmp_path, monkeypatch, catalog_file, orphan_grace_seconds=120)
    claim = await world.launched()
    owned = claim["status"]["instanceID"]
    old = NOW - dt.timedelta(minutes=5)
    world.provider.instances["i-young"] = Instance("i-young", "running", "pp-x", "", NOW, {})
    world.provider.instances["i-old"] = Instance("i-old", "running", "pp-y", "", old,
                                                 {"tensor-fusion.ai/gpupool": "pp"})
    world.provider.instances[owned] = replace(world.provider.instances[owned], launched=old)
    await world.capacity.garbagecollection.reconcile(NOW)
    assert [c[1] for c in world.provider.calls if c[0] == "terminate"] == ["i-old"]
    assert world.events() == ["OrphanTerminated"]
    assert world.metric("tf_extender_cloud_instances_terminated_total", reason="orphan") == 1
    listed = len([c for c in world.provider.calls if c[0] == "list"])
    await world.capacity.garbagecollection.reconcile(NOW)  # swept a moment ago
    assert len([c for c in world.provider.calls if c[0] == "list"]) == listed == 1


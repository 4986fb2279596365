"""Provisioned mode's termination reconciler: without a working cloud the finalizer of a deleted claim
stays, said once per reason."""

from __future__ import annotations

from typing import Any

import pytest

from extender.cloud.provider import AuthFailure
from tests.unit.fixtures.capacity import NOW, Provisioned
from tests.unit.fixtures.capacity import catalog_file as catalog_file  # the fixture


async def test_without_a_cloud_the_finalizer_stays_and_says_why_once(
        catalog_file: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    world = Provisioned(tmp_path, monkeypatch, catalog_file)
    claim = await world.launched()
    name = claim["metadata"]["name"]
    world.claims.objects[name] = {**claim, "metadata": {**claim["metadata"],
                                                        "deletionTimestamp": "2026-01-01T12:05:00Z"}}
    world.capacity.cloud.vendors.clear()  # a fresh process whose connection test fails

    async def refused() -> None:
        raise AuthFailure("AuthFailure", "expired")

    world.provider.test_connection = refused  # type: ignore[method-assign]
    await world.capacity.termination.reconcile(NOW)
    await world.capacity.termination.reconcile(NOW)
    assert not [c for c in world.provider.calls if c[0] == "terminate"]
    assert not [c for c in world.port.calls if c[0] == "PATCH" and c[1] == "gpunodeclaims"]
    assert [(e[0], e[1]) for e in world.port.events] == [(name, "InstanceNotTerminated")]

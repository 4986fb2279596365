"""The capacity controllers: which filter outcomes wake the launchers, and Provisioned mode's four
reconcilers (launch, registration, termination, garbage collection) over one cloud."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from extender.controllers.capacity.config import CapacityConfig
from extender.scheduling.state import ClusterState, Kind
from tests.unit.fixtures.capacity import (
    NOW,
    Provisioned,
    Store,
    autoselect_pool,
    gfd_node,
    karpenter_pool,
    provisioned_pool,
)
from tests.unit.fixtures.capacity import catalog_file as catalog_file  # the fixture


def _capacity(pools: list[dict[str, Any]] = (), **caches: Any) -> Any:  # type: ignore[assignment]
    from extender.controllers.capacity.controller import Capacity

    stores = {k: caches.get(k, Store()) for k in ("gpunodeclaims", "nodeclaims", "node_classes", "clusters")}
    return Capacity(CapacityConfig(interval_seconds=600), None, ClusterState(),  # type: ignore[arg-type]
                    nodes=Store(), pools=Store(pools), pods=Store(), recorder=None,  # type: ignore[arg-type]
                    registry=CollectorRegistry(), core=caches.get("core", ()), **stores)


def test_every_controller_is_leader_only_every_interval_over_the_core_caches_and_its_own() -> None:
    core = (Store(), Store())
    claims, nodeclaims, classes, clusters = Store(), Store(), Store(), Store()
    capacity = _capacity(core=core, gpunodeclaims=claims, nodeclaims=nodeclaims, node_classes=classes,
                         clusters=clusters)
    assert [c.name for c in capacity.controllers] == [
        "provisioner", "compactor", "provisioned-launch", "provisioned-registration",
        "provisioned-termination", "provisioned-garbagecollection"]
    for c in capacity.controllers:
        assert c.leader_only and c.interval == 600
        assert list(c.caches) == [*core, claims, nodeclaims, classes, clusters]


def test_a_change_of_a_claim_class_or_cluster_wakes_the_launchers_registration_and_termination() -> None:
    claims, nodeclaims, classes, clusters = Store(), Store(), Store(), Store()
    capacity = _capacity(gpunodeclaims=claims, nodeclaims=nodeclaims, node_classes=classes, clusters=clusters)
    woken = {"provisioner", "provisioned-launch", "provisioned-registration", "provisioned-termination"}
    for cache in (claims, nodeclaims, classes, clusters):
        for c in capacity.controllers:
            c.wake.event.clear()
        for listener in cache.listeners:
            listener("MODIFIED", {"metadata": {"name": "x"}})
        assert {c.name for c in capacity.controllers if c.wake.event.is_set()} == woken


async def test_a_woken_provisioned_reconciler_passes_again_before_its_interval() -> None:
    from extender.controllers.runner import Runner

    claims = Store()
    capacity = _capacity(gpunodeclaims=claims)
    passes: list[dt.datetime] = []

    async def reconcile(now: dt.datetime) -> None:
        passes.append(now)

    for c in capacity.controllers:
        c.settle = 0.0
    registration = capacity.provisioned_registration
    registration.reconcile = reconcile
    task = asyncio.create_task(Runner().run(registration))
    try:
        for _ in range(50):
            await asyncio.sleep(0.01)
            if passes:
                break
        assert len(passes) == 1  # the first pass; the next is 600s away
        claims.listeners[0]("ADDED", {"metadata": {"name": "pp-1"}})
        for _ in range(50):
            await asyncio.sleep(0.01)
            if len(passes) == 2:
                break
        assert len(passes) == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_a_pod_of_a_provisioned_pool_that_fits_nowhere_wakes_both_launchers() -> None:
    from extender.scheduling.state import FilterOutcome

    capacity = _capacity([provisioned_pool()])
    capacity.after_filter({"metadata": {"annotations": {"tensor-fusion.ai/gpupool": "pp"}}},
                          FilterOutcome([], {"n1": "full"}, {}, None, True))
    assert {c.name for c in capacity.controllers if c.wake.event.is_set()} == {
        "provisioner", "provisioned-launch"}


async def test_a_pod_of_a_karpenter_pool_that_fits_nowhere_wakes_the_provisioner() -> None:
    from extender.controllers.capacity.controller import Capacity
    from extender.scheduling.state import FilterOutcome

    pools = Store([karpenter_pool(), autoselect_pool()])
    capacity = Capacity(
        CapacityConfig(),
        None,  # type: ignore[arg-type]
        ClusterState(),
        nodes=Store(),
        pools=pools,
        pods=Store(),
        recorder=None,  # type: ignore[arg-type]
        registry=CollectorRegistry(),
        gpunodeclaims=Store(),
        nodeclaims=Store(),
        node_classes=Store(),
        clusters=Store(),
    )
    woken = capacity.provisioner.wake.event
    nowhere = FilterOutcome([], {"n1": "full"}, {}, None, True)

    def pod(pool: str) -> dict[str, Any]:
        return {"metadata": {"annotations": {"tensor-fusion.ai/gpupool": pool}}}

    capacity.after_filter(pod("auto"), nowhere)  # AutoSelect: node expansion's business
    capacity.after_filter(pod("kp"), FilterOutcome(["n1"], {}, {}, None, False))  # it fits
    assert not woken.is_set()
    capacity.after_filter(pod("kp"), nowhere)
    assert woken.is_set()


async def test_provisioned_mode_launches_registers_terminates_and_sweeps(
        catalog_file: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The four Provisioned-mode reconcilers over one cloud state: a claim then its VM, Bound once its Node
    has GPUs, its VM terminated before its finalizer goes, and a VM no claim owns terminated after the
    grace."""
    from extender.cloud.provider import Instance
    from extender.common.labels import NODE_PROVISIONER, PROVISIONED_FINALIZER

    world = Provisioned(tmp_path, monkeypatch, catalog_file, orphan_grace_seconds=60)
    capacity, port, provider = world.capacity, world.port, world.provider
    claims, nodes, state = world.claims, world.nodes, world.state
    assert [c.name for c in capacity.controllers] == [
        "provisioner", "compactor", "provisioned-launch", "provisioned-registration",
        "provisioned-termination", "provisioned-garbagecollection"]
    assert all(c.leader_only for c in capacity.controllers)

    actions = await capacity.launch.reconcile(NOW)
    assert [a.action for a in actions] == ["launch"]
    (created,) = [c[2] for c in port.calls if c[0] == "POST"]
    name = created["metadata"]["name"]
    assert created["metadata"]["finalizers"] == [PROVISIONED_FINALIZER]
    assert provider.calls[-1] == ("create", name)
    assert [e[1] for e in port.events if e[0] == "pp"] == ["GPUNodeClaimCreated"]
    written = [cond for c in port.calls if c[0] == "PATCH" and c[1] == "gpupools"
               for cond in c[4]["status"]["conditions"]]
    assert [c["reason"] for c in written if c["type"] == "NodeProvisionerReady"][-1] == "Ready"
    assert [c["reason"] for c in written if c["type"] == "CapacityAvailable"][-1] == "OfferingsAvailable"
    # a second pass buys nothing: the claim is remembered until the cache has it
    port.calls.clear()
    await capacity.launch.reconcile(NOW)
    assert not [c for c in port.calls if c[0] == "POST"]

    # registration: the claim's Node joins with GPUs, the claim is Bound
    claim = {**created, "status": {"phase": "Creating", "instanceID": "i-0"}}
    claims.objects[name] = claim
    node = gfd_node("n1", "pp")
    node["metadata"]["labels"][NODE_PROVISIONER] = name
    nodes.objects["n1"] = node
    state.apply(Kind.NODE, "ADDED", node)
    port.calls.clear()
    await capacity.registration.reconcile(NOW)
    assert ("PATCH", "gpunodeclaims", name, "status",
            {"status": {"phase": "Bound", "instanceID": "i-0"}}) in port.calls
    assert (name, "Bound") in [(e[0], e[1]) for e in port.events]

    # termination: the deleted claim's VM goes first, then its Node and the finalizer
    deleted = {**claim["metadata"], "deletionTimestamp": "2026-01-01T12:05:00Z"}
    claims.objects[name] = {**claim, "metadata": deleted}
    port.calls.clear()
    await capacity.termination.reconcile(NOW)
    assert ("terminate", "i-0") in provider.calls and not [c for c in port.calls if c[0] == "DELETE"]
    await capacity.termination.reconcile(NOW)
    assert ("DELETE", "nodes", "n1") in port.calls
    assert ("PATCH", "gpunodeclaims", name, None, {"metadata": {"finalizers": None}}) in port.calls

    # garbage collection: a VM tagged for the cluster that no claim owns, older than the grace
    del claims.objects[name]
    capacity.view.created.clear()
    provider.instances["i-9"] = Instance("i-9", "running", "pp-gone", "", NOW - dt.timedelta(minutes=5),
                                         {"tensor-fusion.ai/gpupool": "pp"})
    await capacity.garbagecollection.reconcile(NOW)
    assert ("terminate", "i-9") in provider.calls
    assert ("pp", "OrphanTerminated") in [(e[0], e[1]) for e in port.events]

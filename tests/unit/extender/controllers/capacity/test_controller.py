"""The capacity controllers: which filter outcomes wake the launchers, and Provisioned mode's four
reconcilers (launch, registration, termination, garbage collection) over one cloud."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from extender.controllers.capacity.config import CapacityConfig
from extender.scheduling.state import ClusterState, Kind
from tests.unit.fixtures.capacity import (
    NOW,
    FakePort,
    Store,
    autoselect_pool,
    gfd_node,
    karpenter_pool,
)
from tests.unit.fixtures.capacity import catalog_file as catalog_file  # the fixture


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


class FakeProvider:
    """A cloud that launches at once, whose VMs ``gone`` marks terminated."""

    vendor = "aws"

    def __init__(self) -> None:
        from extender.cloud.provider import Instance

        self.instances: dict[str, Instance] = {}
        self.calls: list[tuple[str, str]] = []

    async def test_connection(self) -> None:
        self.calls.append(("test", ""))

    async def create(self, request: Any) -> Any:
        from extender.cloud.provider import Instance

        self.calls.append(("create", request.claim))
        instance = Instance(f"i-{len(self.instances)}", "running", request.claim, request.zone, NOW,
                            {"tensor-fusion.ai/gpupool": request.pool})
        self.instances[instance.id] = instance
        return instance

    async def find(self, claim: str) -> Any:
        return next((i for i in self.instances.values() if i.claim == claim and not i.gone), None)

    async def describe(self, instance_id: str) -> Any:
        self.calls.append(("describe", instance_id))
        return self.instances.get(instance_id)

    async def list_managed(self, cluster: str) -> list[Any]:
        self.calls.append(("list", cluster))
        return list(self.instances.values())

    async def terminate(self, instance_id: str) -> None:
        from dataclasses import replace

        self.calls.append(("terminate", instance_id))
        self.instances[instance_id] = replace(self.instances[instance_id], state="terminated")

    async def close(self) -> None:
        self.calls.append(("close", ""))


async def test_provisioned_mode_launches_registers_terminates_and_sweeps(
        catalog_file: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The four Provisioned-mode reconcilers over one cloud state: a claim then its VM, Bound once its Node
    has GPUs, its VM terminated before its finalizer goes, and a VM no claim owns terminated after the
    grace."""
    from extender.cloud.provider import Instance
    from extender.common.labels import NODE_PROVISIONER, PROVISIONED_FINALIZER
    from extender.controllers.capacity.controller import Capacity
    from extender.controllers.capacity.provisioned import cloud as cloud_module

    provider = FakeProvider()
    monkeypatch.setattr(cloud_module, "make_provider", lambda config: provider)
    vendor = tmp_path / "vendor.yaml"
    vendor.write_text("type: aws\nauthType: serviceAccountRole\nparams: {defaultRegion: us-east-1}\n")
    pool = {"kind": "GPUPool", "apiVersion": "tensor-fusion.ai/v1",
            "metadata": {"name": "pp", "uid": "pp-uid"},
            "spec": {"capacityConfig": {"minResources": {"tflops": 50}},
                     "nodeManagerConfig": {"provisioningMode": "Provisioned",
                                           "nodeProvisioner": {"nodeClass": "gpu"}}}}
    node_class = {"metadata": {"name": "gpu"}, "spec": {"osImageSelectorTerms": [{"id": "ami-1"}]}}
    state = ClusterState()
    state.apply(Kind.POOL, "ADDED", pool)
    claims, nodes = Store(), Store()
    capacity = Capacity(
        CapacityConfig(catalog_file=catalog_file, computing_vendor_file=str(vendor),
                       orphan_grace_seconds=60),
        None,  # type: ignore[arg-type]
        state, recorder=None, registry=CollectorRegistry(),  # type: ignore[arg-type]
        nodes=nodes, pools=Store([pool]), pods=Store(), gpunodeclaims=claims, nodeclaims=Store(),
        node_classes=Store([node_class]), clusters=Store(),
    )
    port = FakePort()
    capacity.port = capacity.view.port = capacity.cloud.port = port  # type: ignore[assignment]
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
    condition = [c[4] for c in port.calls if c[0] == "PATCH" and c[1] == "gpupools"][-1]
    assert condition["status"]["conditions"][0]["reason"] == "Ready"
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

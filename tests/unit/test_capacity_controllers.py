"""The live capacity controllers against fake API I/O: what they write, in which order, and the events."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from extender.controllers.capacity.compactor import Compactor, CompactorMetrics
from extender.controllers.capacity.config import CapacityConfig
from extender.controllers.capacity.gpunodeclaim import gpunodeclaim_body, nodeclaim_body
from extender.controllers.capacity.launcher import Launcher, LauncherMetrics
from extender.controllers.capacity.port import LiveView
from extender.kube.resources import GPU_NODE_CLAIMS, GPU_POOLS, NODECLAIMS, NODES
from extender.planning.catalog import parse_catalog
from extender.planning.offerings import offerings
from extender.planning.pool import pool_config
from extender.scheduling.state import ClusterState, Kind

NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
REF = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "version": "v1alpha1", "name": "default"}
CATALOG = """
replaceDefaults: true
instanceTypes:
- {name: small.x1, gpuModel: A10G, tflopsPerGPU: "100", vramPerGPU: 24Gi, prices: {on-demand: 1.0, spot: 0.5},
   zones: [z1]}
"""


class Store:
    def __init__(self, objects: list[dict[str, Any]] = ()) -> None:  # type: ignore[assignment]
        self.objects = {o["metadata"]["name"]: o for o in objects}
        self.synced = asyncio.Event()
        self.synced.set()
        self.listeners: list[Any] = []

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self.objects.get(name)

    def list(self) -> list[dict[str, Any]]:
        return list(self.objects.values())

    def subscribe(self, listener: Any) -> None:
        self.listeners.append(listener)


class FakePort:
    def __init__(self, existing: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.calls: list[tuple[Any, ...]] = []
        self.events: list[tuple[str, str, str, str]] = []
        self.existing = existing
        self.fail_nodeclaims = False

    async def get(self, path: str) -> dict[str, Any] | None:
        self.calls.append(("GET", path))
        return {} if any(path.endswith(e) for e in self.existing) or "limit=1" in path else None

    async def create(self, resource: Any, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("POST", resource.plural, body))
        if resource is NODECLAIMS and self.fail_nodeclaims:
            raise RuntimeError("the server could not find the requested resource")
        return {**body, "metadata": {**body["metadata"], "uid": f"uid-{body['metadata']['name']}"}}

    async def patch(
        self, resource: Any, name: str, body: dict[str, Any], subresource: str | None = None
    ) -> None:
        self.calls.append(("PATCH", resource.plural, name, subresource, body))

    async def delete(self, resource: Any, name: str) -> bool:
        self.calls.append(("DELETE", resource.plural, name))
        return True

    def record(self, obj: Any, reason: str, message: str, type_: str = "Normal") -> None:
        self.events.append((obj["metadata"]["name"], reason, message, type_))


def karpenter_pool(**capacity: Any) -> dict[str, Any]:
    return {
        "kind": "GPUPool",
        "apiVersion": "tensor-fusion.ai/v1",
        "metadata": {"name": "kp", "uid": "pool-uid"},
        "spec": {
            "capacityConfig": capacity,
            "nodeManagerConfig": {
                "provisioningMode": "Karpenter",
                "nodeProvisioner": {
                    "karpenterNodeClassRef": REF,
                    "gpuNodeLabels": {"team": "ml"},
                    "gpuTaints": [{"key": "gpu", "value": "yes"}],
                    "gpuRequirements": [
                        {
                            "key": "karpenter.sh/capacity-type",
                            "operator": "In",
                            "values": ["OnDemand", "Spot"],
                        }
                    ],
                },
            },
        },
    }


def view_of(
    port: FakePort,
    pools: list[dict[str, Any]],
    nodes: list[dict[str, Any]] = (),  # type: ignore
    claims: list[dict[str, Any]] = (),
    nodeclaims: list[dict[str, Any]] = (),  # type: ignore
    tmp_catalog: str | None = None,
) -> LiveView:
    state = ClusterState()
    for pool in pools:
        state.apply(Kind.POOL, "ADDED", pool)
    for node in nodes:
        state.apply(Kind.NODE, "ADDED", node)
    return LiveView(
        CapacityConfig(catalog_file=tmp_catalog, protection_seconds=300),
        state,
        nodes=Store(nodes),
        pools=Store(pools),
        pods=Store(),
        gpunodeclaims=Store(claims),
        nodeclaims=Store(nodeclaims),
        port=port,  # type: ignore[arg-type]
    )


@pytest.fixture
def catalog_file(tmp_path: Any) -> str:
    path = tmp_path / "catalog.yaml"
    path.write_text(CATALOG)
    return str(path)


def test_claim_bodies() -> None:
    config = pool_config(karpenter_pool())
    (offer,) = [
        o for o in offerings(parse_catalog(CATALOG), config.requirements) if o.capacity_type == "spot"
    ]
    gnc = gpunodeclaim_body(config, offer, "kp-abc")
    # TensorFusion's key and ours, so claims are read by either
    assert gnc["metadata"]["labels"] == {"tensor-fusion.ai/managed-by": "kp",
                                         "tensor-fusion.ai/gpupool": "kp"}
    assert gnc["metadata"]["annotations"] == {"tensor-fusion.ai/hourly-pricing": "0.5"}
    assert gnc["metadata"]["ownerReferences"][0]["uid"] == "pool-uid"
    assert gnc["spec"] == {
        "instanceType": "small.x1",
        "capacityType": "spot",
        "gpuDeviceOffered": 1,
        "tflopsOffered": "100",
        "vramOffered": "24Gi",
        "zone": "z1",
        "nodeClassRef": REF,
    }
    nc = nodeclaim_body(config, offer, "kp-abc", "gnc-uid")
    assert nc["metadata"]["annotations"] == {"karpenter.sh/do-not-disrupt": "true"}
    assert nc["metadata"]["ownerReferences"][0] == {
        "apiVersion": "tensor-fusion.ai/v1",
        "kind": "GPUNodeClaim",
        "name": "kp-abc",
        "uid": "gnc-uid",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert (
        nc["metadata"]["labels"]["team"] == "ml" and nc["metadata"]["labels"]["nvidia.com/gpu.count"] == "1"
    )
    assert nc["spec"]["nodeClassRef"] == {k: REF[k] for k in ("group", "kind", "name")}
    assert nc["spec"]["requirements"] == [
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["small.x1"]},
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]},
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]},
    ]
    assert nc["spec"]["taints"] == [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]
    assert nc["spec"]["resources"] == {"requests": {"nvidia.com/gpu": "1"}}


async def test_provisioner_creates_claims_in_order_and_counts_them_pending(catalog_file: str) -> None:
    port = FakePort(existing={"/kwoknodeclasses/default"})
    view = view_of(port, [karpenter_pool(minResources={"tflops": 150})], tmp_catalog=catalog_file)
    provisioner = Launcher(view, port, LauncherMetrics(CollectorRegistry()))  # type: ignore[arg-type]
    actions = await provisioner.reconcile(NOW)
    assert [(a.action, a.details.get("count"), a.details.get("capacityType")) for a in actions] == [
        ("launch", 2, "spot")
    ]
    writes = [(c[0], c[1], c[3]) if c[0] == "PATCH" else (c[0], c[1]) for c in port.calls if c[0] != "GET"]
    claim = (
        ("POST", "gpunodeclaims"),
        ("PATCH", "gpunodeclaims", "status"),
        ("POST", "nodeclaims"),
        ("PATCH", "gpunodeclaims", "status"),
    )
    assert writes == [*claim, *claim, ("PATCH", "gpupools", "status")]
    phases = [c[4]["status"]["phase"] for c in port.calls if c[0] == "PATCH" and c[1] == "gpunodeclaims"]
    assert phases == ["Pending", "Creating"] * 2
    assert [e[1] for e in port.events if e[1] == "GPUNodeClaimCreated"] == ["GPUNodeClaimCreated"] * 2
    # The claims are not in the watch cache yet: a second reconcile must not buy again.
    port.calls.clear()
    assert await provisioner.reconcile(NOW) == []
    assert not [c for c in port.calls if c[0] == "POST"]


async def test_missing_nodeclass_is_an_event_and_no_claim(catalog_file: str, caplog: Any) -> None:
    port = FakePort()
    view = view_of(port, [karpenter_pool(minResources={"tflops": 150})], tmp_catalog=catalog_file)
    provisioner = Launcher(view, port, LauncherMetrics(CollectorRegistry()))  # type: ignore[arg-type]
    caplog.set_level("INFO", logger="extender.controllers.capacity.launcher")
    await provisioner.reconcile(NOW)
    await provisioner.reconcile(NOW)  # the same skip again: logged once, evented (folded by the recorder)
    logged = [r.plan for r in caplog.records if r.getMessage() == "plan"]
    assert [(x["action"], x["event"]) for x in logged] == [("skip", "NodeClassNotFound")]
    assert not [c for c in port.calls if c[0] == "POST"]
    assert [(e[1], e[3]) for e in port.events] == [("NodeClassNotFound", "Warning")] * 2


async def test_failed_nodeclaim_create_deletes_the_gpunodeclaim(catalog_file: str) -> None:
    port = FakePort(existing={"/kwoknodeclasses/default"})
    port.fail_nodeclaims = True
    view = view_of(port, [karpenter_pool(minResources={"tflops": 50})], tmp_catalog=catalog_file)
    provisioner = Launcher(view, port, LauncherMetrics(CollectorRegistry()))  # type: ignore[arg-type]
    await provisioner.reconcile(NOW)
    assert [c[0:2] for c in port.calls if c[0] == "DELETE"] == [("DELETE", "gpunodeclaims")]
    assert [e[1] for e in port.events if e[3] == "Warning"] == ["NodeClaimCreationFailed"]
    assert view.created == {}
    # The pool's launches wait: a rejected NodeClaim is not retried in a loop.
    port.calls.clear()
    await provisioner.reconcile(NOW)
    assert not [c for c in port.calls if c[0] == "POST"]


def test_gpu_model_becomes_a_valid_label_value() -> None:
    from extender.controllers.capacity.gpunodeclaim import label_value
    from extender.scheduling.gpu_models import lookup

    assert label_value("A100 80GB") == "A100-80GB" and lookup("A100-80GB").model == "A100 80GB"
    assert label_value("RTX 6000 Ada") == "RTX-6000-Ada" and label_value(" x ") == "x"


def gfd_node(
    name: str, pool: str, created: str = "2026-01-01T11:00:00Z", annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "annotations": annotations or {},
            "labels": {
                "nvidia.com/gpu.count": "1",
                "nvidia.com/gpu.product": "A10G",
                "tensor-fusion.ai/gpupool": pool,
            },
        },
    }


async def test_phases_follow_the_nodeclaim_and_the_node(catalog_file: str) -> None:
    port = FakePort(existing={"/kwoknodeclasses/default"})
    claims = [
        {
            "kind": "GPUNodeClaim",
            "apiVersion": "tensor-fusion.ai/v1",
            "metadata": {"name": n, "labels": {"tensor-fusion.ai/gpupool": "kp"}},
            "spec": {},
            "status": {"phase": phase},
        }
        for n, phase in (("c-pending", "Pending"), ("c-creating", "Creating"), ("c-gone", "Bound"))
    ]
    nodeclaims = [
        {"metadata": {"name": "c-pending"}, "status": {}},
        {"metadata": {"name": "c-creating"}, "status": {"nodeName": "n1"}},
    ]
    view = view_of(
        port,
        [karpenter_pool()],
        nodes=[gfd_node("n1", "kp")],
        claims=claims,
        nodeclaims=nodeclaims,
        tmp_catalog=catalog_file,
    )
    provisioner = Launcher(view, port, LauncherMetrics(CollectorRegistry()))  # type: ignore[arg-type]
    await provisioner.sync_claims()
    writes = [c for c in port.calls if c[0] in ("PATCH", "DELETE")]
    assert writes == [
        ("PATCH", "gpunodeclaims", "c-pending", "status", {"status": {"phase": "Creating"}}),
        ("PATCH", "gpunodeclaims", "c-creating", None, {"spec": {"nodeName": "n1"}}),
        ("PATCH", "gpunodeclaims", "c-creating", "status", {"status": {"phase": "Bound"}}),
        ("DELETE", "gpunodeclaims", "c-gone"),
    ]
    assert ("c-gone", "NodeClaimGone") in [(e[0], e[1]) for e in port.events]


async def test_the_karpenter_sync_leaves_the_claims_of_provisioned_pools_alone(catalog_file: str) -> None:
    """A Provisioned pool's claims have no NodeClaim: the Karpenter launcher must neither give them one
    nor delete them as NodeClaimGone (the provisioned controller owns them)."""
    port = FakePort(existing={"/kwoknodeclasses/default"})
    provisioned_pool = {"kind": "GPUPool", "apiVersion": "tensor-fusion.ai/v1", "metadata": {"name": "pp"},
                        "spec": {"nodeManagerConfig": {"provisioningMode": "Provisioned",
                                                       "nodeProvisioner": {"nodeClass": "gpu"}}}}
    ref = {"group": "tensor-fusion.ai", "kind": "GPUNodeClass", "version": "v1", "name": "gpu"}
    claims = [
        {"kind": "GPUNodeClaim", "apiVersion": "tensor-fusion.ai/v1",
         "metadata": {"name": n, "labels": {"tensor-fusion.ai/gpupool": pool}},
         "spec": {"nodeClassRef": ref}, "status": {"phase": phase}}
        for n, pool, phase in (("p-pending", "pp", "Pending"), ("p-creating", "pp", "Creating"),
                               ("k-odd", "kp", "Creating"))
    ]
    view = view_of(port, [karpenter_pool(), provisioned_pool], nodes=[], claims=claims, nodeclaims=[],
                   tmp_catalog=catalog_file)
    provisioner = Launcher(view, port, LauncherMetrics(CollectorRegistry()))  # type: ignore[arg-type]
    await provisioner.sync_claims()
    assert [c for c in port.calls if c[0] in ("PATCH", "DELETE", "POST")] == []


def autoselect_pool(annotations: dict[str, str] | None = None, **capacity: Any) -> dict[str, Any]:
    return {
        "kind": "GPUPool",
        "apiVersion": "tensor-fusion.ai/v1",
        "metadata": {"name": "auto", "annotations": annotations or {}},
        "spec": {
            "capacityConfig": capacity,
            "nodeManagerConfig": {"provisioningMode": "AutoSelect", "nodeCompaction": {"period": "10m"}},
        },
    }


async def test_compactor_labels_surplus_protects_warm_and_respects_the_period() -> None:
    port = FakePort()
    nodes = [
        gfd_node("b", "auto"),
        gfd_node(
            "a",
            "auto",
            annotations={
                "karpenter.sh/do-not-disrupt": "true",
                "tensor-fusion.ai/protected-by-compaction": "x",
            },
        ),
    ]
    view = view_of(port, [autoselect_pool(warmResources={"tflops": 70})], nodes=nodes)
    compactor = Compactor(view, port, CompactorMetrics(CollectorRegistry()), 60)  # type: ignore[arg-type]
    actions = await compactor.reconcile(NOW)
    assert [(a.action, a.node) for a in actions] == [("unprotect", "a"), ("release", "a"), ("protect", "b")]
    patches = [(c[2], c[4]) for c in port.calls if c[0] == "PATCH"]
    ours = {"karpenter.sh/do-not-disrupt": None, "tensor-fusion.ai/protected-by-compaction": None}
    assert patches == [
        ("a", {"metadata": {"annotations": ours}}),
        ("a", {"metadata": {"labels": {"tensor-fusion.ai/should-delete": "true"}, "annotations": ours}}),
        (
            "b",
            {
                "metadata": {
                    "annotations": {
                        "karpenter.sh/do-not-disrupt": "true",
                        "tensor-fusion.ai/protected-by-compaction": "warm-or-min-capacity",
                    }
                }
            },
        ),
    ]
    assert [e[1] for e in port.events] == ["CompactionSurplus", "CompactionRelease", "CompactionKeep"]
    # Within the period: no release, even though b is still surplus (the fake API changed nothing).
    later = NOW + dt.timedelta(minutes=1)
    assert "release" not in [a.action for a in await compactor.reconcile(later)]
    # The manual trigger, once per timestamp.
    stamp = later.strftime("%Y-%m-%dT%H:%M:%SZ")
    view.pools.objects["auto"] = autoselect_pool(
        {"tensor-fusion.ai/manual-compaction": stamp}, warmResources={"tflops": 70}
    )
    assert "release" in [a.action for a in await compactor.reconcile(later + dt.timedelta(seconds=5))]
    assert "release" not in [a.action for a in await compactor.reconcile(later + dt.timedelta(seconds=10))]
    # A stale timestamp does not trigger.
    compactor.manual_done.clear()
    assert "release" not in [a.action for a in await compactor.reconcile(later + dt.timedelta(minutes=3))]


async def test_karpenter_mode_compaction_deletes_nodeclaim_and_gpunodeclaim(catalog_file: str) -> None:
    port = FakePort()
    claims = [
        {
            "kind": "GPUNodeClaim",
            "metadata": {"name": "kp-1", "labels": {"tensor-fusion.ai/gpupool": "kp"}},
            "spec": {},
            "status": {"phase": "Bound"},
        }
    ]
    view = view_of(
        port,
        [karpenter_pool()],
        nodes=[gfd_node("n1", "kp")],
        claims=claims,
        nodeclaims=[{"metadata": {"name": "kp-1"}, "status": {"nodeName": "n1"}}],
        tmp_catalog=catalog_file,
    )
    compactor = Compactor(view, port, CompactorMetrics(CollectorRegistry()), 60)  # type: ignore[arg-type]
    actions = await compactor.reconcile(NOW)
    assert [(a.action, a.node, a.details) for a in actions] == [("release", "n1", {"nodeClaim": "kp-1"})]
    assert [c for c in port.calls if c[0] == "DELETE"] == [
        ("DELETE", "nodeclaims", "kp-1"),
        ("DELETE", "gpunodeclaims", "kp-1"),
    ]


def test_resources_used() -> None:
    assert {GPU_NODE_CLAIMS.plural, GPU_POOLS.plural, NODECLAIMS.plural, NODES.plural} == {
        "gpunodeclaims",
        "gpupools",
        "nodeclaims",
        "nodes",
    }


async def test_a_released_node_no_longer_counts_before_the_caches_catch_up(catalog_file: str) -> None:
    # Two empty Karpenter nodes, warm capacity for one: one is released; while the caches still show it,
    # the next pass must not take the other one too (both would be gone, and a new one bought).
    port = FakePort()
    pool = karpenter_pool(warmResources={"tflops": 50})
    claims = [
        {
            "kind": "GPUNodeClaim",
            "metadata": {"name": n, "labels": {"tensor-fusion.ai/gpupool": "kp"}},
            "spec": {},
            "status": {"phase": "Bound"},
        }
        for n in ("kp-1", "kp-2")
    ]
    nodeclaims = [{"metadata": {"name": f"kp-{i}"}, "status": {"nodeName": f"n{i}"}} for i in (1, 2)]
    view = view_of(
        port,
        [pool],
        nodes=[gfd_node("n1", "kp"), gfd_node("n2", "kp")],
        claims=claims,
        nodeclaims=nodeclaims,
        tmp_catalog=catalog_file,
    )
    compactor = Compactor(view, port, CompactorMetrics(CollectorRegistry()), 60)  # type: ignore[arg-type]
    first = await compactor.reconcile(NOW)
    assert [a.action for a in first] == ["release"]
    later = NOW + dt.timedelta(minutes=10)
    assert await compactor.reconcile(later) == []
    # and the provisioner sees the gap the release leaves only once the node is really gone
    assert view.leaving() == {first[0].node}


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

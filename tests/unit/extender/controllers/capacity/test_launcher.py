"""The Karpenter-mode launcher against fake API I/O: the claims it writes, in which order, their phases
following the NodeClaim and the node, and the events."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from extender.controllers.capacity.launcher import Launcher, LauncherMetrics
from tests.unit.fixtures.capacity import NOW, FakePort, gfd_node, karpenter_pool, view_of
from tests.unit.fixtures.capacity import catalog_file as catalog_file  # the fixture


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

"""Compaction against fake API I/O: surplus empty nodes labelled for removal, warm capacity protected, the
period respected, Karpenter-mode claims deleted, a released node no longer counted."""

from __future__ import annotations

import datetime as dt

from prometheus_client import CollectorRegistry

from extender.controllers.capacity.compactor import Compactor, CompactorMetrics
from tests.unit.fixtures.capacity import NOW, FakePort, autoselect_pool, gfd_node, karpenter_pool, view_of
from tests.unit.fixtures.capacity import catalog_file as catalog_file  # the fixture


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


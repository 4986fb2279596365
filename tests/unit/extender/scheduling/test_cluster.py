"""What Cluster.apply reports for an event: a pod's allocation starting to count, a pod gone, nothing for
objects that are not pods."""

from __future__ import annotations

from extender.scheduling.cluster import Cluster, Kind, PodChange
from extender.scheduling.requests import RequestCache
from tests.unit.fixtures.fakes import POOL, bound, gpu, pod


def cluster_with_gpu() -> Cluster:
    cluster = Cluster(RequestCache())
    cluster.apply(Kind.POOL, "ADDED", {"metadata": {"name": POOL}, "spec": {}})
    cluster.apply(Kind.GPU, "ADDED", gpu("g1", "n1"))
    return cluster


def test_apply_reports_bound_when_a_pods_allocation_starts_to_count() -> None:
    cluster = cluster_with_gpu()
    assert cluster.apply(Kind.POD, "ADDED", pod("a", "u1")) is PodChange.UNCHANGED  # pending
    assert cluster.apply(Kind.POD, "MODIFIED", bound("a", "u1", "n1", "g1")) is PodChange.BOUND
    # an older, unbound copy of the pod (a watch catching up after a read confirmed the bind): no news
    assert cluster.apply(Kind.POD, "MODIFIED", pod("a", "u1")) is PodChange.UNCHANGED
    assert cluster.ledger.bound("u1") is not None


def test_apply_reports_gone_for_a_deleted_or_finished_pod() -> None:
    cluster = cluster_with_gpu()
    cluster.apply(Kind.POD, "ADDED", bound("a", "u1", "n1", "g1"))
    assert cluster.apply(Kind.POD, "MODIFIED", bound("a", "u1", "n1", "g1") | {
        "status": {"phase": "Succeeded"}}) is PodChange.GONE
    assert cluster.apply(Kind.POD, "DELETED", pod("b", "u2")) is PodChange.GONE
    assert cluster.ledger.allocation("u1") is None


def test_apply_reports_unchanged_for_objects_that_are_not_pods() -> None:
    cluster = cluster_with_gpu()
    assert cluster.apply(Kind.GPU, "MODIFIED", gpu("g2", "n1")) is PodChange.UNCHANGED
    assert cluster.apply(Kind.NODE, "ADDED", {"metadata": {"name": "n1"}}) is PodChange.UNCHANGED


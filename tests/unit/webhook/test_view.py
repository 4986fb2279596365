"""The webhook's view of the cluster for offline use: the objects a StaticClusterView finds."""

from __future__ import annotations

from tests.unit.fixtures.webhook import JOB, NS, POOL_A, PROFILE, REPLICASET, TEMPLATE, view


def test_static_view_finds_every_fixture_object() -> None:
    v = view()
    assert v.pool("pool-a") is POOL_A and v.default_pool() is POOL_A
    assert v.profile(NS, "small") is PROFILE and v.profile("other", "small") is None
    assert v.template("tmpl") is TEMPLATE
    assert v.owner(NS, "ReplicaSet", "web-7d9f") is REPLICASET and v.owner(NS, "Job", "nightly-2890") is JOB


"""The webhook's view of the cluster for offline use: objects files (streams and lists) and what a
StaticClusterView finds in them."""

from __future__ import annotations

import pytest

from tests.unit.fixtures.webhook import JOB, NS, POOL_A, PROFILE, REPLICASET, TEMPLATE, view
from webhook.view import ObjectsError, StaticClusterView, load_objects


def test_static_view_finds_every_fixture_object() -> None:
    v = view()
    assert v.pool("pool-a") is POOL_A and v.default_pool() is POOL_A
    assert v.profile(NS, "small") is PROFILE and v.profile("other", "small") is None
    assert v.template("tmpl") is TEMPLATE
    assert v.owner(NS, "ReplicaSet", "web-7d9f") is REPLICASET and v.owner(NS, "Job", "nightly-2890") is JOB


def test_objects_from_a_stream_and_lists() -> None:
    text = """
kind: GPUPool
metadata: {name: a}
---
apiVersion: v1
kind: List
items:
- {kind: WorkloadProfile, metadata: {name: p, namespace: x}}
---
kind: GPUPoolList
items:
- metadata: {name: b}
"""
    objects = load_objects(text)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("GPUPool", "a"), ("WorkloadProfile", "p"), ("GPUPool", "b")]
    view = StaticClusterView(objects)
    assert view.pool("b") is not None and view.profile("x", "p") is not None


@pytest.mark.parametrize("text", ["[1, 2]", "kind: [", "- a\n- b", "metadata: {}"])
def test_bad_objects_files_are_reported(text: str) -> None:
    with pytest.raises(ObjectsError):
        load_objects(text)


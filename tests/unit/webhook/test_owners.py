"""The webhook's small parts: JSON Patch diff, selectors, index allocation, owner cache, objects files."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.kube.selectors import SelectorError, matches
from webhook.index import IndexAllocator
from webhook.owners import OwnerCache, owners_of
from webhook.patch import diff, escape_pointer_token
from webhook.view import ObjectsError, StaticClusterView, load_objects
from webhook.workload import label_value

# --- JSON Patch ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("token", "escaped"), [("a/b", "a~1b"), ("a~b", "a~0b"), ("~/", "~0~1"), ("x", "x")])
def test_pointer_escaping(token: str, escaped: str) -> None:
    assert escape_pointer_token(token) == escaped


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=20,
)


@given(_JSON, _JSON)
def test_diff_turns_one_document_into_the_other(before: Any, after: Any) -> None:
    assert jsonpatch.apply_patch(before, diff(before, after)) == after
    assert diff(after, after) == []


# --- selectors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        (None, {"a": "1"}, False),
        ({}, {"a": "1"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
        ({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]}, {"a": "1"},
         False),
    ],
)
def test_label_selector(selector: dict[str, Any] | None, labels: dict[str, str], expected: bool) -> None:
    assert matches(selector, labels) is expected


def test_unknown_selector_operator_is_an_error() -> None:
    with pytest.raises(SelectorError, match="Gt"):
        matches({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, {"a": "2"})


# --- index allocation ---------------------------------------------------------------------------------


def test_indices_cycle_through_1_to_128() -> None:
    allocator = IndexAllocator()
    assert [allocator.next() for _ in range(130)] == [*range(1, 129), 1, 2]


def test_indices_are_unique_across_threads() -> None:
    allocator = IndexAllocator()
    seen: list[int] = []
    lock = threading.Lock()

    def take() -> None:
        for _ in range(16):
            value = allocator.next()
            with lock:
                seen.append(value)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == list(range(1, 129))


@pytest.mark.parametrize(("start", "size"), [(0, 128), (129, 128), (1, 0), (1, 200)])
def test_allocator_rejects_bad_ranges(start: int, size: int) -> None:
    with pytest.raises(ValueError, match="must be within"):
        IndexAllocator(start, size)


# --- labels -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "value"), [("web", "web"), ("a" * 70, "a" * 63), ("-x y.", "x-y"),
                                             ("a" * 62 + "-b", "a" * 62)])
def test_label_values_are_valid(text: str, value: str) -> None:
    assert label_value(text) == value


# --- owner cache --------------------------------------------------------------------------------------


class FakeApi:
    def __init__(self, objects: dict[tuple[str, str, str], dict[str, Any]], delay: float = 0.0) -> None:
        self.objects = objects
        self.calls: list[tuple[str, str, str]] = []
        self.delay = delay

    async def fetch(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        self.calls.append((namespace, kind, name))
        await asyncio.sleep(self.delay)
        return self.objects.get((namespace, kind, name))


RS = {"kind": "ReplicaSet", "metadata": {"name": "web-1", "namespace": "ns"}}


async def test_owner_cache_gets_once_per_object_and_coalesces_concurrent_misses() -> None:
    api = FakeApi({("ns", "ReplicaSet", "web-1"): RS}, delay=0.01)
    cache = OwnerCache(api.fetch)
    results = await asyncio.gather(*[cache.get("ns", "ReplicaSet", "web-1") for _ in range(20)])
    assert results == [RS] * 20
    assert await cache.get("ns", "ReplicaSet", "web-1") is RS
    assert api.calls == [("ns", "ReplicaSet", "web-1")]


async def test_owner_cache_expires_and_remembers_missing_objects_briefly() -> None:
    now = [0.0]
    api = FakeApi({("ns", "ReplicaSet", "web-1"): RS})
    cache = OwnerCache(api.fetch, ttl=60, missing_ttl=5, clock=lambda: now[0])
    assert await cache.get("ns", "ReplicaSet", "gone") is None
    await cache.get("ns", "ReplicaSet", "web-1")
    now[0] = 4
    await cache.get("ns", "ReplicaSet", "gone")
    await cache.get("ns", "ReplicaSet", "web-1")
    assert len(api.calls) == 2
    now[0] = 10
    await cache.get("ns", "ReplicaSet", "gone")
    await cache.get("ns", "ReplicaSet", "web-1")
    assert len(api.calls) == 3
    now[0] = 61
    await cache.get("ns", "ReplicaSet", "web-1")
    assert len(api.calls) == 4


async def test_owner_cache_is_bounded_least_recently_used_first() -> None:
    api = FakeApi({})
    cache = OwnerCache(api.fetch, max_entries=2)
    for name in ("a", "b", "a", "c"):
        await cache.get("ns", "Job", name)
    assert len(cache) == 2
    await cache.get("ns", "Job", "a")  # still cached: used more recently than b
    await cache.get("ns", "Job", "b")  # evicted
    assert [call[2] for call in api.calls] == ["a", "b", "c", "b"]


async def test_owners_of_fetches_only_replicaset_and_job_owners_and_survives_errors() -> None:
    api = FakeApi({("ns", "ReplicaSet", "web-1"): RS})
    cache = OwnerCache(api.fetch)

    def pod(kind: str, name: str, api_version: str = "apps/v1") -> dict[str, Any]:
        return {"metadata": {"ownerReferences": [{"apiVersion": api_version, "kind": kind, "name": name,
                                                  "controller": True}]}}

    found = await owners_of(pod("ReplicaSet", "web-1"), "ns", cache, 1.0)
    assert found == {("ns", "ReplicaSet", "web-1"): RS}
    assert await owners_of(pod("StatefulSet", "db"), "ns", cache, 1.0) == {}
    assert await owners_of({"metadata": {}}, "ns", cache, 1.0) == {}

    async def broken(namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        raise RuntimeError("API down")

    assert await owners_of(pod("Job", "j", "batch/v1"), "ns", OwnerCache(broken), 1.0) == {}
    slow = FakeApi({}, delay=5)
    assert await owners_of(pod("Job", "j", "batch/v1"), "ns", OwnerCache(slow.fetch), 0.01) == {}


async def test_owners_of_answers_from_the_cache_without_fetching_until_the_entry_expires() -> None:
    now = [0.0]
    api = FakeApi({("ns", "ReplicaSet", "web-1"): RS})
    cache = OwnerCache(api.fetch, ttl=60, missing_ttl=5, clock=lambda: now[0])
    owned = {"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1",
                                               "controller": True}]}}
    gone = {"metadata": {"ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "gone"}]}}
    assert cache.cached("ns", "ReplicaSet", "web-1") == (False, None)
    for _ in range(3):
        assert await owners_of(owned, "ns", cache, 1.0) == {("ns", "ReplicaSet", "web-1"): RS}
        assert await owners_of(gone, "ns", cache, 1.0) == {}
    assert cache.cached("ns", "ReplicaSet", "web-1") == (True, RS)
    assert cache.cached("ns", "Job", "gone") == (True, None)
    assert len(api.calls) == 2
    now[0] = 61
    assert cache.cached("ns", "ReplicaSet", "web-1") == (False, None)
    assert await owners_of(owned, "ns", cache, 1.0) == {("ns", "ReplicaSet", "web-1"): RS}
    assert len(api.calls) == 3


# --- objects files ------------------------------------------------------------------------------------


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


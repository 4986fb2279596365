"""The owner cache: one fetch per object however many ask at once, expiry, a bound, and the owners a pod's
workload is read from."""

from __future__ import annotations

import asyncio
from typing import Any

from webhook.owners import OwnerCache, owners_of


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

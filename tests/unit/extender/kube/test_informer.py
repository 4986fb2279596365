"""The watch cache's pure logic, and its list/watch loop against a small fake API server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client

from extender.kube import informer
from extender.kube.informer import ADDED, DELETED, MODIFIED, Backoff, WatchCache
from extender.kube.resources import GPUS, PODS


def pod(name: str, rv: str, ns: str = "default", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": rv, "labels": labels}}


def test_relist_emits_deleted_added_and_modified_only_for_changes() -> None:
    old = {"default/a": pod("a", "1"), "default/b": pod("b", "2"), "default/c": pod("c", "3")}
    events = informer.relist_events(old, [pod("a", "1"), pod("b", "5"), pod("d", "6")])
    assert [(t, o["metadata"]["name"]) for t, o in events] == [(MODIFIED, "b"), (ADDED, "d"), (DELETED, "c")]
    assert events[-1][1] is old["default/c"]  # the last known object of a vanished one


@given(st.dictionaries(st.sampled_from("abcdef"), st.integers(1, 5)),
       st.dictionaries(st.sampled_from("abcdef"), st.integers(1, 5)))
def test_relist_events_turn_old_store_into_new_listing(old_rv: dict[str, int],
                                                      new_rv: dict[str, int]) -> None:
    store = {f"ns/{k}": pod(k, str(v), "ns") for k, v in old_rv.items()}
    listing = [pod(k, str(v), "ns") for k, v in new_rv.items()]
    for event_type, obj in informer.relist_events(dict(store), listing):
        informer.apply_event(store, event_type, obj)
    assert {k: o["metadata"]["resourceVersion"] for k, o in store.items()} == {
        f"ns/{k}": str(v) for k, v in new_rv.items()}


def test_apply_event_keys_namespaced_and_cluster_objects() -> None:
    store: dict[str, dict[str, Any]] = {}
    assert informer.apply_event(store, ADDED, pod("a", "1"))
    assert informer.apply_event(store, ADDED, {"metadata": {"name": "gpu-0", "resourceVersion": "1"}})
    assert set(store) == {"default/a", "gpu-0"}
    assert informer.apply_event(store, DELETED, pod("a", "2"))
    assert not informer.apply_event(store, DELETED, pod("never-seen", "3"))
    assert not informer.apply_event(store, "BOOKMARK", pod("b", "4"))
    assert set(store) == {"gpu-0"}


def _batches(chunks: list[bytes]) -> list[list[bytes]]:
    splitter = informer.LineSplitter()
    return [splitter.feed(chunk) for chunk in chunks]


def _lines(chunks: list[bytes]) -> list[bytes]:
    return [line for batch in _batches(chunks) for line in batch]


@given(st.lists(st.binary(max_size=20), max_size=20))
def test_line_splitter_recovers_every_complete_line(chunks: list[bytes]) -> None:
    data = b"".join(chunks)
    expected = [line for line in data.split(b"\n")[:-1] if line.strip()]
    assert _lines(chunks) == expected


@given(st.lists(st.sampled_from([b"\n", b"\n\n", b"{", b"}", b" ", b"ab", b"\nc\n", b"d\n"]), max_size=30))
def test_line_splitter_joins_lines_spread_over_many_chunks(chunks: list[bytes]) -> None:
    data = b"".join(chunks)
    expected = [line for line in data.split(b"\n")[:-1] if line.strip()]
    assert _lines(chunks) == expected


def test_backoff_grows_exponentially_is_capped_and_resets() -> None:
    backoff = Backoff(base=0.5, cap=4.0, jitter=0.0)
    assert [backoff.next() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    backoff.reset()
    assert backoff.next() == 0.5


@given(st.floats(0, 1), st.integers(0, 20))
def test_backoff_jitter_stays_within_bounds(r: float, attempts: int) -> None:
    backoff = Backoff(base=1.0, cap=30.0, jitter=0.2, rng=lambda: r)
    for _ in range(attempts):
        backoff.next()
    nominal = min(30.0, 2.0 ** attempts)
    assert 0.8 * nominal - 1e-9 <= backoff.next() <= 1.2 * nominal + 1e-9


BREAK: dict[str, Any] = {}


class FakeApi:
    """Serves list and watch of pods like the API server: a list, then watch streams from a version."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.list_rv = "10"
        # events, or an HTTP status; a batch ending in BREAK drops the connection mid-stream
        self.watch_batches: list[list[dict[str, Any]] | int] = []
        self.watch_queries: list[dict[str, str]] = []
        self.list_queries: list[dict[str, str]] = []
        self.hold = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        if query.get("watch") != "true":
            self.list_queries.append(query)
            return web.json_response({"kind": "PodList", "apiVersion": "v1",
                                      "metadata": {"resourceVersion": self.list_rv}, "items": self.items})
        self.watch_queries.append(query)
        batch = self.watch_batches.pop(0) if self.watch_batches else None
        if isinstance(batch, int):
            return web.json_response({"kind": "Status", "code": batch, "message": "nope"}, status=batch)
        response = web.StreamResponse()
        await response.prepare(request)
        for event in batch or []:
            if event is BREAK:
                await response.write(b'{"type": "MODIFIED", "obj')  # half an event, then a lost connection
                assert request.transport is not None
                request.transport.abort()
                return response
            await response.write(json.dumps(event).encode() + b"\n")
        if batch is None:
            await self.hold.wait()  # an idle watch
        return response


@pytest.fixture
async def api(aiohttp_server: Any) -> tuple[FakeApi, client.ApiClient]:
    fake = FakeApi()
    app = web.Application()
    app.router.add_get("/api/v1/pods", fake.handle)

    async def not_served(request: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "code": 404}, status=404)

    app.router.add_get("/apis/tensor-fusion.ai/v1/gpus", not_served)
    server = await aiohttp_server(app)
    configuration = client.Configuration()
    configuration.host = str(server.make_url("")).rstrip("/")
    return fake, client.ApiClient(configuration)


async def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_lists_then_watches_from_the_list_version_and_reports_in_order(api: Any) -> None:
    fake, api_client = api
    fake.items = [pod("a", "5", **{"tensor-fusion.ai/component": "worker"})]
    fake.watch_batches = [[
        {"type": "ADDED", "object": {"kind": "Pod", "apiVersion": "v1", **pod("b", "11")}},
        {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "12"}}},
        {"type": "MODIFIED", "object": {"kind": "Pod", "apiVersion": "v1", **pod("a", "13")}},
        {"type": "DELETED", "object": {"kind": "Pod", "apiVersion": "v1", **pod("b", "14")}},
    ]]
    seen: list[tuple[str, str, str]] = []
    cache = WatchCache(api_client, PODS, label_selector="tensor-fusion.ai/component=worker",
                       on_change=lambda t, o: seen.append((t, o["metadata"]["name"], o["kind"])))
    task = asyncio.create_task(cache.run())
    try:
        await asyncio.wait_for(cache.synced.wait(), 5)
        await wait_for(lambda: len(seen) == 4)
        assert seen == [("ADDED", "a", "Pod"), ("ADDED", "b", "Pod"), ("MODIFIED", "a", "Pod"),
                        ("DELETED", "b", "Pod")]
        assert fake.list_queries[0]["labelSelector"] == "tensor-fusion.ai/component=worker"
        first_watch = fake.watch_queries[0]
        assert first_watch["resourceVersion"] == "10"
        assert first_watch["allowWatchBookmarks"] == "true"
        assert int(first_watch["timeoutSeconds"]) <= 60
        # the next watch resumes from the last version seen, bookmark included
        await wait_for(lambda: len(fake.watch_queries) >= 2)
        assert fake.watch_queries[1]["resourceVersion"] == "14"
        assert cache.get("a", "default")["metadata"]["resourceVersion"] == "13"  # type: ignore[index]
        assert cache.get("b", "default") is None
        assert [o["metadata"]["name"] for o in cache.list()] == ["a"]
    finally:
        task.cancel()
        fake.hold.set()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_broken_watch_resumes_after_the_last_event_it_delivered(api: Any) -> None:
    fake, api_client = api
    fake.watch_batches = [[{"type": "ADDED", "object": {"kind": "Pod", "apiVersion": "v1", **pod("b", "11")}},
                           BREAK]]
    seen: list[str] = []
    cache = WatchCache(api_client, PODS, backoff=Backoff(base=0.01, cap=0.01),
                       on_change=lambda t, o: seen.append(o["metadata"]["resourceVersion"]))
    task = asyncio.create_task(cache.run())
    try:
        await wait_for(lambda: len(fake.watch_queries) >= 2)
        assert fake.watch_queries[1]["resourceVersion"] == "11"  # not the list's "10": no replay
        assert len(fake.list_queries) == 1
        assert seen == ["11"]
    finally:
        task.cancel()
        fake.hold.set()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_too_old_version_relists_and_emits_what_changed_meanwhile(api: Any) -> None:
    fake, api_client = api
    fake.items = [pod("a", "5"), pod("b", "6")]
    fake.watch_batches = [[{"type": "ERROR", "object": {
        "kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version: 10 (20)"}}]]
    seen: list[tuple[str, str]] = []
    cache = WatchCache(api_client, PODS, on_change=lambda t, o: seen.append((t, o["metadata"]["name"])))
    task = asyncio.create_task(cache.run())
    try:
        await asyncio.wait_for(cache.synced.wait(), 5)
        # meanwhile: a deleted, b changed, c created
        fake.items = [pod("b", "18"), pod("c", "19")]
        fake.list_rv = "20"
        await wait_for(lambda: len(fake.list_queries) >= 2 and len(seen) >= 5)
        assert seen == [("ADDED", "a"), ("ADDED", "b"), ("MODIFIED", "b"), ("ADDED", "c"), ("DELETED", "a")]
        await wait_for(lambda: any(q["resourceVersion"] == "20" for q in fake.watch_queries))
    finally:
        task.cancel()
        fake.hold.set()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_http_410_on_watch_relists_and_errors_back_off(api: Any) -> None:
    fake, api_client = api
    fake.watch_batches = [500, 410]
    cache = WatchCache(api_client, PODS, backoff=Backoff(base=0.01, cap=0.02))
    task = asyncio.create_task(cache.run())
    try:
        await wait_for(lambda: len(fake.list_queries) >= 2)
        assert len(fake.watch_queries) >= 2
    finally:
        task.cancel()
        fake.hold.set()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_cancel_stops_an_idle_watch_promptly(api: Any) -> None:
    fake, api_client = api
    cache = WatchCache(api_client, PODS)
    task = asyncio.create_task(cache.run())
    await asyncio.wait_for(cache.synced.wait(), 5)
    await wait_for(lambda: len(fake.watch_queries) == 1)
    task.cancel()
    async with asyncio.timeout(2):
        with pytest.raises(asyncio.CancelledError):
            await task
    fake.hold.set()


async def test_optional_resource_that_is_not_served_counts_as_synced_and_empty(api: Any) -> None:
    _, api_client = api
    cache = WatchCache(api_client, GPUS, optional=True)
    task = asyncio.create_task(cache.run())
    try:
        await asyncio.wait_for(cache.synced.wait(), 5)
        assert cache.list() == []
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_failing_callback_does_not_stop_the_cache(api: Any) -> None:
    fake, api_client = api
    fake.items = [pod("a", "1"), pod("b", "2")]

    def explode(event_type: str, obj: dict[str, Any]) -> None:
        raise RuntimeError("boom")

    cache = WatchCache(api_client, PODS, on_change=explode)
    task = asyncio.create_task(cache.run())
    try:
        await asyncio.wait_for(cache.synced.wait(), 5)
        assert len(cache.list()) == 2
    finally:
        task.cancel()
        fake.hold.set()
        with pytest.raises(asyncio.CancelledError):
            await task


@given(st.lists(st.sampled_from([b"\n", b"x", b"{}\n{}", b" \n", b"\ny\nz"]), max_size=30))
def test_line_splitter_gives_each_line_once_with_the_chunk_that_finishes_it(chunks: list[bytes]) -> None:
    for chunk, batch in zip(chunks, _batches(chunks), strict=True):
        if b"\n" not in chunk:
            assert batch == []
    expected = [line for line in b"".join(chunks).split(b"\n")[:-1] if line.strip()]
    assert _lines(chunks) == expected

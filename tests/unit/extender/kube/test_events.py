"""Events are posted in the background, folded when repeated, and never break the caller."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from kubernetes import client

from extender.kube.events import EventRecorder, involved_object

POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "train-0", "namespace": "ml", "uid": "u-1", "resourceVersion": "7"}}


class FakeEvents:
    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.patched: list[tuple[str, dict[str, Any]]] = []
        self.fail_next = False

    async def create(self, request: web.Request) -> web.Response:
        if self.fail_next:
            self.fail_next = False
            return web.json_response({"kind": "Status", "message": "etcd is sad"}, status=500)
        body = await request.json()
        assert request.match_info["ns"] == body["metadata"]["namespace"]
        self.created.append(body)
        return web.json_response(body, status=201)

    async def patch(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/merge-patch+json"
        self.patched.append((request.match_info["name"], await request.json()))
        return web.json_response({})


@pytest.fixture
async def fake(aiohttp_server: Any) -> tuple[FakeEvents, client.ApiClient]:
    events = FakeEvents()
    app = web.Application()
    app.router.add_post("/api/v1/namespaces/{ns}/events", events.create)
    app.router.add_patch("/api/v1/namespaces/{ns}/events/{name}", events.patch)
    server = await aiohttp_server(app)
    configuration = client.Configuration()
    configuration.host = str(server.make_url("")).rstrip("/")
    return events, client.ApiClient(configuration)


async def test_posts_a_core_event_about_the_object(fake: Any) -> None:
    events, api_client = fake
    recorder = EventRecorder(api_client, "tensor-fusion-extender")
    await recorder.start()
    recorder.record(POD, "GPUDeviceAllocated", "allocated GPUs g0 on node n1")
    await recorder.stop()
    [event] = events.created
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "train-0",
                                       "namespace": "ml", "uid": "u-1", "resourceVersion": "7"}
    assert event["reason"] == "GPUDeviceAllocated" and event["type"] == "Normal"
    assert event["count"] == 1 and event["firstTimestamp"] == event["lastTimestamp"]
    assert event["reportingComponent"] == "tensor-fusion-extender"
    assert event["source"] == {"component": "tensor-fusion-extender"}
    assert event["metadata"]["namespace"] == "ml"


async def test_repeats_within_the_window_fold_into_one_event(fake: Any) -> None:
    events, api_client = fake
    recorder = EventRecorder(api_client, "x")
    await recorder.start()
    for _ in range(3):
        recorder.record(POD, "GPUDeviceAllocationFailed", "no room", "Warning")
    recorder.record(POD, "GPUDeviceAllocationFailed", "another reason", "Warning")
    await recorder.stop()
    # two events (several posters: their order of creation is not fixed), the repeats patched onto the first
    assert sorted(e["message"] for e in events.created) == ["another reason", "no room"]
    folded = next(e for e in events.created if e["message"] == "no room")
    assert [p["count"] for _, p in events.patched] == [2, 3]
    assert {name for name, _ in events.patched} == {folded["metadata"]["name"]}


async def test_cluster_scoped_objects_get_events_in_default(fake: Any) -> None:
    events, api_client = fake
    recorder = EventRecorder(api_client, "x")
    await recorder.start()
    recorder.record({"kind": "Node", "metadata": {"name": "n1", "uid": "n"}}, "R", "m")
    await recorder.stop()
    assert events.created[0]["metadata"]["namespace"] == "default"
    assert "namespace" not in events.created[0]["involvedObject"]


async def test_api_failures_are_swallowed_and_later_events_still_go_out(fake: Any) -> None:
    events, api_client = fake
    events.fail_next = True
    recorder = EventRecorder(api_client, "x")
    await recorder.start()
    recorder.record(POD, "A", "first")
    for _ in range(200):  # until the API server has refused it
        if not events.fail_next:
            break
        await asyncio.sleep(0.01)
    recorder.record(POD, "B", "second")
    await recorder.stop()
    assert [e["reason"] for e in events.created] == ["B"]


async def test_record_never_blocks_or_raises_when_the_queue_is_full(fake: Any) -> None:
    _, api_client = fake
    recorder = EventRecorder(api_client, "x", max_queued=2)
    for i in range(10):
        recorder.record(POD, "R", f"m{i}")  # not started: the queue fills, extra events drop
    await asyncio.sleep(0)


def test_involved_object_defaults() -> None:
    assert involved_object({"metadata": {"name": "p"}}) == {"apiVersion": "v1", "kind": "Pod", "name": "p"}


async def test_a_slow_api_server_gets_several_posts_at_once_and_repeats_still_fold(
        aiohttp_server: Any) -> None:
    in_flight, most = 0, 0
    created: list[str] = []
    patched: list[dict[str, Any]] = []

    async def create(request: web.Request) -> web.Response:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        body = await request.json()
        created.append(body["message"])
        return web.json_response(body, status=201)

    async def patch(request: web.Request) -> web.Response:
        patched.append(await request.json())
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/api/v1/namespaces/{ns}/events", create)
    app.router.add_patch("/api/v1/namespaces/{ns}/events/{name}", patch)
    server = await aiohttp_server(app)
    configuration = client.Configuration()
    configuration.host = str(server.make_url("")).rstrip("/")
    recorder = EventRecorder(client.ApiClient(configuration), "x")
    await recorder.start()
    for i in range(8):
        recorder.record(POD, "R", f"m{i}")
    recorder.record(POD, "R", "m0")  # the same as one still being posted: folded once that one is done
    await recorder.stop(flush_timeout=5)
    assert sorted(created) == [f"m{i}" for i in range(8)]
    assert most > 1
    assert [p["count"] for p in patched] == [2]


async def test_dropped_events_are_counted_and_reported_once_per_interval(
        fake: Any, caplog: pytest.LogCaptureFixture) -> None:
    _, api_client = fake
    recorder = EventRecorder(api_client, "x", max_queued=2)
    with caplog.at_level("WARNING", logger="extender.kube.events"):
        for i in range(50):
            recorder.record(POD, "R", f"m{i}")  # not started: two queue, the rest drop
    assert recorder.dropped == 48
    assert [r.getMessage() for r in caplog.records] == ["events dropped: queue full"]

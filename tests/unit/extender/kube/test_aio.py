"""The non-blocking API client: credentials from the configuration, answers, and which failures leave a
write's outcome unknown."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes import client

from extender.kube.aio import AsyncKube, NotSent, UnknownOutcome
from extender.kube.client import ApiException, error_message, error_status
from extender.kube.pods import KubePodApi


def configuration(host: str) -> client.Configuration:
    config = client.Configuration()
    config.host = host
    config.api_key = {"authorization": "token-1"}
    config.api_key_prefix = {"authorization": "Bearer"}
    return config


async def serve(handler: Any) -> TestServer:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    server = TestServer(app)
    await server.start_server()
    return server


async def test_a_binding_is_posted_with_the_token_and_the_pods_annotations() -> None:
    seen: list[tuple[str, str, str | None, Any]] = []

    async def handler(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization")
        seen.append((request.method, request.path, auth, await request.json()))
        return web.json_response({"kind": "Status", "status": "Success"}, status=201)

    server = await serve(handler)
    kube = AsyncKube(configuration(str(server.make_url("")).rstrip("/")))
    try:
        await KubePodApi(kube).bind("ml", "a", "u1", "n1", {"tensor-fusion.ai/gpu-ids": "g1"})
    finally:
        await kube.close()
        await server.close()
    [(method, path, auth, body)] = seen
    assert (method, path, auth) == ("POST", "/api/v1/namespaces/ml/pods/a/binding", "Bearer token-1")
    assert body["metadata"] == {"name": "a", "namespace": "ml", "uid": "u1",
                                "annotations": {"tensor-fusion.ai/gpu-ids": "g1"}}
    assert body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "n1"}


def test_the_token_of_a_kubeconfig_is_sent(tmp_path: Any) -> None:
    # load_kube_config (and the in-cluster config) keep the token under "BearerToken": a ServiceAccount
    # token must not be dropped, or every bind is made as system:anonymous
    from extender.kube.client import load_api_client

    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:6443', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: sa-token}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n")
    api = load_api_client(str(path))
    assert AsyncKube.from_api_client(api)._headers(None)["Authorization"] == "Bearer sa-token"


async def test_an_error_answer_is_an_api_exception_with_the_servers_message() -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "message": 'pod a is already assigned to node "n2"'},
                                 status=409)

    server = await serve(handler)
    kube = AsyncKube(configuration(str(server.make_url("")).rstrip("/")))
    try:
        with pytest.raises(ApiException) as caught:
            await kube.request("POST", "/api/v1/namespaces/ml/pods/a/binding", body={})
    finally:
        await kube.close()
        await server.close()
    assert error_status(caught.value) == 409
    assert error_message(caught.value) == 'HTTP 409: pod a is already assigned to node "n2"'


async def test_no_answer_in_time_is_an_unknown_outcome() -> None:
    async def handler(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({})

    server = await serve(handler)
    kube = AsyncKube(configuration(str(server.make_url("")).rstrip("/")))
    try:
        with pytest.raises(UnknownOutcome):
            await kube.request("POST", "/x", body={}, timeout=0.2)
    finally:
        await kube.close()
        await server.close()


async def test_a_refused_connection_is_not_an_unknown_outcome() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kube = AsyncKube(configuration(f"http://127.0.0.1:{port}"))
    try:
        with pytest.raises(NotSent):
            await kube.request("GET", "/api/v1/namespaces/ml/pods/a", timeout=1)
    finally:
        await kube.close()


async def test_requests_share_one_keep_alive_connection() -> None:
    peers: set[Any] = set()

    async def handler(request: web.Request) -> web.Response:
        peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        return web.json_response({"ok": True})

    server = await serve(handler)
    kube = AsyncKube(configuration(str(server.make_url("")).rstrip("/")))
    try:
        for _ in range(5):
            assert await kube.request("GET", "/y") == {"ok": True}
    finally:
        await kube.close()
        await server.close()
    assert len(peers) == 1


async def test_events_go_out_through_the_async_client() -> None:
    from extender.kube.events import EventRecorder

    posted: list[tuple[str, str]] = []

    async def handler(request: web.Request) -> web.Response:
        body = await request.json()
        posted.append((request.path, body["reason"]))
        return web.json_response(body, status=201)

    server = await serve(handler)
    kube = AsyncKube(configuration(str(server.make_url("")).rstrip("/")))
    recorder = EventRecorder(client.ApiClient(), "tf-extender", kube=kube)
    await recorder.start()
    try:
        recorder.record({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "namespace": "ml",
                                                                          "uid": "u1"}},
                        "GPUDeviceAllocated", "allocated GPU g1 on node n1")
        await recorder.stop()
    finally:
        await kube.close()
        await server.close()
    assert posted == [("/api/v1/namespaces/ml/events", "GPUDeviceAllocated")]


async def test_a_server_behind_a_path_and_a_query_are_kept_in_the_request() -> None:
    seen: list[tuple[str, str, dict[str, str]]] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append((request.method, request.path, dict(request.query)))
        return web.json_response({"ok": True})

    server = await serve(handler)
    kube = AsyncKube(configuration(str(server.make_url("/k8s/clusters/c1/"))))
    try:
        await kube.request("GET", "/api/v1/namespaces/ml/pods", query={"labelSelector": "a=b,c in (d)"})
        await kube.request("DELETE", "/api/v1/namespaces/ml/pods/a", body={"kind": "DeleteOptions"})
    finally:
        await kube.close()
        await server.close()
    assert seen == [("GET", "/k8s/clusters/c1/api/v1/namespaces/ml/pods", {"labelSelector": "a=b,c in (d)"}),
                    ("DELETE", "/k8s/clusters/c1/api/v1/namespaces/ml/pods/a", {})]

"""The served process end to end against a fake API server: ready once its caches have synced, serving
(over HTTPS from the cert dir too), and stopping cleanly."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from aiohttp import web
from kubernetes import client

from extender.scheduling.state import InventorySource
from extender.service import POD_SELECTOR, ExtenderService, Settings
from tests.unit.fixtures.fakes import gpu


class FakeApiServer:
    """Just enough API server for the caches: empty lists and idle watches."""

    def __init__(self) -> None:
        self.selectors: dict[str, str] = {}
        self.stop = asyncio.Event()
        self.gpus = [gpu("g1", "n1")]

    async def collection(self, request: web.Request) -> web.StreamResponse:
        plural = request.match_info["plural"]
        if "labelSelector" in request.query:
            self.selectors[plural] = request.query["labelSelector"]
        if request.query.get("watch") == "true":
            response = web.StreamResponse()
            await response.prepare(request)
            await self.stop.wait()
            return response
        items = self.gpus if plural == "gpus" else []
        return web.json_response({"metadata": {"resourceVersion": "1"}, "items": items})


async def test_service_becomes_ready_after_sync_serves_and_stops_cleanly(aiohttp_server: Any,
                                                                          unused_tcp_port: int) -> None:
    fake = FakeApiServer()
    app = web.Application()
    app.router.add_get("/api/v1/{plural}", fake.collection)
    app.router.add_get("/apis/{group}/{version}/{plural}", fake.collection)
    server = await aiohttp_server(app)
    configuration = client.Configuration()
    configuration.host = str(server.make_url("")).rstrip("/")
    service = ExtenderService(client.ApiClient(configuration),
                              Settings(port=unused_tcp_port, inventory=InventorySource.AUTO,
                                       shutdown_timeout=2))
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    base = f"http://127.0.0.1:{unused_tcp_port}"
    try:
        async with aiohttp.ClientSession() as session, asyncio.timeout(10):
            while True:
                try:
                    async with session.get(f"{base}/readyz") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.05)
            body = {"Pod": {"metadata": {"name": "p", "namespace": "ml", "uid": "u", "annotations": {
                "tensor-fusion.ai/tflops-request": "10", "tensor-fusion.ai/vram-request": "1Gi",
                "tensor-fusion.ai/gpupool": "pool-a"}}}, "NodeNames": ["n1"]}
            async with session.post(f"{base}/scheduler/filter", data=json.dumps(body)) as response:
                assert (await response.json())["NodeNames"] == ["n1"]
            async with session.get(f"{base}/metrics") as response:
                # (not 0: filter holds the GPUs of its answer for the bind that should follow)
                gauge = 'tf_extender_node_allocated_ratio{node="n1",pool="pool-a",resource="tflops"} '
                assert gauge in await response.text()
        assert fake.selectors["pods"] == POD_SELECTOR
        assert set(service.caches) == {"nodes", "pods", "gpus", "gpupools", "schedulingconfigtemplates",
                                       "poddisruptionbudgets"}
    finally:
        stop.set()
        async with asyncio.timeout(10):
            await task
        fake.stop.set()


async def test_service_serves_https_from_the_cert_dir(aiohttp_server: Any, unused_tcp_port: int,
                                                      tmp_path: Any) -> None:
    import ssl

    from certs.authority import generate_ca, issue_serving_cert
    from certs.files import write_serving

    ca = generate_ca()
    write_serving(tmp_path, ca.cert_pem, issue_serving_cert(ca, ip_addresses=["127.0.0.1"]))
    fake = FakeApiServer()
    app = web.Application()
    app.router.add_get("/api/v1/{plural}", fake.collection)
    app.router.add_get("/apis/{group}/{version}/{plural}", fake.collection)
    server = await aiohttp_server(app)
    configuration = client.Configuration()
    configuration.host = str(server.make_url("")).rstrip("/")
    service = ExtenderService(client.ApiClient(configuration),
                              Settings(port=unused_tcp_port, cert_dir=str(tmp_path), shutdown_timeout=2))
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    trust = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    try:
        async with aiohttp.ClientSession() as session, asyncio.timeout(10):
            while True:
                try:
                    async with session.get(f"https://127.0.0.1:{unused_tcp_port}/healthz", ssl=trust) as r:
                        assert r.status == 200
                        break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.05)
    finally:
        stop.set()
        async with asyncio.timeout(10):
            await task
        fake.stop.set()


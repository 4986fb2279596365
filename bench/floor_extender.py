"""Floor (bench-only, not the product): the least a scheduler extender that binds GPU pods can do.

    python -m bench.floor_extender serve --port 8080 --kubeconfig ...   (tf-extender's arguments; others
                                                                        are ignored)

It keeps no state and places nothing: filter answers the first candidate node (so kube-scheduler skips
prioritize, as tf-extender's first-choice filter does), prioritize scores every node 0, and bind posts
the same API requests as tf-extender, through the same client code: one Binding carrying annotations of
the same keys and lengths (``gpu-ids``, ``allocated``, the pod index) and one ``GPUDeviceAllocated``
Event. What the end-to-end benchmark measures with it is the cost of the extender protocol and of
the pod contract in kube-scheduler, kube-apiserver and etcd, which no extender can avoid, plus a
bare aiohttp server and client: the best ratio any Python extender writing the allocation could reach on
this machine.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import orjson
from aiohttp import web

from bench.fixtures import gpu_name
from extender.common.contract import ALLOCATED, GPU_IDS, POD_INDEX
from extender.common.eventloop import run
from extender.kube.aio import AsyncKube
from extender.kube.client import load_api_client
from extender.kube.events import EventRecorder
from extender.kube.pods import KubePodApi

PREFIX = "/scheduler"


def _json(body: Any) -> web.Response:
    return web.Response(body=orjson.dumps(body), content_type="application/json")


class Floor:
    def __init__(self, kube: AsyncKube, recorder: EventRecorder) -> None:
        self.pods = KubePodApi(kube)
        self.recorder = recorder

    async def filter(self, request: web.Request) -> web.Response:
        args = orjson.loads(await request.read())
        names = args.get("NodeNames") or []
        return _json({"NodeNames": names[:1], "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                      "Error": ""})

    async def prioritize(self, request: web.Request) -> web.Response:
        args = orjson.loads(await request.read())
        return _json([{"Host": name, "Score": 0} for name in args.get("NodeNames") or []])

    async def bind(self, request: web.Request) -> web.Response:
        args = orjson.loads(await request.read())
        ns, name, uid, node = args["PodNamespace"], args["PodName"], args["PodUID"], args["Node"]
        gpu = gpu_name(node, 0)
        annotations = {GPU_IDS: gpu, ALLOCATED: "tflops=20,vram=4Gi", POD_INDEX: "1"}
        try:
            await self.pods.bind(ns, name, uid, node, annotations)
        except Exception as exc:
            return _json({"Error": f"bind failed: {exc}"})
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "uid": uid}}
        self.recorder.record(pod, "GPUDeviceAllocated", f"allocated GPU {gpu} on node {node}: "
                                                        "20 TFLOPS and 4Gi per GPU")
        return _json({"Error": ""})

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")


async def serve(port: int, kubeconfig: str) -> None:
    api_client = load_api_client(kubeconfig)
    kube = AsyncKube.from_api_client(api_client)
    recorder = EventRecorder(api_client, "tf-extender-floor", kube=kube)
    await recorder.start()
    floor = Floor(kube, recorder)
    app = web.Application()
    app.router.add_post(f"{PREFIX}/filter", floor.filter)
    app.router.add_post(f"{PREFIX}/prioritize", floor.prioritize)
    app.router.add_post(f"{PREFIX}/bind", floor.bind)
    app.router.add_get("/readyz", floor.ready)
    app.router.add_get("/metrics", floor.ready)  # no metrics: the benchmark reads it as none
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--kubeconfig", required=True)
    args, _ = parser.parse_known_args(argv)
    run(serve(args.port, args.kubeconfig))  # the loop tf-extender runs on (uvloop)


if __name__ == "__main__":
    main()

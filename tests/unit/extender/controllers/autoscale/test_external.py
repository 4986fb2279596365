"""The external scaler over HTTP (a real aiohttp server on loopback): the POST TensorFusion makes, the
Bearer key from the workload namespace's Secret, and every failure as an error for the condition."""

from __future__ import annotations

import base64
from typing import Any

from aiohttp import web

from extender.autoscaling.config import parse_config
from extender.controllers.autoscale.external import ask

CURRENT = {"requests": {"tflops": "10", "vram": "4Gi"}, "limits": {"tflops": "10", "vram": "4Gi"}}


def _scaler(url: str, secret: dict[str, str] | None = None):
    cfg: dict[str, Any] = {"enable": True, "url": url}
    if secret:
        cfg["apiKeySecretRef"] = secret
    parsed = parse_config({"externalScaler": cfg})
    assert parsed.external is not None, parsed.problems
    return parsed.external


async def _server(aiohttp_server, status: int = 200, body: Any = None):
    seen: list[tuple[dict[str, Any], str | None]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append((await request.json(), request.headers.get("Authorization")))
        if status != 200:
            return web.Response(status=status, text="nope")
        return web.json_response(body if body is not None else {
            "needScaleUp": True, "reason": "queue",
            "recommendedResources": {"requests": {"tflops": "20", "vram": "4Gi"},
                                     "limits": {"tflops": "20", "vram": "4Gi"}}})

    app = web.Application()
    app.router.add_post("/scale", handle)
    server = await aiohttp_server(app)
    return f"http://127.0.0.1:{server.port}/scale", seen


async def test_the_scaler_gets_the_workload_and_the_bearer_key(aiohttp_server) -> None:
    url, seen = await _server(aiohttp_server)

    async def secret(namespace: str, name: str) -> dict[str, Any] | None:
        assert (namespace, name) == ("ml", "scaler-key")
        return {"data": {"token": base64.b64encode(b"s3cret").decode()}}

    answer, error = await ask(_scaler(url, {"name": "scaler-key"}), "ml", "train", CURRENT, secret)
    assert error == "" and answer is not None and answer["needScaleUp"] is True
    assert seen == [({"workloadName": "train", "namespace": "ml", "currentResources": CURRENT},
                     "Bearer s3cret")]


async def test_a_secret_of_another_namespace_is_refused(aiohttp_server) -> None:
    url, seen = await _server(aiohttp_server)

    async def secret(namespace: str, name: str) -> dict[str, Any] | None:
        raise AssertionError("not read")

    answer, error = await ask(_scaler(url, {"name": "k", "namespace": "kube-system"}), "ml", "w", CURRENT,
                              secret)
    assert answer is None and "must be in the workload's namespace 'ml'" in error and seen == []


async def test_failures_are_errors_never_answers(aiohttp_server) -> None:
    async def none(namespace: str, name: str) -> dict[str, Any] | None:
        return None

    async def keyless(namespace: str, name: str) -> dict[str, Any] | None:
        return {"data": {"password": "eA=="}}

    url, _ = await _server(aiohttp_server, status=500)
    assert (await ask(_scaler(url), "ml", "w", CURRENT, none))[1].endswith("answered 500: nope")
    assert "not found" in (await ask(_scaler(url, {"name": "k"}), "ml", "w", CURRENT, none))[1]
    assert "has none of apiKey, token, key" in (await ask(_scaler(url, {"name": "k"}), "ml", "w", CURRENT,
                                                          keyless))[1]
    url, _ = await _server(aiohttp_server, body=["not", "an", "object"])
    assert "not an object" in (await ask(_scaler(url), "ml", "w", CURRENT, none))[1]
    answer, error = await ask(_scaler("http://127.0.0.1:9/unreachable"), "ml", "w", CURRENT, none)
    assert answer is None and error.startswith("url: http://127.0.0.1:9/unreachable: Client")

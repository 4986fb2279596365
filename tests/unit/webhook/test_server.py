"""The webhook over HTTP: /mutate with good and malformed reviews, health, readiness, metrics, HTTPS; with its
mutation cache the same answers as without it, and exactly one JSON admission line per mutation and per
denial (none for untouched pods at info)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import io
import json
import logging
import socket
import ssl
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import jsonpatch
import pytest
from aiohttp.test_utils import TestClient

from certs import authority, files
from extender.common.batched_log import BatchedLog
from tests.unit.fixtures.webhook import (
    NS,
    OBJECTS,
    POOL_A,
    PROFILE,
    REPLICASET,
    TEMPLATE,
    ClientFactory,
    ServerUnderTest,
    pod,
    post,
    review,
    static_view,
    tf,
    view,
)
from webhook import cli, server
from webhook.caches import ServingCaches
from webhook.memo import MutationCache
from webhook.owners import OwnerCache
from webhook.server import WebhookService, create_server
from webhook.view import ClusterView, KubeObject


class Ready:
    def __init__(self, ready: bool = True) -> None:
        self.value = ready

    def __call__(self) -> bool:
        return self.value


@pytest.fixture
def ready() -> Ready:
    return Ready()


@pytest.fixture
async def client(aiohttp_client: ClientFactory, ready: Ready) -> TestClient[Any, Any]:
    service = WebhookService(static_view, ready, scheduler_name="gpu-sched", request_timeout=2.0)
    server = ServerUnderTest(lambda: create_server(service, max_body_bytes=64 * 1024))
    return await aiohttp_client(server)  # type: ignore[no-any-return]


async def test_opted_in_pod_gets_a_json_patch(client: TestClient[Any, Any]) -> None:
    p = pod(tf(tflops_request="1.5"))
    status, body = await post(client, review(p))
    answer = body["response"]
    assert (status, body["kind"], answer["uid"], answer["allowed"], answer["patchType"]) == (
        200, "AdmissionReview", "uid-1", True, "JSONPatch")
    mutated = jsonpatch.apply_patch(p, json.loads(base64.b64decode(answer["patch"])))
    assert mutated["spec"]["schedulerName"] == "gpu-sched"
    assert mutated["metadata"]["annotations"]["tensor-fusion.ai/tflops-request"] == "1500m"
    assert mutated["spec"]["containers"][0]["resources"]["limits"] == {"tensor-fusion.ai/index_0": "1"}


async def test_consecutive_pods_get_round_robin_indices(client: TestClient[Any, Any]) -> None:
    indices = []
    for uid in ("a", "b"):
        _, body = await post(client, review(pod(tf(tflops_request="1")), uid=uid))
        patch = json.loads(base64.b64decode(body["response"]["patch"]))
        indices += [op["value"] for op in patch if op["path"] == "/spec/containers/0/resources"]
    assert [i["limits"] for i in indices] == [{"tensor-fusion.ai/index_0": "1"},
                                              {"tensor-fusion.ai/index_0": "2"}]


async def test_bad_pod_is_denied_with_key_and_value(client: TestClient[Any, Any]) -> None:
    status, body = await post(client, review(pod(tf(tflops_request="1", qos="urgent"))))
    answer = body["response"]
    assert (status, answer["allowed"], answer["status"]["code"]) == (200, False, 403)
    assert 'tensor-fusion.ai/qos="urgent"' in answer["status"]["message"]
    assert "patch" not in answer


@pytest.mark.parametrize(
    "request_body",
    [
        review({**pod(tf(tflops_request="bad")), "metadata": {"name": "x", "labels": {}}}),  # not opted in
        review(pod(tf(tflops_request="bad")), operation="UPDATE"),
        review(pod(tf(tflops_request="bad")), operation="DELETE"),
        review({"kind": "Deployment"}, kind="Deployment"),
    ],
    ids=["not-opted-in", "update", "delete", "not-a-pod"],
)
async def test_other_requests_pass_untouched(client: TestClient[Any, Any], request_body: Any) -> None:
    status, body = await post(client, request_body)
    assert (status, body["response"]) == (200, {"uid": "uid-1", "allowed": True})


@pytest.mark.parametrize(
    ("request_body", "needle"),
    [
        (b"{not json", "body is not JSON"),
        (b"[]", "not an AdmissionReview"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "request: Field required"),
        ({"kind": "Pod"}, "malformed admission.k8s.io/v1 AdmissionReview"),
        (b"\xff\xfe", "body is not JSON"),
    ],
)
async def test_malformed_reviews_without_uid_get_http_400(client: TestClient[Any, Any], request_body: Any,
                                                          needle: str) -> None:
    status, body = await post(client, request_body)
    assert status == 400
    assert needle in body["message"]


@pytest.mark.parametrize(
    ("request_body", "needle"),
    [
        ({**review(pod()), "kind": "Pod"}, "kind: Input should be 'AdmissionReview'"),
        ({**review(pod()), "apiVersion": "admission.k8s.io/v1beta1"}, "apiVersion"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "uid-1"}},
         "request.operation: Field required"),
        (review(None), "carries no object"),
        (review("a string"), "request.object"),
    ],
)
async def test_malformed_reviews_with_uid_get_a_denial(client: TestClient[Any, Any], request_body: Any,
                                                       needle: str) -> None:
    status, body = await post(client, request_body)
    answer = body["response"]
    assert (status, answer["uid"], answer["allowed"], answer["status"]["code"]) == (200, "uid-1", False, 400)
    assert needle in answer["status"]["message"]


# (a "br" body aiohttp refuses itself, before any handler: brotli is not installed)
@pytest.mark.parametrize(("encoding", "compress"), [("deflate", zlib.compress), ("gzip", gzip.compress),
                                                    ("x-bogus", bytes)])
async def test_compressed_reviews_are_refused_before_reading(client: TestClient[Any, Any], encoding: str,
                                                             compress: Callable[[bytes], bytes]) -> None:
    # a one-byte deflate body once left aiohttp waiting for more until the request's deadline (a 504)
    data = compress(json.dumps(review(pod())).encode())
    response = await client.post("/mutate", data=data, headers={"Content-Encoding": encoding,
                                                                 "Content-Type": "application/json"})
    body = await response.json()
    assert response.status == 400
    assert f"Content-Encoding '{encoding}' is not accepted" in body["message"]


@pytest.mark.parametrize(("method", "path", "status", "allow"), [
    ("GET", "/mutate", 405, "POST"),
    ("PUT", "/mutate", 405, "POST"),
    ("POST", "/healthz", 405, "GET, HEAD"),
    ("HEAD", "/healthz", 200, None),
    ("GET", "/mutate/", 404, None),
    ("POST", "/validate", 404, None),
    ("GET", "/", 404, None),
])
async def test_paths_and_methods_outside_the_routes_get_404_or_405(
        client: TestClient[Any, Any], method: str, path: str, status: int, allow: str | None) -> None:
    response = await client.request(method, path, data=b"{}" if method in ("POST", "PUT") else None)
    assert response.status == status
    assert response.headers.get("Allow") == allow


async def test_huge_body_is_refused(client: TestClient[Any, Any]) -> None:
    big = review(pod({"x": "y" * 100_000}))
    status, body = await post(client, big)
    assert status == 413
    assert "larger than 65536 bytes" in body["message"]


async def test_slow_lookups_time_out_with_a_denial(aiohttp_client: ClientFactory) -> None:
    async def slow(_pod: KubeObject, _namespace: str) -> ClusterView:
        await asyncio.sleep(10)
        return view()

    service = WebhookService(slow, Ready(), request_timeout=0.1)
    client = await aiohttp_client(ServerUnderTest(lambda: create_server(service)))
    status, body = await post(client, review(pod(tf(tflops_request="1"))))
    assert (status, body["response"]["allowed"], body["response"]["status"]["code"]) == (200, False, 504)
    assert "timed out after 0.1s" in body["response"]["status"]["message"]


async def test_a_body_trickled_in_too_slowly_is_a_408(aiohttp_client: ClientFactory) -> None:
    """The client's fault, answered as such: 408 naming the wait, not a 504 that reads as the webhook's."""
    service = WebhookService(static_view, Ready(), request_timeout=0.2)
    client = await aiohttp_client(ServerUnderTest(lambda: create_server(service)))
    body = json.dumps(review(pod(tf(tflops_request="1")))).encode()

    async def trickle() -> Any:
        for i in range(len(body)):
            yield body[i:i + 1]
            await asyncio.sleep(0.05)

    response = await client.post("/mutate", data=trickle(), headers={"Content-Type": "application/json"})
    assert response.status == 408
    assert "body did not arrive within 0.2s" in (await response.json())["message"]


async def test_internal_errors_become_denials(aiohttp_client: ClientFactory) -> None:
    async def broken(_pod: KubeObject, _namespace: str) -> ClusterView:
        raise RuntimeError("boom")

    service = WebhookService(broken, Ready())
    client = await aiohttp_client(ServerUnderTest(lambda: create_server(service)))
    status, body = await post(client, review(pod(tf(tflops_request="1"))))
    assert (status, body["response"]["allowed"], body["response"]["status"]["code"]) == (200, False, 500)


async def test_health_and_readiness(client: TestClient[Any, Any], ready: Ready) -> None:
    assert (await client.get("/healthz")).status == 200
    ready.value = False
    response = await client.get("/readyz")
    assert (response.status, await response.text()) == (503, "caches not synced yet")
    ready.value = True
    assert (await client.get("/readyz")).status == 200


async def test_metrics_count_outcomes_denial_reasons_and_latency(client: TestClient[Any, Any]) -> None:
    await post(client, review(pod(tf(tflops_request="1"))))
    await post(client, review(pod(tf(tflops_request="1", qos="urgent"))))
    await post(client, review(pod(tf(tflops_request="1")), operation="UPDATE"))
    await post(client, b"nope")
    response = await client.get("/metrics")
    text = await response.text()
    assert response.status == 200
    for line in ('tf_webhook_decisions_total{outcome="mutated"} 1.0',
                 'tf_webhook_decisions_total{outcome="denied"} 1.0',
                 'tf_webhook_decisions_total{outcome="skipped"} 1.0',
                 'tf_webhook_decisions_total{outcome="error"} 1.0',
                 'tf_webhook_denials_total{reason="tensor-fusion.ai/qos"} 1.0',
                 "tf_webhook_request_duration_seconds_count 4.0"):
        assert line in text


class Source:
    def __init__(self, *objects: dict[str, Any]) -> None:
        self.objects = objects

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return next((o for o in self.objects if o["metadata"]["name"] == name
                     and o["metadata"].get("namespace") == namespace), None)

    def list(self) -> list[dict[str, Any]]:
        return list(self.objects)


async def test_serving_caches_view_reads_watch_caches_and_owners(aiohttp_client: ClientFactory) -> None:
    gets: list[str] = []

    async def fetch(namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        gets.append(name)
        return REPLICASET if (namespace, kind, name) == (NS, "ReplicaSet", "web-7d9f") else None

    synced = asyncio.Event()
    caches = ServingCaches(Source(POOL_A), Source(PROFILE), Source(TEMPLATE), OwnerCache(fetch),
                           synced=[synced])
    service = WebhookService(caches.view_for, caches.ready)
    client = await aiohttp_client(ServerUnderTest(lambda: create_server(service)))
    assert (await client.get("/readyz")).status == 503
    synced.set()
    assert (await client.get("/readyz")).status == 200
    p = pod(tf(workload_profile="small"), labels={"tier": "batch"})
    p["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f",
                                         "controller": True}]
    for uid in ("a", "b", "c"):
        _, body = await post(client, review(p, uid=uid))
        mutated = jsonpatch.apply_patch(p, json.loads(base64.b64decode(body["response"]["patch"])))
        assert mutated["metadata"]["labels"]["tensor-fusion.ai/workload"] == "web"
        assert mutated["metadata"]["annotations"]["tensor-fusion.ai/qos"] == "critical"
    assert gets == ["web-7d9f"]  # one GET for three pods


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_serve_answers_over_https(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = authority.generate_ca()
    files.write_serving(tmp_path, ca.cert_pem, authority.issue_serving_cert(ca, ip_addresses=["127.0.0.1"]))
    caches = ServingCaches(Source(*[o for o in OBJECTS if o["kind"] == "GPUPool"]), Source(), Source(),
                           OwnerCache(lambda *_: asyncio.sleep(0, None)))
    monkeypatch.setattr(ServingCaches, "from_api", classmethod(lambda cls, api: caches))
    monkeypatch.setattr("extender.kube.client.load_api_client", lambda kubeconfig: object())
    port = _free_port()
    args = cli.build_parser().parse_args(["serve", "--port", str(port), "--bind-address", "127.0.0.1",
                                          "--cert-dir", str(tmp_path), "--kubeconfig", "unused"])
    task = asyncio.create_task(cli.serve(args))
    client_ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(100):
                with contextlib.suppress(aiohttp.ClientConnectionError):
                    async with session.get(f"https://127.0.0.1:{port}/healthz", ssl=client_ctx) as r:
                        assert r.status == 200
                        break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("server did not start")
            url = f"https://127.0.0.1:{port}/mutate"
            async with session.post(url, json=review(pod(tf(vram_limit="1Gi"))), ssl=client_ctx) as r:
                answer = (await r.json())["response"]
            assert answer["allowed"] is True and answer["patchType"] == "JSONPatch"
            with pytest.raises(aiohttp.ClientError):
                async with session.get(f"http://127.0.0.1:{port}/healthz") as r:  # no plain HTTP
                    await r.read()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_the_metrics_listener_serves_health_and_metrics_only(aiohttp_client: ClientFactory) -> None:
    from webhook.server import create_monitoring_server

    service = WebhookService(static_view, Ready(), scheduler_name="gpu-sched")
    monitoring = await aiohttp_client(ServerUnderTest(lambda: create_monitoring_server(service)))
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (await monitoring.get(path)).status == 200, path
    assert (await monitoring.post("/mutate", data=b"{}")).status in (404, 405)


# --- with the mutation cache and the admission log ------------------------------------------------------

REQUESTS = [
    ("a", pod(tf(tflops_request="1"))),
    ("b", pod(tf(tflops_request="1"))),  # the same workload: a cache hit, its own index
    ("c", pod(tf(tflops_request="1", qos="urgent"))),  # denied
    ("d", {**pod(), "metadata": {"name": "plain", "labels": {}}}),  # not opted in: passed untouched
    ("e", pod(tf(tflops_request="1"))),
]


async def answers(aiohttp_client: ClientFactory, cache: MutationCache | None) -> list[tuple[int, Any]]:
    service = WebhookService(static_view, lambda: True, scheduler_name="gpu-sched", mutation_cache=cache)
    client = await aiohttp_client(ServerUnderTest(lambda: create_server(service)))
    return [await post(client, review(p, uid=uid)) for uid, p in REQUESTS]


async def test_cached_service_answers_exactly_as_the_uncached_one(aiohttp_client: ClientFactory) -> None:
    cache = MutationCache()
    assert await answers(aiohttp_client, cache) == await answers(aiohttp_client, None)
    assert (cache.misses, cache.hits) == (2, 2)


@pytest.mark.parametrize("level, expected", [
    (logging.INFO, [("a", "mutated"), ("b", "mutated"), ("c", "denied"), ("e", "mutated")]),
    (logging.DEBUG,
     [("a", "mutated"), ("b", "mutated"), ("c", "denied"), ("d", "skipped"), ("e", "mutated")]),
    (logging.WARNING, []),
])
async def test_one_json_line_per_mutation_and_denial(aiohttp_client: ClientFactory, level: int,
                                                     expected: list[tuple[str, str]],
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(server, "admission_log", BatchedLog(server.log, stream))
    caplog.set_level(level, logger=server.log.name)
    await answers(aiohttp_client, MutationCache())
    server.admission_log.flush()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["uid"], line["outcome"]) for line in lines] == expected
    for line in lines:
        assert {"ts", "level", "logger", "msg", "namespace", "pod", "reason", "duration_ms"} <= set(line)
        assert (line["logger"], line["msg"]) == ("webhook.server", "admission")
    denial = [line for line in lines if line["outcome"] == "denied"]
    if denial:
        assert denial[0]["reason"] == "tensor-fusion.ai/qos" and "urgent" in denial[0]["detail"]


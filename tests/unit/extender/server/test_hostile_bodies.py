"""Every body gets an answer, never an HTTP 500: generated hostile bodies over real HTTP at every extender
verb and at the webhook's /mutate.

The servers run on loopback in a thread of their own (the production aiohttp apps, the production handlers);
the bodies go through ``http.client`` so that headers such as ``Content-Encoding`` and raw bytes reach the
server exactly as generated. Bodies: JSON nested thousands of levels deep, bare or in place of any
string-typed field of an otherwise valid message, values of the wrong type at the keys the handlers read,
strings of a megabyte, and bodies whose ``Content-Encoding`` does not match. No body gets a 5xx: a malformed
message is the caller's error.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import http.client
import itertools
import json
import logging
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.controllers.preemptor import Preemptor
from extender.scheduling.state import ClusterState, Kind
from extender.server.app import Handlers
from extender.server.app import create_app as extender_app
from extender.server.binder import Binder
from extender.server.hooks import FilterHooks
from extender.server.metrics import Metrics
from tests.unit.fixtures.fakes import POOL, Events, FakeApi, Pods, gpu
from tests.unit.fixtures.webhook import view
from webhook.server import WebhookService
from webhook.server import create_server as webhook_server
from webhook.view import ClusterView, KubeObject

# "In bounded time" is measured in CPU seconds of this process (servers and client), which other processes on
# the machine do not inflate: the slowest body alone takes about 2 s of wall time, most of it not on the CPU.
# Wall time on a machine at load 20 measures the machine; the wall bound only catches a request that hangs.
CPU_WITHIN = 5.0
ANSWER_WITHIN = 120.0
VERBS = ("filter", "prioritize", "bind", "preempt")
TARGETS = (*(f"/scheduler/{v}" for v in VERBS), "/mutate")

# keys the handlers look at, so that wrong types land where they hurt
KEYS = ["Pod", "pod", "NodeNames", "Nodes", "items", "metadata", "name", "namespace", "uid", "annotations",
        "labels", "spec", "containers", "resources", "limits", "nodeName", "priority", "PodName",
        "PodNamespace", "PodUID", "Node", "NodeNameToMetaVictims", "NodeNameToVictims", "Pods", "UID",
        "apiVersion", "kind", "request", "object", "operation", "resourceVersion", "status", "phase",
        "tensor-fusion.ai/tflops-request", "tensor-fusion.ai/gpu-ids", "tensor-fusion.ai/gpu-count",
        "tensor-fusion.ai/enabled", "tensor-fusion.ai/index_0"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=False), st.text(max_size=20),
                    st.sampled_from(["", "0", "-1", "1e309"]))
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), inner, max_size=5)),
    max_leaves=30)


def _valid(target: str) -> dict[str, Any]:
    pod = {"metadata": {"name": "p", "namespace": "ml", "uid": "u-p", "resourceVersion": "1",
                        "annotations": {"tensor-fusion.ai/tflops-request": "10",
                                        "tensor-fusion.ai/vram-request": "1Gi",
                                        "tensor-fusion.ai/gpupool": POOL}},
           "spec": {"containers": [{"name": "main"}]}}
    if target.endswith("/bind"):
        return {"PodName": "p", "PodNamespace": "ml", "PodUID": "u-p", "Node": "n1"}
    if target.endswith("/preempt"):
        return {"Pod": pod, "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "x"}]}}}
    if target == "/mutate":
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "r-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                            "operation": "CREATE", "namespace": "team",
                            "object": {**pod, "metadata": {**pod["metadata"],
                                                           "labels": {"tensor-fusion.ai/enabled": "true"}}}}}
    return {"Pod": pod, "NodeNames": ["n1", "n2"]}


# string-typed fields of a Pod that the valid messages leave out (paths below the pod)
POD_STRINGS = [("metadata", "generateName"), ("metadata", "creationTimestamp"),
               ("metadata", "deletionTimestamp"), ("metadata", "labels", "app"), ("spec", "nodeName"),
               ("spec", "schedulerName"), ("spec", "priorityClassName"), ("spec", "preemptionPolicy"),
               ("spec", "containers", 0, "image"), ("status", "phase"), ("status", "nominatedNodeName")]
DEEP = "\u0000deep\u0000"  # stands for the nested value in the encoded message


def _string_paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(value, str):
        yield path
    elif isinstance(value, dict):
        for key, child in value.items():
            yield from _string_paths(child, (*path, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _string_paths(child, (*path, i))


def string_fields(target: str) -> list[tuple[Any, ...]]:
    """Every string-typed field of the target's valid message: the ones it carries and the Pod's others."""
    message = _valid(target)
    pod_at = ("Pod",) if "Pod" in message else ("request", "object") if target == "/mutate" else None
    extra = [(*pod_at, *p) for p in POD_STRINGS] if pod_at else []
    return [*_string_paths(message), *extra]


def _set(message: Any, path: tuple[Any, ...], value: Any) -> None:
    node = message
    for key, after in itertools.pairwise(path):
        if isinstance(node, list):
            node = node[key]
            continue
        if not isinstance(node.get(key), dict | list):
            node[key] = [] if isinstance(after, int) else {}
        node = node[key]
    node[path[-1]] = value


@st.composite
def deep_in_string(draw: st.DrawFn, target: str) -> bytes:
    """A valid message with one string-typed field replaced by lists or objects nested deep."""
    message = _valid(target)
    path = draw(st.sampled_from(string_fields(target)))
    _set(message, path, DEEP)
    depth = draw(st.integers(min_value=200, max_value=5_000))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}"), ('["x",', "]")]))
    inner = opener * depth + '"1"' + closer * depth
    encoded = json.dumps(message)
    assert json.dumps(DEEP) in encoded, path
    return encoded.replace(json.dumps(DEEP), inner, 1).encode()


@st.composite
def hostile(draw: st.DrawFn, target: str) -> tuple[bytes, dict[str, str]]:
    """A body and its headers."""
    kind = draw(st.sampled_from(["deep", "deep-string", "graft", "huge", "encoding", "bytes"]))
    headers = {"Content-Type": "application/json"}
    if kind == "deep-string":
        return draw(deep_in_string(target)), headers
    if kind == "deep":
        depth = draw(st.integers(min_value=500, max_value=20_000))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}"), ('{"Pod":', "}")]))
        inner = opener * depth + "1" + closer * depth
        enveloped = draw(st.booleans())  # deep inside an otherwise valid envelope, or bare
        body = json.dumps(_valid(target)).replace('"p"', inner, 1) if enveloped else inner
        return body.encode(), headers
    if kind == "graft":  # a valid message with a wrong-typed value grafted at some key
        message = _valid(target)
        path = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=4))
        node: Any = message
        for key in path[:-1]:
            child = node.get(key) if isinstance(node, dict) else None
            if not isinstance(child, dict):
                child = {}
                node[key] = child
            node = child
        node[path[-1]] = draw(json_values)
        return json.dumps(message).encode(), headers
    if kind == "huge":
        size = draw(st.sampled_from([64 * 1024, 512 * 1024, 1024 * 1024]))
        filler = draw(st.sampled_from(["9", "x", "\u00e9", "["]))
        message = _valid(target)
        key = draw(st.sampled_from(["annotation", "name", "node"]))
        big = filler * size
        if key == "annotation" and "Pod" in message:
            message["Pod"]["metadata"]["annotations"]["tensor-fusion.ai/tflops-request"] = big
        elif key == "node" and "NodeNames" in message:
            message["NodeNames"] = [big]
        elif target == "/mutate":
            message["request"]["object"]["metadata"]["annotations"]["tensor-fusion.ai/vram-request"] = big
        else:
            message[next(iter(message))] = big
        return json.dumps(message).encode(), headers
    if kind == "encoding":
        raw = json.dumps(_valid(target)).encode()
        encoding = draw(st.sampled_from(["gzip", "deflate", "br", "x-bogus", "gzip, gzip", "zstd"]))
        how = draw(st.sampled_from(["plain", "truncated", "garbage", "bomb"]))
        if how == "truncated":
            raw = gzip.compress(raw)[: draw(st.integers(min_value=1, max_value=20))]
        elif how == "garbage":
            raw = draw(st.binary(min_size=1, max_size=200))
        elif how == "bomb":  # a small body that inflates past the size limit
            raw = _bomb(encoding == "deflate")
        return raw, {**headers, "Content-Encoding": encoding}
    return draw(st.binary(max_size=300)), headers  # bytes: not UTF-8, not JSON


@functools.cache
def _bomb(deflate: bool) -> bytes:
    inflated = b"[" * (80 * 1024 * 1024)
    return zlib.compress(inflated, 9) if deflate else gzip.compress(inflated, 9)


def _serve(make: Callable[[], web.Application | web.Server]) -> tuple[int, asyncio.AbstractEventLoop,
                                                                    threading.Thread]:
    """Serve what ``make`` builds (called on the serving thread's loop) on a free port of its own."""
    started = threading.Event()
    holder: dict[str, Any] = {}

    def run() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        async def build() -> web.BaseRunner:
            served = make()
            return (web.AppRunner(served, access_log=None) if isinstance(served, web.Application)
                    else web.ServerRunner(served))

        runner = loop.run_until_complete(build())
        loop.run_until_complete(runner.setup())
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        site = web.TCPSite(runner, "127.0.0.1", port)
        loop.run_until_complete(site.start())
        holder.update(port=port, loop=loop, runner=runner)
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(10)
    return holder["port"], holder["loop"], thread


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, int]]:
    state = ClusterState()
    state.apply(Kind.POOL, "ADDED", {"metadata": {"name": POOL}, "spec": {}})
    state.apply(Kind.GPU, "ADDED", gpu("g1", "n1"))
    pods = Pods()
    api = FakeApi(pods)
    events = Events()
    metrics = Metrics()
    binder = Binder(state, pods, api, events, metrics, settle_grace=3600)
    preemptor = Preemptor(state, api, events, metrics)
    handlers = Handlers(state, binder, metrics, unsynced=lambda: [], hooks=FilterHooks([preemptor]),
                        deadline=2.0)

    async def static_view(_pod: KubeObject, _namespace: str) -> ClusterView:
        return view()

    service = WebhookService(static_view, lambda: True, request_timeout=3.0)
    running = [_serve(lambda: extender_app(handlers)), _serve(lambda: webhook_server(service))]
    yield {"extender": running[0][0], "webhook": running[1][0]}
    for _, loop, thread in running:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def _post(port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=ANSWER_WITHIN * 2)
    try:
        connection.request("POST", path, body=body, headers={**headers, "Content-Length": str(len(body))})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@pytest.mark.parametrize("target", TARGETS)
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_bodies_get_an_answer_in_time(servers: dict[str, int], target: str, data: st.DataObject,
                                              caplog: pytest.LogCaptureFixture) -> None:
    body, headers = data.draw(hostile(target))
    port = servers["webhook" if target == "/mutate" else "extender"]
    caplog.clear()
    started, cpu_started = time.monotonic(), time.process_time()
    with caplog.at_level(logging.INFO):
        status, answer = _post(port, target, body, headers)
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu_started
    assert status < 500, (status, answer[:300])
    assert cpu < CPU_WITHIN, f"{target} took {cpu:.1f}s of CPU to answer"
    assert elapsed < ANSWER_WITHIN, f"{target} answered after {elapsed:.1f}s"
    with contextlib.suppress(ValueError):
        decoded = json.loads(answer)
        if status == 200 and target.endswith(("/filter", "/bind", "/preempt")):
            assert isinstance(decoded, dict)
    # one line per request at most, never a traceback
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("target", TARGETS)
def test_deep_nesting_in_every_string_field_is_the_callers_error(servers: dict[str, int], target: str,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Each string-typed field in turn holds lists 1,000 deep (the reported case: prioritize with such a
    ``metadata.resourceVersion`` answered 503): a 4xx, or the verb's error answer, naming the field."""
    port = servers["webhook" if target == "/mutate" else "extender"]
    for path in string_fields(target):
        message = _valid(target)
        _set(message, path, DEEP)
        body = json.dumps(message).replace(json.dumps(DEEP), "[" * 1000 + '"1"' + "]" * 1000, 1).encode()
        caplog.clear()
        with caplog.at_level(logging.INFO):
            status, answer = _post(port, target, body, {"Content-Type": "application/json"})
        assert status < 500, (path, status, answer[:300])
        assert not [r for r in caplog.records if r.exc_info], (path, [r.getMessage() for r in caplog.records])
        if target.endswith("/prioritize") or (target == "/mutate" and "response" not in answer.decode()):
            assert status == 400, (path, status, answer[:300])
        else:  # the verb's error answer, or the review's denial
            decoded = json.loads(answer)
            error = (decoded["response"]["status"]["message"] if target == "/mutate"
                     else decoded["Error"])
            assert error, (path, answer[:300])
        assert str(path[-1]).encode() in answer, (path, answer[:300])

"""Every verb over HTTP with the JSON kube-scheduler really sends, including bodies it never should."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from extender.controllers.preemptor import Preemptor
from extender.scheduling.state import ClusterState, FilterOutcome, Kind
from extender.server.app import Handlers, create_app
from extender.server.binder import Binder
from extender.server.hooks import FilterHook, FilterHooks
from extender.server.metrics import Metrics
from extender.server.protocol import ExtenderBindingArgs
from tests.unit.fixtures.fakes import POOL, Events, FakeApi, Pods, gpu


def wire_pod(name: str, uid: str, tflops: str = "20", priority: int = 0, node: str | None = None,
             gpu_ids: str | None = None) -> dict[str, Any]:
    """A pod as kube-scheduler serialises it (Go's v1.Pod JSON)."""
    annotations = {"tensor-fusion.ai/tflops-request": tflops, "tensor-fusion.ai/tflops-limit": tflops,
                   "tensor-fusion.ai/vram-request": "4Gi", "tensor-fusion.ai/vram-limit": "4Gi",
                   "tensor-fusion.ai/gpupool": POOL, "tensor-fusion.ai/gpu-count": "1"}
    if gpu_ids:
        annotations["tensor-fusion.ai/gpu-ids"] = gpu_ids
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "busybox", "resources": {
            "limits": {"tensor-fusion.ai/index_0": "1"}, "requests": {"tensor-fusion.ai/index_0": "1"}}}],
        "restartPolicy": "Always", "schedulerName": "tensor-fusion-scheduler", "priority": priority,
        "preemptionPolicy": "PreemptLowerPriority", "enableServiceLinks": True,
    }
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": uid, "resourceVersion": "101",
                     "creationTimestamp": "2025-01-01T00:00:00Z", "annotations": annotations,
                     "labels": {"tensor-fusion.ai/component": "worker", "tensor-fusion.ai/enabled": "true"}},
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending", "qosClass": "BestEffort"},
    }


def wire_node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"node-{name}", "resourceVersion": "5",
                         "labels": {"kubernetes.io/hostname": name}},
            "spec": {}, "status": {"capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                                   "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}}}


class World:
    def __init__(self) -> None:
        self.state = ClusterState()
        self.state.apply(Kind.POOL, "ADDED", {"metadata": {"name": POOL}, "spec": {}})
        self.state.apply(Kind.GPU, "ADDED", gpu("g1", "n1"))  # 100 TFLOPS, 40Gi
        self.state.apply(Kind.GPU, "ADDED", gpu("g2", "n2", tflops="30"))
        self.pods = Pods()
        self.api = FakeApi(self.pods)
        self.events = Events()
        self.metrics = Metrics()
        self.unsynced: list[str] = []
        self.binder = Binder(self.state, self.pods, self.api, self.events, self.metrics, settle_grace=3600)
        self.preemptor = Preemptor(self.state, self.api, self.events, self.metrics)
        self.handlers = Handlers(self.state, self.binder, self.metrics, unsynced=lambda: self.unsynced,
                                 hooks=FilterHooks([self.preemptor]),
                                 deadline=0.5, bind_deadline=0.5)

    def add_pod(self, pod: dict[str, Any]) -> None:
        self.pods.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = pod
        self.state.apply(Kind.POD, "ADDED", pod)


BIND_A = {"PodName": "a", "PodNamespace": "ml", "PodUID": "u-a", "Node": "n1"}


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
async def http(world: World, aiohttp_client: Any) -> TestClient[Any, Any]:
    client: TestClient[Any, Any] = await aiohttp_client(create_app(world.handlers, max_body=256 * 1024))
    return client


async def post(http: TestClient[Any, Any], verb: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with asyncio.timeout(5):
        response = await http.post(f"/scheduler/{verb}", data=data,
                                   headers={"Content-Type": "application/json"})
        return response.status, await response.json()


async def test_filter_with_node_names_answers_names_and_classifies_failures(http: Any, world: World) -> None:
    world.add_pod(wire_pod("busy", "u-busy", tflops="90", node="n1", gpu_ids="g1"))
    status, body = await post(http, "filter", {"Pod": wire_pod("a", "u-a", tflops="20"), "Nodes": None,
                                               "NodeNames": ["n1", "n2", "n3"]})
    assert status == 200
    assert body["NodeNames"] == ["n2"] and body["Nodes"] is None and body["Error"] == ""
    # with a node to go to, kube-scheduler reads no reasons: none are sent
    assert body["FailedNodes"] == {} and body["FailedAndUnresolvableNodes"] == {}
    _, body = await post(http, "filter", {"Pod": wire_pod("a", "u-a", tflops="20"), "Nodes": None,
                                          "NodeNames": ["n1", "n3"]})
    assert body["NodeNames"] == []
    assert "20 TFLOPS" in body["FailedNodes"]["n1"]  # busy: preemption could help
    assert body["FailedAndUnresolvableNodes"] == {"n3": "node has no GPUs known to the extender"}


async def test_filter_in_first_choice_mode_answers_one_node_and_holds_it(http: Any, world: World) -> None:
    world.handlers.first_choice_only = True
    world.add_pod(wire_pod("busy", "u-busy", tflops="10", node="n1", gpu_ids="g1"))
    # 15 TFLOPS fit on g1 (100, 10 used) and g2 (30): NodeCompactGPULowLoad prefers the busier node n1
    status, body = await post(http, "filter", {"Pod": wire_pod("a", "u-a", tflops="15"),
                                               "NodeNames": ["n2", "n1"]})
    assert status == 200 and body["NodeNames"] == ["n1"] and body["FailedNodes"] == {}
    # the hold: a pod filtered before a's bind arrives sees n1 with 15 TFLOPS less
    _, other = await post(http, "filter", {"Pod": wire_pod("b", "u-b", tflops="80"), "NodeNames": ["n1"]})
    assert other["NodeNames"] == [] and "80 TFLOPS" in other["FailedNodes"]["n1"]


async def test_filter_with_full_nodes_echoes_the_fitting_node_objects(http: Any) -> None:
    nodes = {"metadata": {"resourceVersion": ""},
             "items": [wire_node("n1"), wire_node("n2"), wire_node("n3")]}
    status, body = await post(http, "filter", {"Pod": wire_pod("a", "u-a", tflops="50"), "Nodes": nodes,
                                               "NodeNames": None})
    assert status == 200
    assert body["Nodes"]["items"] == [wire_node("n1")]
    assert body["NodeNames"] is None
    nodes["items"] = [wire_node("n2"), wire_node("n3")]
    _, body = await post(http, "filter", {"Pod": wire_pod("a", "u-a", tflops="50"), "Nodes": nodes,
                                          "NodeNames": None})
    assert body["Nodes"]["items"] == []
    assert "exceeds the largest GPU" in body["FailedAndUnresolvableNodes"]["n2"]


async def test_filter_reports_a_broken_request_in_error(http: Any) -> None:
    pod = wire_pod("a", "u-a")
    pod["metadata"]["annotations"]["tensor-fusion.ai/vram-request"] = "lots"
    _, body = await post(http, "filter", {"Pod": pod, "NodeNames": ["n1"]})
    assert "tensor-fusion.ai/vram-request" in body["Error"] and "lots" in body["Error"]


async def test_prioritize_gives_the_first_choice_ten_and_keeps_order(http: Any, world: World) -> None:
    world.state.apply(Kind.GPU, "ADDED", gpu("g3", "n3"))
    world.add_pod(wire_pod("half", "u-h", tflops="20", node="n3", gpu_ids="g3"))
    status, body = await post(http, "prioritize", {"Pod": wire_pod("a", "u-a", tflops="10"),
                                                   "NodeNames": ["n1", "n3", "n9"]})
    assert status == 200
    scores = {entry["Host"]: entry["Score"] for entry in body}
    assert set(body[0]) == {"Host", "Score"}
    assert scores["n3"] == 10 and 0 <= scores["n1"] < 10 and scores["n9"] == 0  # compact first


async def test_bind_commits_gpus_and_binds(http: Any, world: World) -> None:
    world.add_pod(wire_pod("a", "u-a"))
    world.state.apply(Kind.POD, "DELETED", wire_pod("a", "u-a"))  # only in the cache, not yet in state
    status, body = await post(http, "bind", BIND_A)
    assert (status, body) == (200, {"Error": ""})
    assert [c[0] for c in world.api.calls] == ["bind"]  # one write: the Binding carries the GPUs
    assert world.events.recorded[-1][1] == "GPUDeviceAllocated"
    await world.binder.drain()


async def test_bind_failure_is_an_error_answer(http: Any, world: World) -> None:
    from kubernetes.client import ApiException

    world.add_pod(wire_pod("a", "u-a"))
    world.api.fail["bind"] = ApiException(status=403, reason="Forbidden")
    _, body = await post(http, "bind", BIND_A)
    assert body["Error"].startswith("cannot bind pod ml/a to node n1")


async def test_a_hanging_bind_answers_within_the_deadline(http: Any, world: World) -> None:
    world.add_pod(wire_pod("a", "u-a"))
    world.api.gate = asyncio.Event()
    loop = asyncio.get_running_loop()
    started = loop.time()
    _, body = await post(http, "bind", BIND_A)
    assert "still in progress" in body["Error"]
    assert loop.time() - started < 2
    world.api.gate.set()
    await world.binder.drain()


async def test_preempt_answers_meta_victims_and_omits_hopeless_nodes(http: Any, world: World) -> None:
    world.add_pod(wire_pod("low", "u-low", tflops="90", priority=1, node="n1", gpu_ids="g1"))
    preemptor = wire_pod("vip", "u-vip", tflops="50", priority=1000)
    for shape in ({"NodeNameToMetaVictims": {"n1": {"Pods": [], "NumPDBViolations": 0},
                                             "n2": {"Pods": [], "NumPDBViolations": 0}}},
                  {"NodeNameToVictims": {"n1": {"Pods": [], "NumPDBViolations": 0},
                                         "n2": {"Pods": None, "NumPDBViolations": 0}}}):
        status, body = await post(http, "preempt", {"Pod": preemptor, **shape})
        assert status == 200
        assert body["NodeNameToMetaVictims"] == {"n1": {"Pods": [{"UID": "u-low"}], "NumPDBViolations": 0}}


async def test_filter_with_no_fit_queues_gpu_preemption(http: Any, world: World) -> None:
    world.add_pod(wire_pod("low", "u-low", tflops="90", priority=1, node="n1", gpu_ids="g1"))
    vip = wire_pod("vip", "u-vip", tflops="50", priority=1000)
    await post(http, "filter", {"Pod": vip, "NodeNames": ["n1"]})
    assert list(world.preemptor.queue) == ["ml/vip"]



async def test_filter_answers_an_error_while_preemption_makes_room(http: Any, world: World) -> None:
    # "No node fits" would park the pod in the scheduler's unschedulable queue with nothing to wake it when
    # the victims go; an error makes the scheduler retry with backoff.
    low = wire_pod("low", "u-low", tflops="90", priority=1, node="n1", gpu_ids="g1")
    world.add_pod(low)
    vip = wire_pod("vip", "u-vip", tflops="50", priority=1000)
    _, body = await post(http, "filter", {"Pod": vip, "NodeNames": ["n1"]})
    assert body["Error"] == "preempting lower-priority GPU pods ml/low on node n1"
    assert await world.preemptor.preempt_for(vip) == ["ml/low"]
    _, body = await post(http, "filter", {"Pod": vip, "NodeNames": ["n1"]})
    assert body["Error"] == "waiting for preempted GPU pods ml/low to terminate"
    world.state.apply(Kind.POD, "DELETED", low)
    _, body = await post(http, "filter", {"Pod": vip, "NodeNames": ["n1"]})
    assert body["Error"] == "" and body["NodeNames"] == ["n1"]

MALFORMED: list[tuple[str, bytes]] = [
    ("not json", b"{nope"),
    ("empty", b""),
    ("array", b"[]"),
    ("missing pod", json.dumps({"NodeNames": ["n1"]}).encode()),
    ("null pod", json.dumps({"Pod": None, "NodeNames": ["n1"]}).encode()),
    ("wrong type", json.dumps({"Pod": "text", "NodeNames": "n1", "NodeNameToMetaVictims": "x",
                               "PodName": 5, "Node": []}).encode()),
    ("huge", b'{"Pod": {}, "NodeNames": ["' + b"x" * (300 * 1024) + b'"]}'),
    ("not utf-8", b"\xff\xfe\x00"),
]


@pytest.mark.parametrize(("case", "data"), MALFORMED, ids=[c for c, _ in MALFORMED])
@pytest.mark.parametrize("verb", ["filter", "bind", "preempt"])
async def test_malformed_bodies_get_an_error_answer(http: Any, verb: str, case: str, data: bytes) -> None:
    if verb == "bind" and case in ("missing pod", "null pod"):
        data = json.dumps({"PodName": "a", "Node": None}).encode()
    status, body = await post(http, verb, data)
    assert status == 200
    assert body["Error"]


@pytest.mark.parametrize(("case", "data"), MALFORMED, ids=[c for c, _ in MALFORMED])
async def test_malformed_prioritize_is_a_400_with_a_message(http: Any, case: str, data: bytes) -> None:
    status, body = await post(http, "prioritize", data)
    assert status == 400 and body["error"]


async def test_before_sync_every_verb_asks_the_scheduler_to_retry(http: Any, world: World) -> None:
    world.unsynced = ["pods", "gpus"]
    pod = wire_pod("a", "u-a")
    _, body = await post(http, "filter", {"Pod": pod, "NodeNames": ["n1"]})
    assert "not ready" in body["Error"] and "pods, gpus" in body["Error"]
    assert (await post(http, "prioritize", {"Pod": pod, "NodeNames": ["n1"]}))[0] == 503
    _, body = await post(http, "bind", BIND_A)
    assert "not ready" in body["Error"]
    _, body = await post(http, "preempt", {"Pod": pod, "NodeNameToMetaVictims": {"n1": None}})
    assert body["NodeNameToMetaVictims"] == {} and "not ready" in body["Error"]
    assert world.api.calls == []
    response = await http.get("/readyz")
    assert response.status == 503
    world.unsynced = []
    assert (await http.get("/readyz")).status == 200
    leading = [False]
    world.handlers.role = lambda: "leader" if leading[0] else "standby"
    assert await (await http.get("/readyz")).text() == "ok: standby"
    leading[0] = True
    assert await (await http.get("/readyz")).text() == "ok: leader"
    assert (await http.get("/healthz")).status == 200


async def test_metrics_show_latency_outcomes_rejections_and_allocation(http: Any, world: World) -> None:
    world.add_pod(wire_pod("busy", "u-busy", tflops="60", node="n1", gpu_ids="g1"))
    await post(http, "filter", {"Pod": wire_pod("a", "u-a", tflops="50"), "NodeNames": ["n1", "n2", "n3"]})
    await post(http, "filter", b"garbage")
    world.metrics.on_scrape(lambda: world.metrics.set_utilisation([], [], 0))
    response = await http.get("/metrics")
    assert response.status == 200 and response.content_type == "text/plain"
    text = await response.text()
    assert 'tf_extender_request_duration_seconds_bucket{le="0.0005",verb="filter"}' in text
    assert 'tf_extender_requests_total{outcome="ok",verb="filter"} 1.0' in text
    assert 'tf_extender_requests_total{outcome="bad_request",verb="filter"} 1.0' in text
    assert 'tf_extender_filter_rejections_total{reason="insufficient_capacity"} 1.0' in text
    assert 'tf_extender_filter_rejections_total{reason="too_large"} 1.0' in text
    assert 'tf_extender_filter_rejections_total{reason="no_gpus"} 1.0' in text
    assert "tf_extender_partially_used_gpus 0.0" in text


async def test_prefix_is_configurable(world: World, aiohttp_client: Any) -> None:
    client = await aiohttp_client(create_app(world.handlers, prefix="/tf/"))
    response = await client.post("/tf/filter", data=json.dumps({"Pod": wire_pod("a", "u"), "NodeNames": []}))
    assert response.status == 200 and (await response.json())["NodeNames"] == []
    assert (await client.post("/scheduler/filter", data=b"{}")).status == 404


def test_app_routes() -> None:
    app = create_app(World().handlers)
    paths = {r.resource.canonical for r in app.router.routes() if isinstance(r.resource, web.Resource)}
    assert {"/scheduler/filter", "/scheduler/prioritize", "/scheduler/bind", "/scheduler/preempt",
            "/healthz", "/readyz", "/metrics"} <= paths


async def test_the_metrics_listener_serves_health_and_metrics_but_no_verb(aiohttp_client: Any,
                                                                          world: World) -> None:
    from extender.server.app import create_monitoring_app

    monitoring = await aiohttp_client(create_monitoring_app(world.handlers))
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (await monitoring.get(path)).status == 200, path
    assert (await monitoring.post("/scheduler/filter", data=b"{}")).status in (404, 405)


class _EveryVictimGuarded:
    """A PDB view in which every pod is covered by a budget that allows no disruption."""

    def protected(self, pod_key: str) -> bool:
        return True

    def violations(self, pod_keys: Any) -> int:
        return len(pod_keys)


async def test_preempt_reports_the_pdb_violations_it_cannot_avoid(aiohttp_client: Any, world: World) -> None:
    world.add_pod(wire_pod("low", "u-low", tflops="90", priority=1, node="n1", gpu_ids="g1"))
    handlers = Handlers(world.state, world.binder, world.metrics, unsynced=lambda: [],
                        pdb=_EveryVictimGuarded())
    http = await aiohttp_client(create_app(handlers))
    status, body = await post(http, "preempt", {"Pod": wire_pod("vip", "u-vip", tflops="50", priority=1000),
                                                "NodeNameToMetaVictims": {"n1": {"Pods": []}}})
    assert status == 200
    assert body["NodeNameToMetaVictims"] == {"n1": {"Pods": [{"UID": "u-low"}], "NumPDBViolations": 1}}


class _Answering(FilterHook):
    """A rule that holds for the pod wherever it goes: answers the filter, refuses the bind of pod 'a'."""

    def __init__(self) -> None:
        self.seen: list[FilterOutcome] = []

    def before_filter(self, pod: dict[str, Any], node_names: Sequence[str]) -> FilterOutcome | None:
        if pod["metadata"]["name"] != "a":
            return None
        return FilterOutcome([], {}, dict.fromkeys(node_names, "namespace ml is over its quota"), None, False)

    def after_filter(self, pod: dict[str, Any], outcome: FilterOutcome) -> None:
        self.seen.append(outcome)

    def admit(self, pod: dict[str, Any], node: str) -> str | None:
        return "namespace ml is over its quota" if pod["metadata"]["name"] == "a" else None


async def test_a_hook_answers_the_filter_and_the_others_see_its_answer(world: World,
                                                                      aiohttp_client: Any) -> None:
    hook = _Answering()
    world.handlers.hooks = FilterHooks([hook])
    http = await aiohttp_client(create_app(world.handlers))
    _, body = await post(http, "filter", {"Pod": wire_pod("a", "u-a"), "NodeNames": ["n1", "n2"]})
    assert body["NodeNames"] == [] and body["FailedAndUnresolvableNodes"] == {
        "n1": "namespace ml is over its quota", "n2": "namespace ml is over its quota"}
    assert hook.seen[-1].unresolvable == body["FailedAndUnresolvableNodes"]
    _, other = await post(http, "filter", {"Pod": wire_pod("b", "u-b"), "NodeNames": ["n1", "n2"]})
    assert other["NodeNames"] == ["n1", "n2"]  # no answer from the hook: the cluster state's


async def test_a_hook_refuses_a_bind_before_any_gpu_is_reserved(world: World) -> None:
    world.binder.hooks = FilterHooks([_Answering()])
    world.add_pod(wire_pod("a", "u-a"))
    error = await world.binder.bind(ExtenderBindingArgs.model_validate(BIND_A))
    assert error == "cannot place pod ml/a on node n1: namespace ml is over its quota"
    assert world.state.reservation("u-a") is None and world.api.calls == []

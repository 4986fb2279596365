"""``serve``'s wiring, read from the one tuple of controller packages rather than pinned names: every package
is built and run once, every watch comes from the one factory (a resource two controllers read is one
watch), one Lease gates every leader-only controller, and a new controller is its package plus its place in
the tuple. And the served process end to end against a fake API server: ready once its caches have synced,
serving (over HTTPS from the cert dir too), and stopping cleanly."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import types
from collections import Counter
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from kubernetes import client

from extender import cli
from extender.common.tasks import cancel_and_wait
from extender.controllers import LEADER_LEASE, LEGACY_LEASES, registry
from extender.controllers.runner import Reconciler
from extender.controllers.wiring import Built, Deps
from extender.kube.resources import NODECLAIMS
from extender.scheduling.state import FilterOutcome, InventorySource
from extender.server.hooks import FilterHook
from extender.service import POD_SELECTOR, ExtenderService, Settings, start
from tests.unit.fixtures.fakes import gpu

EVERYTHING = ["serve", "--write-gpu-status", "--autoscale"]  # the CLI's defaults switch the rest on


def _service(argv: list[str]) -> ExtenderService:
    configuration = client.Configuration()
    configuration.host = "http://127.0.0.1:1"
    settings = cli.settings_from_args(cli.build_parser().parse_args(argv))
    return ExtenderService(client.ApiClient(configuration), settings)


def _record_builds(monkeypatch: pytest.MonkeyPatch) -> dict[str, Built | None]:
    """What each package of the tuple returns from ``build``, by its NAME, as services are made."""
    returned: dict[str, Built | None] = {}
    for package in registry.CONTROLLERS:
        def recording(deps: Deps, settings: Any, build: Any = package.build, name: str = package.NAME) -> Any:
            returned[name] = build(deps, settings)
            return returned[name]

        monkeypatch.setattr(package, "build", recording)
    return returned


def test_every_package_of_the_tuple_is_built_and_each_controller_runs_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    returned = _record_builds(monkeypatch)
    service = _service(EVERYTHING)
    names = [name for name, _ in service.loops()]
    assert len(names) == len(set(names)), Counter(names).most_common(3)
    expected = [c.name for p in registry.CONTROLLERS if (built := returned[p.NAME]) is not None
                for c in built.controllers]
    assert [c.name for c in service.controllers] == expected
    assert set(service.parts) == {p.NAME for p in registry.CONTROLLERS}  # all on: every package is built
    # every watch of the process is one task, and the core caches (which feed the state) come first
    watches = [n for n in names if n.startswith("watch-")]
    assert watches == [f"watch-{c.name}" for c in service.informers.caches()]
    assert watches[:5] == ["watch-nodes", "watch-pods", "watch-gpupools", "watch-schedulingconfigtemplates",
                           "watch-gpus"]
    assert names[-1] == "gc-freeze" and "leader" in names


def test_a_resource_two_controllers_read_is_one_watch() -> None:
    service = _service(EVERYTHING)
    kinds = Counter((c.resource.plural, c.namespace, c.label_selector, c.field_selector)
                    for c in service.informers.caches())
    assert max(kinds.values()) == 1
    claims = service.informers.cache(NODECLAIMS)
    assert service.parts["expansion"].port.claims is claims
    assert service.parts["capacity"].view.nodeclaims is claims
    clusters = service.informers.caches()[
        [c.name for c in service.informers.caches()].index("tensorfusionclusters")]
    # the TensorFusionCluster controller and Provisioned mode (a pool's vendor) read one cluster cache
    assert service.parts["tfcluster"].clusters is clusters
    capacity = service.parts["capacity"]
    assert capacity.clusters is clusters and capacity.cloud.clusters is clusters
    assert service.parts["gpunode"].gpunodes is service.parts["capacity"].view.gpunodes


def test_one_lease_gates_every_leader_only_controller() -> None:
    service = _service(EVERYTHING)
    assert service.leadership is not None and service.runner.leader is service.leadership
    assert [k.name for k in service.leadership.keepers] == [LEADER_LEASE, *LEGACY_LEASES]
    leader_only = {c.name for c in service.controllers if c.leader_only}
    # the controllers that act on the cluster as a whole; those answering this replica's scheduler are not
    assert {"workload-autoscale", "tensorfusioncluster"} <= leader_only
    assert not {"preemptor", "scheduler-nudge", "gpu-status", "gpunodes"} & leader_only


def test_without_cluster_wide_controllers_no_leader_is_elected() -> None:
    service = _service(["serve", "--no-expansion", "--no-defrag", "--no-capacity-controllers",
                        "--no-tensorfusion-clusters", "--no-preemptor", "--no-nudge-scheduler",
                        "--no-gpu-quotas", "--no-gang-scheduling"])
    assert service.leadership is None
    assert not any(c.leader_only for c in service.controllers)
    assert "nodeclaims" not in [c.name for c in service.informers.caches()]


async def test_loops_start_as_named_tasks_and_a_crash_ends_only_its_own() -> None:
    async def crash() -> None:
        raise RuntimeError("bug")

    async def forever() -> None:
        await asyncio.Event().wait()

    tasks = start([("crash", crash), ("forever", forever)])
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert [t.get_name() for t in tasks] == ["crash", "forever"]
    assert tasks[0].done() and not tasks[1].done()
    await cancel_and_wait(tasks)
    assert tasks[1].cancelled()


class DummyHook(FilterHook):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def after_filter(self, pod: dict[str, Any], outcome: FilterOutcome) -> None:
        self.seen.append(str(pod["metadata"]["name"]))


def dummy_package() -> types.ModuleType:
    """A controller package as a new one would be written: options, settings, build."""
    package = types.ModuleType("dummy")
    package.NAME = "dummy"  # type: ignore[attr-defined]
    package.DEFAULT = None  # type: ignore[attr-defined]
    hook = DummyHook()
    passes: list[dt.datetime] = []

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument_group("dummy").add_argument("--dummy-interval", type=float, default=None)

    def from_args(args: argparse.Namespace) -> float | None:
        return args.dummy_interval

    def build(deps: Deps, interval: float | None) -> Built | None:
        if interval is None:
            return None

        async def reconcile(now: dt.datetime) -> None:
            passes.append(now)

        return Built(controllers=(Reconciler("dummy", reconcile, interval=interval, caches=deps.core.all),),
                     hooks=(hook,), part=passes)

    package.add_arguments = add_arguments  # type: ignore[attr-defined]
    package.from_args = from_args  # type: ignore[attr-defined]
    package.build = build  # type: ignore[attr-defined]
    package.hook = hook  # type: ignore[attr-defined]
    return package


async def test_a_new_controller_is_its_package_and_its_place_in_the_tuple(
        monkeypatch: pytest.MonkeyPatch, aiohttp_client: Any) -> None:
    dummy = dummy_package()
    monkeypatch.setattr(registry, "CONTROLLERS", (*registry.CONTROLLERS, dummy))
    assert "dummy" not in _service(["serve"]).parts  # switched off by default
    service = _service(["serve", "--dummy-interval", "0.01"])
    passes = service.parts["dummy"]
    (controller,) = [c for c in service.controllers if c.name == "dummy"]
    assert "dummy" in [name for name, _ in service.loops()]
    for cache in service.ready_caches:  # as if every watch had listed
        cache.synced.set()
    runner = asyncio.create_task(service.runner.run(controller))
    http: TestClient[Any, Any] = await aiohttp_client(service.app())
    try:
        pod = {"metadata": {"name": "p", "namespace": "ml", "uid": "u"}, "spec": {"containers": []}}
        response = await http.post("/scheduler/filter", json={"Pod": pod, "NodeNames": []})
        assert response.status == 200
        assert dummy.hook.seen == ["p"]  # its filter hook is called
        async with asyncio.timeout(5):
            while len(passes) < 2:  # and the runner reconciles it on its interval
                await asyncio.sleep(0.01)
    finally:
        await cancel_and_wait([runner])
        await service.kube.close()


def _design_table() -> set[tuple[str, str, bool]]:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "design.md").read_text(encoding="utf-8")
    table = text.split("<!-- controllers -->", 1)[1].split("<!-- /controllers -->", 1)[0]
    rows = set()
    for line in [row for row in table.splitlines() if row.startswith("|")][2:]:
        package, controller, leader_only = (c.strip().strip("`") for c in line.strip("|").split("|")[:3])
        rows.add((package, controller, leader_only == "yes"))
    return rows


def test_the_design_page_lists_every_controller_as_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    built = _record_builds(monkeypatch)
    _service(EVERYTHING)  # every controller a package has
    running = {(name, c.name, c.leader_only) for name, b in built.items() if b is not None
               for c in b.controllers}
    assert _design_table() == running



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


async def _served(aiohttp_server: Any) -> tuple[FakeApiServer, client.Configuration]:
    """A ``FakeApiServer`` on loopback, and a client configuration that reaches it."""
    fake = FakeApiServer()
    app = web.Application()
    app.router.add_get("/api/v1/{plural}", fake.collection)
    app.router.add_get("/apis/{group}/{version}/{plural}", fake.collection)
    server = await aiohttp_server(app)
    configuration = client.Configuration()
    configuration.host = str(server.make_url("")).rstrip("/")
    return fake, configuration


async def test_service_becomes_ready_after_sync_serves_and_stops_cleanly(aiohttp_server: Any,
                                                                          unused_tcp_port: int) -> None:
    fake, configuration = await _served(aiohttp_server)
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
        assert {c.name for c in service.ready_caches} == {
            "nodes", "pods", "gpus", "gpupools", "schedulingconfigtemplates", "poddisruptionbudgets"}
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
    fake, configuration = await _served(aiohttp_server)
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


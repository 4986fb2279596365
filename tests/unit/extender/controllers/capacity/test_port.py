"""The capacity controllers' requests, as the API server authorizes them: every request ``KubePort`` sends
while the launcher and the compactor do their work (a launch, the claims' phases, compaction in both modes,
the catalog ConfigMap, the NodeClass check) is one the shipped RBAC grants the extender's ServiceAccount.
A request it does not grant is a 403 in a real cluster: no node is bought or released, only a warning says
why."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml
from aiohttp import web
from kubernetes import client
from prometheus_client import CollectorRegistry

from extender.controllers.capacity.compactor import Compactor, CompactorMetrics
from extender.controllers.capacity.config import CapacityConfig
from extender.controllers.capacity.launcher import Launcher, LauncherMetrics
from extender.controllers.capacity.port import KubePort
from extender.planning.catalog import CONFIGMAP_KEY
from tests.unit.fixtures import ROOT
from tests.unit.fixtures.capacity import NOW, autoselect_pool, gfd_node, karpenter_pool, view_of
from tests.unit.fixtures.capacity import catalog_file as catalog_file  # the fixture
from tests.unit.fixtures.fakes import Events

# The ServiceAccount tf-extender runs as (beside kube-scheduler, in the scheduler's pod), and the RBAC the
# manifests and the chart ship for it (the chart's file is a copy: test_chart_files keeps them equal).
SERVICE_ACCOUNT = ("tensor-fusion-sys", "tensor-fusion-scheduler")
# With every feature on (the capacity controllers need the node-patch and node-delete roles); the catalog
# ConfigMap is granted by name, by the Role the chart renders for capacity.catalogConfigMap (CATALOG_ROLE).
RBAC_FILES = tuple((folder, ("rbac.yaml", "rbac-node-patch.yaml", "rbac-node-delete.yaml",
                             "rbac-tensorfusionclusters.yaml"))
                   for folder in (ROOT / "manifests", ROOT / "charts" / "tensor-fusion-extender" / "files"))
CATALOG_CONFIGMAP = "tensor-fusion-sys/gpu-catalog"
CATALOG_ROLE = [
    {"kind": "Role", "metadata": {"name": "tensor-fusion-extender-catalog", "namespace": "tensor-fusion-sys"},
     "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["gpu-catalog"],
                "verbs": ["get"]}]},
    {"kind": "RoleBinding", "metadata": {"name": "tensor-fusion-extender-catalog",
                                         "namespace": "tensor-fusion-sys"},
     "roleRef": {"kind": "Role", "name": "tensor-fusion-extender-catalog"},
     "subjects": [{"kind": "ServiceAccount", "name": "tensor-fusion-scheduler",
                   "namespace": "tensor-fusion-sys"}]}]
NODE_CLASS = "/apis/karpenter.kwok.sh/v1alpha1/kwoknodeclasses/default"


class Request:
    """One API request as kube-apiserver's authorizer sees it (its RequestInfo)."""

    def __init__(self, method: str, url: str) -> None:
        split = urlsplit(url)
        parts = split.path.strip("/").split("/")
        self.group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
        self.namespace = ""
        if rest[0] == "namespaces" and len(rest) > 2:
            self.namespace, rest = rest[1], rest[2:]
        self.resource = "/".join(rest[0:3:2])  # plural, or plural/subresource
        self.name = rest[1] if len(rest) > 1 else ""
        watch = parse_qs(split.query).get("watch") == ["true"]
        self.verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
            method, "get" if self.name else "watch" if watch else "list")

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        what = f"{self.group or 'core'}/{self.resource}"
        return " ".join(filter(None, (self.verb, what, self.name))) + where


def _objects(path: Any) -> list[dict[str, Any]]:
    return [o for o in yaml.safe_load_all(path.read_text()) if o]


def _rules_for_the_extender(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(namespace, or "" cluster-wide; rule) for every rule bound to the ServiceAccount. Built-in roles
    (system:kube-scheduler ...) are not in the file and count for nothing: the extender's rights are its
    own."""
    roles = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objects
             if o["kind"] in ("ClusterRole", "Role")}
    namespace, name = SERVICE_ACCOUNT
    for binding in objects:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and (s.get("namespace"), s["name"]) == (namespace, name)
                   for s in binding["subjects"]):
            continue
        scope = binding["metadata"].get("namespace", "")
        ref = binding["roleRef"]
        role = roles.get((ref["kind"], scope if ref["kind"] == "Role" else "", ref["name"]))
        for rule in (role or {}).get("rules", []):
            yield scope, rule


def granted(request: Request, rules: list[tuple[str, dict[str, Any]]]) -> bool:
    return any((not scope or scope == request.namespace)
               and request.group in rule.get("apiGroups", [])
               and request.resource in rule.get("resources", [])
               and request.verb in rule["verbs"]
               and (not rule.get("resourceNames") or request.name in rule["resourceNames"])
               for scope, rule in rules)


class FakeApiServer:
    """Records every request; the NodeClass and the catalog ConfigMap exist, writes succeed."""

    def __init__(self, catalog: str) -> None:
        self.requests: list[Request] = []
        self.catalog = catalog

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append(Request(request.method, request.path_qs))
        namespace, name = CATALOG_CONFIGMAP.split("/")
        if request.method == "GET" and request.path == f"/api/v1/namespaces/{namespace}/configmaps/{name}":
            return web.json_response({"kind": "ConfigMap", "data": {CONFIGMAP_KEY: self.catalog}})
        if request.method == "GET" and request.path == NODE_CLASS:
            return web.json_response({"kind": "KWOKNodeClass", "metadata": {"name": "default"}})
        if request.method == "GET" and "limit" in request.query:
            return web.json_response({"items": []})
        if request.method == "GET":
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        if request.method == "POST":
            body = await request.json()
            body["metadata"]["uid"] = f"uid-{body['metadata']['name']}"
            return web.json_response(body, status=201)
        return web.json_response({})


def _claim(name: str, phase: str, pool: str = "kp") -> dict[str, Any]:
    return {"kind": "GPUNodeClaim", "apiVersion": "tensor-fusion.ai/v1",
            "metadata": {"name": name, "labels": {"tensor-fusion.ai/gpupool": pool}},
            "spec": {}, "status": {"phase": phase}}


async def _work(port: KubePort, catalog_file: str) -> None:
    """The controllers' passes, on the real port: each write kind they make at least once."""
    config = CapacityConfig(catalog_file=catalog_file, catalog_configmap=CATALOG_CONFIGMAP,
                            protection_seconds=300)
    # a Karpenter-mode launch: GPUNodeClaim, its status, NodeClaim, the pool's condition
    view = view_of(port, [karpenter_pool(minResources={"tflops": 150})])  # type: ignore[arg-type]
    view.config = config
    await Launcher(view, port, LauncherMetrics(CollectorRegistry())).reconcile(NOW)
    # the claims' phases: a claim's node, its status, a claim whose NodeClaim is gone
    view = view_of(port, [karpenter_pool()], nodes=[gfd_node("n1", "kp")],  # type: ignore[arg-type]
                   claims=[_claim("c-pending", "Pending"), _claim("c-creating", "Creating"),
                           _claim("c-gone", "Bound")],
                   nodeclaims=[{"metadata": {"name": "c-pending"}, "status": {}},
                               {"metadata": {"name": "c-creating"}, "status": {"nodeName": "n1"}}])
    view.config = config
    await Launcher(view, port, LauncherMetrics(CollectorRegistry())).sync_claims()
    # AutoSelect compaction: a node unprotected and released, another protected (Node patches)
    nodes = [gfd_node("b", "auto"), gfd_node("a", "auto", annotations={
        "karpenter.sh/do-not-disrupt": "true", "tensor-fusion.ai/protected-by-compaction": "x"})]
    view = view_of(port, [autoselect_pool(warmResources={"tflops": 70})], nodes=nodes)  # type: ignore[arg-type]
    view.config = config
    await Compactor(view, port, CompactorMetrics(CollectorRegistry()), 60).reconcile(NOW)
    # Karpenter-mode compaction: the NodeClaim and the GPUNodeClaim deleted
    view = view_of(port, [karpenter_pool()], nodes=[gfd_node("n1", "kp")],  # type: ignore[arg-type]
                   claims=[_claim("kp-1", "Bound")],
                   nodeclaims=[{"metadata": {"name": "kp-1"}, "status": {"nodeName": "n1"}}])
    view.config = config
    await Compactor(view, port, CompactorMetrics(CollectorRegistry()), 60).reconcile(NOW)


async def test_every_request_of_the_capacity_controllers_is_granted_by_the_shipped_rbac(
        aiohttp_server: Any, catalog_file: str) -> None:
    with open(catalog_file, encoding="utf-8") as handle:
        fake = FakeApiServer(handle.read())
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    server = await aiohttp_server(app)
    configuration = client.Configuration()
    configuration.host = str(server.make_url("")).rstrip("/")
    api_client = client.ApiClient(configuration)
    try:
        await _work(KubePort(api_client, Events()), catalog_file)  # type: ignore[arg-type]
    finally:
        api_client.close()

    for folder, names in RBAC_FILES:
        objects = [o for name in names for o in _objects(folder / name)] + CATALOG_ROLE
        rules = list(_rules_for_the_extender(objects))
        denied = sorted({str(r) for r in fake.requests if not granted(r, rules)})
        assert not denied, f"{folder.relative_to(ROOT)} does not grant the extender: {denied}"
    # what the passes asked for, so that "all granted" is not said of nothing
    made = {(r.verb, r.group, r.resource) for r in fake.requests}
    assert made == {
        ("get", "", "configmaps"),
        ("get", "karpenter.kwok.sh", "kwoknodeclasses"),
        ("list", "karpenter.sh", "nodeclaims"),
        ("create", "tensor-fusion.ai", "gpunodeclaims"),
        ("patch", "tensor-fusion.ai", "gpunodeclaims"),
        ("patch", "tensor-fusion.ai", "gpunodeclaims/status"),
        ("delete", "tensor-fusion.ai", "gpunodeclaims"),
        ("create", "karpenter.sh", "nodeclaims"),
        ("delete", "karpenter.sh", "nodeclaims"),
        ("patch", "tensor-fusion.ai", "gpupools/status"),
        ("patch", "", "nodes"),
    }, "the passes' requests changed: check the scenario still makes each write, and the RBAC grants it"

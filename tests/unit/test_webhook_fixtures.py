"""Shared objects for the webhook tests (pools, a profile, a template, owners), imported by the other
test_webhook_* modules, and a check that the offline view finds them."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.test_utils import BaseTestServer

from webhook.view import StaticClusterView

NS = "team"
SCHEDULER = "tensor-fusion-scheduler"
ENABLED = {"tensor-fusion.ai/enabled": "true"}

POOL_A = {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool",
          "metadata": {"name": "pool-a", "annotations": {"tensor-fusion.ai/is-default-pool": "true"}},
          "spec": {"schedulingConfigTemplate": "tmpl"}}
POOL_B = {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool", "metadata": {"name": "pool-b"},
          "spec": {"qosConfig": {"defaultQoS": "low"}}}
TEMPLATE = {
    "apiVersion": "tensor-fusion.ai/v1", "kind": "SchedulingConfigTemplate", "metadata": {"name": "tmpl"},
    "spec": {"verticalScalingRules": [
        {"name": "disabled", "selector": {"matchLabels": {"tier": "batch"}},
         "autoScaling": {"autoSetResources": {"enable": False}}},
        {"name": "batch", "selector": {"matchLabels": {"tier": "batch"}},
         "autoScaling": {"autoSetResources": {"enable": True, "targetResource": "vram"}}},
        {"name": "in",
         "selector": {"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}]},
         "autoScaling": {"autoSetResources": {"enable": True, "targetResource": "compute"}}},
        {"name": "notin-exists", "selector": {"matchExpressions": [
            {"key": "env", "operator": "NotIn", "values": ["prod"]},
            {"key": "scale", "operator": "Exists"},
            {"key": "frozen", "operator": "DoesNotExist"}]},
         "autoScaling": {"autoSetResources": {"enable": True}}},
        {"name": "bad-target", "selector": {"matchLabels": {"tier": "broken"}},
         "autoScaling": {"autoSetResources": {"enable": True, "targetResource": "gpu"}}},
    ]},
}
PROFILE = {"apiVersion": "tensor-fusion.ai/v1", "kind": "WorkloadProfile",
           "metadata": {"name": "small", "namespace": NS},
           "spec": {"resources": {"requests": {"tflops": "5", "vram": "2Gi"},
                                  "limits": {"tflops": "10", "vram": "4Gi"}},
                    "qos": "critical",
                    "autoScalingConfig": {"autoSetResources": {"enable": True, "targetResource": "compute"}}}}
REPLICASET = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {
    "name": "web-7d9f", "namespace": NS,
    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "controller": True}]}}
BARE_REPLICASET = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                   "metadata": {"name": "bare", "namespace": NS}}
JOB = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
    "name": "nightly-2890", "namespace": NS,
    "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly",
                         "controller": True}]}}

OBJECTS: list[dict[str, Any]] = [POOL_A, POOL_B, TEMPLATE, PROFILE, REPLICASET, BARE_REPLICASET, JOB]


def view(*objects: dict[str, Any]) -> StaticClusterView:
    return StaticClusterView(objects or OBJECTS, default_namespace=NS)


def pod(annotations: dict[str, str] | None = None, *, labels: dict[str, str] | None = None,
        containers: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "namespace": NS, "labels": {**ENABLED, **(labels or {})}}
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"containers": copy.deepcopy(containers or [{"name": "main", "image": "cuda"}]), **spec}}


def tf(**annotations: str) -> dict[str, str]:
    return {f"tensor-fusion.ai/{k.replace('_', '-')}": v for k, v in annotations.items()}


class ServerUnderTest(BaseTestServer):
    """A test server around a ``web.Server`` factory such as ``webhook.server.create_server``: the same
    low-level server (request factory included) that ``tf-webhook serve`` runs. The factory is called on
    the test's event loop."""

    def __init__(self, make: Callable[[], web.Server], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._make = make

    async def _make_runner(self, **kwargs: Any) -> web.ServerRunner:
        return web.ServerRunner(self._make())


def test_static_view_finds_every_fixture_object() -> None:
    v = view()
    assert v.pool("pool-a") is POOL_A and v.default_pool() is POOL_A
    assert v.profile(NS, "small") is PROFILE and v.profile("other", "small") is None
    assert v.template("tmpl") is TEMPLATE
    assert v.owner(NS, "ReplicaSet", "web-7d9f") is REPLICASET and v.owner(NS, "Job", "nightly-2890") is JOB

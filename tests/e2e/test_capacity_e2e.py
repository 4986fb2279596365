"""Karpenter provisioning mode and compaction against the real Karpenter (KWOK provider).

The pools' capacity targets, not pending pods, decide when nodes come and go: the extender creates a
GPUNodeClaim and a Karpenter NodeClaim of the cheapest instance type (or two-type mix) from its catalog,
Karpenter launches it, kwok makes the Node Ready. The catalog (a ConfigMap) lists exactly the instance
types Karpenter's instance-type file offers, at the same prices. The extender runs with a 20 s node
protection time instead of 5 minutes, reconciles every second and compacts each pool every 5 s.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests import harness as cpl
from tests.harness.karpenter import INSTANCE_TYPE, ZONE, InstanceType, Karpenter, karpenter_fixture

pytestmark = pytest.mark.e2e

INSTANCE_TYPES = (
    InstanceType("gpu-a100-1", gpus=1, price=1.0, zones=("zone-a",)),
    InstanceType("gpu-a100-4", gpus=4, cpu="64", memory="256Gi", price=3.0, zones=("zone-a",)),
)
karpenter = karpenter_fixture(instance_types=INSTANCE_TYPES)

A100 = 312  # TFLOPS of one "A100 80GB" in the extender's GPU model table
CATALOG_CONFIGMAP = "tf-e2e-catalog"
CATALOG = {"replaceDefaults": True, "instanceTypes": [
    {"name": it.name, "gpuModel": "A100 80GB", "gpuCount": it.gpus, "vramPerGPU": "80Gi",
     "prices": {"on-demand": it.price}} for it in INSTANCE_TYPES]}
PROTECTION_SECONDS = 20
KARPENTER_API = ("karpenter.sh", "v1")
POOL_LABEL = "tensor-fusion.ai/gpupool"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
SHOULD_DELETE = "tensor-fusion.ai/should-delete"
NO_FINALIZERS: dict[str, Any] = {"metadata": {"finalizers": None}}
NODE_CLASS_REF = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "version": "v1alpha1",
                  "name": "default"}


@pytest.fixture(scope="module")
def catalog(api_client: Any, webhook: Any) -> Iterator[str]:
    core = client.CoreV1Api(api_client)
    body = {"metadata": {"name": CATALOG_CONFIGMAP, "namespace": cpl.PROJECT_NAMESPACE},
            "data": {"catalog.yaml": yaml.safe_dump(CATALOG)}}
    with contextlib.suppress(ApiException):
        core.delete_namespaced_config_map(CATALOG_CONFIGMAP, cpl.PROJECT_NAMESPACE)
    core.create_namespaced_config_map(cpl.PROJECT_NAMESPACE, body)
    yield f"{cpl.PROJECT_NAMESPACE}/{CATALOG_CONFIGMAP}"
    with contextlib.suppress(ApiException):
        core.delete_namespaced_config_map(CATALOG_CONFIGMAP, cpl.PROJECT_NAMESPACE)


@pytest.fixture
def capacity(cluster: Any, webhook: Any, extender_runner: cpl.ExtenderRunner, karpenter: Karpenter,
             catalog: str) -> cpl.ExtenderRunner:
    extender_runner.ensure(capacity_interval=1, node_protection_time=PROTECTION_SECONDS,
                           catalog_configmap=catalog)
    return extender_runner


class Claims:
    """The pool's GPUNodeClaims and NodeClaims, and every phase each GPUNodeClaim went through (a watch)."""

    def __init__(self, api_client: Any) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.phases: dict[str, list[str]] = {}
        self._stop = threading.Event()
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                for event in self._watch.stream(self.custom.list_cluster_custom_object, cpl.TF_GROUP,
                                                cpl.TF_VERSION, "gpunodeclaims", timeout_seconds=30):
                    obj = event["object"]
                    phase = ((obj.get("status") or {}).get("phase")) or "Pending"
                    seen = self.phases.setdefault(obj["metadata"]["name"], [])
                    if not seen or seen[-1] != phase:
                        seen.append(phase)
                    if self._stop.is_set():
                        return

    def stop(self) -> None:
        self._stop.set()
        self._watch.stop()

    def gpunodeclaims(self, pool: str) -> list[dict[str, Any]]:
        items = self.custom.list_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION, "gpunodeclaims",
                                                       label_selector=f"{POOL_LABEL}={pool}")["items"]
        return sorted(items, key=lambda c: c["spec"]["instanceType"] + c["metadata"]["name"])

    def nodeclaims(self, pool: str) -> list[dict[str, Any]]:
        return self.custom.list_cluster_custom_object(*KARPENTER_API, "nodeclaims",
                                                      label_selector=f"{POOL_LABEL}={pool}")["items"]

    def nodes(self, pool: str) -> list[Any]:
        return self.core.list_node(label_selector=f"{POOL_LABEL}={pool}").items

    def bound(self, pool: str, count: int) -> list[dict[str, Any]] | None:
        claims = self.gpunodeclaims(pool)
        done = [c for c in claims if (c.get("status") or {}).get("phase") == "Bound"]
        return claims if len(done) == count == len(claims) else None

    def offered_tflops(self, pool: str) -> float:
        return sum(float(c["spec"]["tflopsOffered"]) for c in self.gpunodeclaims(pool))


@pytest.fixture
def claims(api_client: Any) -> Iterator[Claims]:
    watcher = Claims(api_client)
    yield watcher
    watcher.stop()


def pool_events(api_client: Any, pool: str, reason: str) -> list[Any]:
    return [e for e in client.CoreV1Api(api_client).list_namespaced_event(
        "default", field_selector=f"involvedObject.kind=GPUPool,involvedObject.name={pool}").items
        if e.reason == reason]


def node_events(api_client: Any, reason: str) -> list[Any]:
    return [e for e in client.CoreV1Api(api_client).list_namespaced_event(
        "default", field_selector=f"involvedObject.kind=Node,reason={reason}").items]


@pytest.fixture
def make_pool(api_client: Any, webhook: Any, karpenter: Karpenter) -> Iterator[Callable[..., str]]:
    """make_pool(mode, min=, warm=, max=, requirements=, node_class=) -> a GPUPool of that provisioning mode
    with a 5 s compaction period; at teardown the pool goes first (nothing more is bought), then its claims
    and nodes."""
    custom = client.CustomObjectsApi(api_client)
    made: list[str] = []

    def factory(mode: str = "Karpenter", *, min_tflops: int | None = None, warm_tflops: int | None = None,
                max_tflops: int | None = None, instance_types: tuple[str, ...] | None = None,
                node_class: str = "default", period: str = "5s") -> str:
        name = f"cap-{uuid.uuid4().hex[:6]}"
        capacity = {key: {"tflops": str(value)} for key, value in (
            ("minResources", min_tflops), ("warmResources", warm_tflops), ("maxResources", max_tflops))
            if value is not None}
        requirements = [{"key": ZONE, "operator": "In", "values": ["zone-a"]}]
        if instance_types:
            requirements.append({"key": INSTANCE_TYPE, "operator": "In", "values": list(instance_types)})
        manager: dict[str, Any] = {"provisioningMode": mode, "nodeCompaction": {"period": period}}
        if mode == "Karpenter":
            manager["nodeProvisioner"] = {"karpenterNodeClassRef": {**NODE_CLASS_REF, "name": node_class},
                                          "gpuRequirements": requirements, "gpuNodeLabels": {"team": "ml"}}
        cpl.create_cluster_object(api_client, "gpupools", {
            "apiVersion": f"{cpl.TF_GROUP}/{cpl.TF_VERSION}", "kind": "GPUPool", "metadata": {"name": name},
            "spec": {"capacityConfig": capacity, "nodeManagerConfig": manager}})
        made.append(name)
        cpl.wait_for_webhook_pool(api_client, name)
        return name

    yield factory
    core = client.CoreV1Api(api_client)
    for name in made:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION, "gpupools", name)
        selector = f"{POOL_LABEL}={name}"
        for claim in custom.list_cluster_custom_object(*KARPENTER_API, "nodeclaims",
                                                       label_selector=selector)["items"]:
            with contextlib.suppress(ApiException):
                custom.delete_cluster_custom_object(*KARPENTER_API, "nodeclaims", claim["metadata"]["name"])
        for claim in custom.list_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION, "gpunodeclaims",
                                                       label_selector=selector)["items"]:
            with contextlib.suppress(ApiException):
                custom.delete_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION, "gpunodeclaims",
                                                    claim["metadata"]["name"])
        try:
            cpl.wait_until(lambda s=selector: not core.list_node(label_selector=s).items
                           and not custom.list_cluster_custom_object(*KARPENTER_API, "nodeclaims",
                                                                     label_selector=s)["items"],
                           90, interval=1, what=f"the nodes of pool {name} gone")
        except TimeoutError:  # Karpenter could not finish: strip its finalizers so the next test starts clean
            for claim in custom.list_cluster_custom_object(*KARPENTER_API, "nodeclaims",
                                                           label_selector=selector)["items"]:
                with contextlib.suppress(ApiException):
                    custom.patch_cluster_custom_object(*KARPENTER_API, "nodeclaims",
                                                       claim["metadata"]["name"], NO_FINALIZERS)
            for node in core.list_node(label_selector=selector).items:
                with contextlib.suppress(ApiException):
                    core.patch_node(node.metadata.name, NO_FINALIZERS)
                    core.delete_node(node.metadata.name)


def stays(predicate: Callable[[], bool], seconds: float) -> bool:
    """``predicate`` holds at every check for ``seconds`` (a stability check, not a wait)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not predicate():
            return False
        time.sleep(0.5)
    return True


# --- Karpenter provisioning mode ------------------------------------------------------------------------


def test_min_resources_grow_an_empty_pool_to_the_cheapest_mix(api_client, capacity, make_pool, claims):
    # 5 GPUs' worth: 1 x gpu-a100-4 + 1 x gpu-a100-1 costs 4.0/h, 5 x gpu-a100-1 5.0, 2 x gpu-a100-4 6.0.
    pool = make_pool(min_tflops=5 * A100)
    bound = cpl.wait_until(lambda: claims.bound(pool, 2), 120, interval=0.5, what="two Bound GPUNodeClaims")
    assert [c["spec"]["instanceType"] for c in bound] == ["gpu-a100-1", "gpu-a100-4"]
    assert [c["metadata"]["annotations"]["tensor-fusion.ai/hourly-pricing"] for c in bound] == ["1", "3"]
    for claim in bound:
        name = claim["metadata"]["name"]
        assert claims.phases[name] == ["Pending", "Creating", "Bound"]
        assert claim["metadata"]["ownerReferences"][0]["kind"] == "GPUPool"
        nodeclaim = claims.custom.get_cluster_custom_object(*KARPENTER_API, "nodeclaims", name)
        assert nodeclaim["metadata"]["annotations"][DO_NOT_DISRUPT] == "true"
        assert nodeclaim["metadata"]["ownerReferences"][0]["name"] == name
        requirements = {r["key"]: r["values"] for r in nodeclaim["spec"]["requirements"]}
        assert requirements[INSTANCE_TYPE] == [claim["spec"]["instanceType"]]
        assert requirements[ZONE] == ["zone-a"]
        assert requirements["karpenter.sh/capacity-type"] == ["on-demand"]
        node = claims.core.read_node(claim["spec"]["nodeName"])  # Karpenter launched it, kwok runs it
        assert node.metadata.labels[INSTANCE_TYPE] == claim["spec"]["instanceType"]
        assert node.metadata.labels["team"] == "ml" and node.metadata.labels[POOL_LABEL] == pool
    assert stays(lambda: len(claims.gpunodeclaims(pool)) == 2, 6)  # the minimum holds: nothing more is bought
    cpl.wait_until(lambda: pool_events(api_client, pool, "GPUNodeClaimCreated"), 30,
                   what="the GPUNodeClaimCreated event")


def test_filling_past_warm_adds_a_node_and_emptying_removes_the_surplus(api_client, capacity, make_pool,
                                                                        claims, namespace):
    pool = make_pool(warm_tflops=200, instance_types=("gpu-a100-1",))
    first = cpl.wait_until(lambda: claims.bound(pool, 1), 120, interval=0.5, what="the warm node")
    pod = cpl.gpu_pod_body("worker", pool=pool, tflops="150", vram="10Gi")
    cpl.create_pod(api_client, namespace, pod)
    node = cpl.wait_for_pod_bound(api_client, namespace, "worker", timeout=60).spec.node_name
    assert node == first[0]["spec"]["nodeName"]
    # 312 - 150 = 162 TFLOPS free < 200 warm: one more node
    both = cpl.wait_until(lambda: claims.bound(pool, 2), 120, interval=0.5, what="a second node for warm")
    assert stays(lambda: len(claims.gpunodeclaims(pool)) == 2, 4)

    client.CoreV1Api(api_client).delete_namespaced_pod("worker", namespace, grace_period_seconds=0)
    cpl.wait_for_pod_gone(api_client, namespace, "worker")
    # 624 free, 200 warm: one node is surplus; it goes once older than the protection time.
    cpl.wait_until(lambda: len(claims.nodeclaims(pool)) == 1 and len(claims.gpunodeclaims(pool)) == 1
                   and len(claims.nodes(pool)) == 1, 180, interval=0.5, what="the surplus node removed")
    (left,) = claims.gpunodeclaims(pool)
    (gone,) = [c for c in both if c["metadata"]["name"] != left["metadata"]["name"]]
    age = dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(gone["metadata"]["creationTimestamp"])
    assert age.total_seconds() >= PROTECTION_SECONDS
    released = [e for e in node_events(api_client, "CompactionRelease") if pool in e.message]
    assert len(released) == 1 and f"deleting NodeClaim {gone['metadata']['name']}" in released[0].message
    assert stays(lambda: len(claims.nodes(pool)) == 1 and len(claims.gpunodeclaims(pool)) == 1, 8)


def test_a_pending_pod_is_demand_a_pool_without_targets_grows_for_it(api_client, capacity, make_pool, claims,
                                                                    namespace):
    pool = make_pool(instance_types=("gpu-a100-1", "gpu-a100-4"))
    assert stays(lambda: not claims.gpunodeclaims(pool), 3)  # no targets: nothing bought ahead of time
    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("needs-one", pool=pool, tflops="100", vram="10Gi"))
    (claim,) = cpl.wait_until(lambda: claims.bound(pool, 1), 120, interval=0.5, what="a node for the pod")
    assert claim["spec"]["instanceType"] == "gpu-a100-1"  # the cheapest that holds it
    placed = cpl.wait_for_pod_bound(api_client, namespace, "needs-one", timeout=60)
    assert placed.spec.node_name == claim["spec"]["nodeName"]
    assert stays(lambda: len(claims.gpunodeclaims(pool)) == 1, 5)  # and only one


def test_a_nodeclaim_never_takes_the_pool_past_max_resources(api_client, capacity, make_pool, claims):
    pool = make_pool(min_tflops=5 * A100, max_tflops=2 * A100)
    cpl.wait_until(lambda: claims.bound(pool, 2), 120, interval=0.5, what="the capped launches")
    assert [c["spec"]["instanceType"] for c in claims.gpunodeclaims(pool)] == ["gpu-a100-1"] * 2
    assert stays(lambda: claims.offered_tflops(pool) <= 2 * A100, 6)
    event = cpl.wait_until(lambda: pool_events(api_client, pool, "MaxResourceConstraintReached"), 30)
    assert event[0].type == "Warning" and "maxResources" in event[0].message


def test_a_missing_node_class_is_an_event_and_no_claim(api_client, capacity, make_pool, claims):
    pool = make_pool(min_tflops=A100, node_class="does-not-exist")
    event = cpl.wait_until(lambda: pool_events(api_client, pool, "NodeClassNotFound"), 60, interval=0.5)
    assert event[0].type == "Warning" and "does-not-exist" in event[0].message
    assert stays(lambda: not claims.gpunodeclaims(pool) and not claims.nodeclaims(pool), 5)


def test_manual_compaction_releases_at_once_between_periods(api_client, capacity, make_pool, claims):
    pool = make_pool(min_tflops=A100, instance_types=("gpu-a100-1",), period="1h")
    cpl.wait_until(lambda: claims.bound(pool, 1), 120, interval=0.5, what="the minimum node")
    custom = client.CustomObjectsApi(api_client)
    custom.patch_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION, "gpupools", pool,
                                       {"spec": {"capacityConfig": {"minResources": None}}})
    # Surplus now, and older than the protection time soon, but the next periodic pass is an hour away.
    assert stays(lambda: len(claims.nodes(pool)) == 1, PROTECTION_SECONDS + 5)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    custom.patch_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION, "gpupools", pool, {
        "metadata": {"annotations": {"tensor-fusion.ai/manual-compaction": stamp}}})
    cpl.wait_until(lambda: not claims.nodes(pool) and not claims.gpunodeclaims(pool), 60, interval=0.5,
                   what="the node released by the manual trigger")


# --- compaction of an AutoSelect pool ---------------------------------------------------------------------


def test_autoselect_compaction_keeps_warm_capacity_and_lets_the_surplus_go(api_client, capacity, make_pool,
                                                                          karpenter, claims):
    pool = make_pool("AutoSelect", warm_tflops=A100)
    # Karpenter consolidates empty nodes of this NodePool 40 s after they empty; the extender must shield
    # the one node warm capacity needs and leave the other two to Karpenter.
    nodepool = karpenter.nodepool(pool, instance_type="gpu-a100-1", zones=("zone-a",),
                                  consolidation="WhenEmpty", consolidate_after="40s")
    nodepool_obj = karpenter.custom.get_cluster_custom_object(*KARPENTER_API, "nodepools", nodepool)
    template = nodepool_obj["spec"]["template"]
    # Karpenter's own claims carry the NodePool's hash; without it Karpenter would call them drifted.
    hashes = {k: v for k, v in (nodepool_obj["metadata"].get("annotations") or {}).items()
              if k.startswith("karpenter.sh/nodepool-hash")}
    # These three claims play what a burst of pods leaves behind once they finished: three empty GPU nodes of
    # the NodePool (created by hand because no pods are needed for that state).
    names = []
    for i in range(3):
        name = f"{nodepool}-burst-{i}"
        karpenter.custom.create_cluster_custom_object(*KARPENTER_API, "nodeclaims", {
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "annotations": hashes,
                         "labels": {**template["metadata"]["labels"], "karpenter.sh/nodepool": nodepool}},
            "spec": {**{k: v for k, v in template["spec"].items() if k in ("nodeClassRef", "requirements")},
                     "resources": {"requests": {"nvidia.com/gpu": "1"}}}})
        names.append(name)
    nodes = [karpenter.node_of_claim(n) for n in names]

    def protected() -> list[str]:
        return [n.metadata.name for n in claims.nodes(pool)
                if (n.metadata.annotations or {}).get(DO_NOT_DISRUPT) == "true"]

    kept = cpl.wait_until(lambda: protected() if len(protected()) == 1 else None, 60, interval=0.5,
                          what="one node shielded for warm capacity")
    assert kept[0] in nodes
    # The other two: labelled should-delete after the protection time, then consolidated by Karpenter.
    cpl.wait_until(lambda: [n.metadata.name for n in claims.nodes(pool)] == kept, 180, interval=1,
                   what="the two surplus nodes gone")
    released = {e.involved_object.name for e in node_events(api_client, "CompactionRelease")
                if pool in e.message}
    assert released == set(nodes) - set(kept)
    assert stays(lambda: [n.metadata.name for n in claims.nodes(pool)] == kept and protected() == kept, 10)

"""Node expansion on the real control plane, with Karpenter's own CRDs validating every NodeClaim.

There is no Karpenter here: the tests play it. When the extender creates a NodeClaim, the test creates
the Node (kwok keeps it Ready) and its GPU objects and sets the claim's status.nodeName, as Karpenter and
the node's GPU agent would. The extender runs as ``tf-extender serve`` with short expansion delays.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from . import controlplane as cpl

pytestmark = pytest.mark.e2e

KARPENTER = ("karpenter.sh", "v1")
NODEPOOL_LABEL = "karpenter.sh/nodepool"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
ZONE = "topology.kubernetes.io/zone"
EXPANSION_LABEL = "tensor-fusion.ai/expansion"
EXPANSION_POD_UID = "tensor-fusion.ai/expansion-pod-uid"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
GROUP = "e2e-expansion"
POOL = "pool-e2e-expansion"
NODE_CLASS = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"}


# --- the extender --------------------------------------------------------------------------------


def extender_flags(lease_namespace: str, *, delay: float = 1.0, max_in_flight: int = 15,
                   **extra: Any) -> dict[str, Any]:
    """``tf-extender serve`` flags for these tests: short expansion delays, a lease of their own."""
    return {
        "expansion_delay": delay, "max_inflight_nodes": max_in_flight, "expansion_claim_timeout": 600,
        "expansion_lease_namespace": lease_namespace, **extra,
    }


def ensure_pool(api_client: Any) -> None:
    """The pods below are opted in, so they pass the webhook, which admits only pods of known pools."""
    custom = client.CustomObjectsApi(api_client)
    try:
        custom.get_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION, "gpupools", POOL)
    except ApiException as exc:
        if exc.status != 404:
            raise
        cpl.create_cluster_object(api_client, "gpupools", {
            "apiVersion": f"{cpl.TF_GROUP}/{cpl.TF_VERSION}", "kind": "GPUPool",
            "metadata": {"name": POOL}, "spec": {}})
    cpl.wait_for_webhook_pool(api_client, POOL)


@pytest.fixture
def run_extender(cluster, webhook, api_client, karpenter_crds, extender_runner,
                 namespace) -> Iterator[Callable[..., None]]:
    """run_extender(delay=..., max_in_flight=...): the session's one extender with these flags (restarted
    only when they differ from its current ones; the next test wanting the defaults restarts it again)."""
    ensure_pool(api_client)

    def run(**kw: Any) -> None:
        extender_runner.ensure(**extender_flags(namespace, **kw))

    yield run


# --- Karpenter objects, and playing Karpenter ------------------------------------------------------


class Karpenter:
    def __init__(self, api_client: Any, make_node: Callable[..., str], make_gpu: Callable[..., dict]) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.make_node = make_node
        self.make_gpu = make_gpu
        self.group = uuid.uuid4().hex[:8]
        self.nodepool = f"gpu-{self.group}"
        self.delivered: set[str] = set()

    def create_nodepool(self) -> dict:
        body = {
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": self.nodepool},
            "spec": {"template": {
                "metadata": {"labels": {GROUP: self.group}, "annotations": {DO_NOT_DISRUPT: "true",
                                                                             "team": "ml"}},
                "spec": {
                    "nodeClassRef": NODE_CLASS,
                    "requirements": [
                        {"key": INSTANCE_TYPE, "operator": "In", "values": ["gpu-a100-1", "gpu-a100-2"]},
                        {"key": ZONE, "operator": "In", "values": ["zone-a", "zone-b"]},
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                    ],
                    "expireAfter": "Never",
                }}},
        }
        return self.custom.create_cluster_custom_object(*KARPENTER, "nodepools", body)

    def gpu_node(self, name: str, labels: dict[str, str], gpus: int = 1, vram: str = "80Gi") -> str:
        """GPU objects first, then the Node: its arrival is what makes the scheduler retry."""
        for i in range(gpus):
            self.make_gpu(f"{name}-gpu-{i}", name, pool=POOL, vram=vram, tflops="312", index=i)
        self.make_node(name, labels={GROUP: self.group, ZONE: "zone-a", **labels})
        self.core.patch_node(name, {"spec": {"providerID": f"kwok://{name}"}})
        return name

    def template(self) -> str:
        """A GPU node owned by a NodeClaim of the NodePool, as Karpenter would have made it."""
        name = f"tpl-{self.group}"
        claim = {
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": f"{self.nodepool}-tpl",
                         "labels": {NODEPOOL_LABEL: self.nodepool, GROUP: self.group},
                         "annotations": {DO_NOT_DISRUPT: "true"}},
            "spec": {
                "nodeClassRef": NODE_CLASS,
                "requirements": [{"key": INSTANCE_TYPE, "operator": "In", "values": ["gpu-a100-1"]}],
                "taints": [{"key": "example.com/gpu", "value": "true", "effect": "PreferNoSchedule"}],
                "expireAfter": "Never",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
            },
        }
        self.custom.create_cluster_custom_object(*KARPENTER, "nodeclaims", claim)
        self.custom.patch_cluster_custom_object_status(
            *KARPENTER, "nodeclaims", claim["metadata"]["name"],
            {"status": {"nodeName": name, "providerID": f"kwok://{name}"}})
        return self.gpu_node(name, {NODEPOOL_LABEL: self.nodepool, INSTANCE_TYPE: "gpu-a100-1"})

    def new_claims(self) -> list[dict]:
        selector = f"{NODEPOOL_LABEL}={self.nodepool},{EXPANSION_LABEL}"
        items = self.custom.list_cluster_custom_object(*KARPENTER, "nodeclaims",
                                                       label_selector=selector)["items"]
        return sorted(items, key=lambda c: c["metadata"]["name"])

    def claims_for(self, uid: str) -> list[dict]:
        return self.custom.list_cluster_custom_object(
            *KARPENTER, "nodeclaims", label_selector=f"{EXPANSION_POD_UID}={uid}")["items"]

    def deliver(self, claim: dict) -> str:
        """Play Karpenter: launch the claim's node and register it."""
        name = claim["metadata"]["name"]
        requirements = {r["key"]: r for r in claim["spec"]["requirements"]}
        labels = {k: v for k, v in claim["metadata"]["labels"].items()
                  if not k.startswith("tensor-fusion.ai/")}
        labels[INSTANCE_TYPE] = requirements[INSTANCE_TYPE]["values"][0]
        self.gpu_node(name, labels)
        self.custom.patch_cluster_custom_object_status(
            *KARPENTER, "nodeclaims", name, {"status": {"nodeName": name, "providerID": f"kwok://{name}"}})
        self.delivered.add(name)
        return name

    def cleanup(self) -> None:
        for claim in self.custom.list_cluster_custom_object(
                *KARPENTER, "nodeclaims", label_selector=f"{NODEPOOL_LABEL}={self.nodepool}")["items"]:
            _ignore_404(self.custom.delete_cluster_custom_object, *KARPENTER, "nodeclaims",
                        claim["metadata"]["name"])
        _ignore_404(self.custom.delete_cluster_custom_object, *KARPENTER, "nodepools", self.nodepool)


def _ignore_404(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture
def karpenter(api_client, karpenter_crds, make_node, make_gpu) -> Iterator[Karpenter]:
    k = Karpenter(api_client, make_node, make_gpu)
    k.create_nodepool()
    yield k
    k.cleanup()


# --- pods ------------------------------------------------------------------------------------------


def gpu_pod(name: str, group: str, vram: str, node_selector: dict[str, str] | None = None) -> dict:
    annotations = {
        "tensor-fusion.ai/gpupool": POOL, "tensor-fusion.ai/tflops-request": "10",
        "tensor-fusion.ai/tflops-limit": "10", "tensor-fusion.ai/vram-request": vram,
        "tensor-fusion.ai/vram-limit": vram, "tensor-fusion.ai/gpu-count": "1",
        "tensor-fusion.ai/isolation": "soft", "tensor-fusion.ai/qos": "medium",
    }
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations,
                     "labels": {"tensor-fusion.ai/enabled": "true", "tensor-fusion.ai/component": "worker",
                                "tensor-fusion.ai/gpupool": POOL}},
        "spec": {
            "schedulerName": cpl.GPU_SCHEDULER_NAME,
            "nodeSelector": {GROUP: group, **(node_selector or {})},
            "tolerations": [{"key": "example.com/gpu", "operator": "Exists"}],
            "containers": [{"name": "main", "image": "busybox", "resources": {
                "requests": {"cpu": "100m", "memory": "64Mi"},
                "limits": {"tensor-fusion.ai/index_0": "1"}}}],
        },
    }


def create_pod(api_client: Any, namespace: str, body: dict) -> dict:
    created = client.CoreV1Api(api_client).create_namespaced_pod(namespace, body)
    return {"name": created.metadata.name, "uid": created.metadata.uid}


def node_of(api_client: Any, namespace: str, name: str) -> str | None:
    return client.CoreV1Api(api_client).read_namespaced_pod(name, namespace).spec.node_name


def wait_for_event(api_client: Any, namespace: str, pod: str, reason: str, timeout: float = 60) -> Any:
    return cpl.wait_until(lambda: cpl.pod_events(api_client, namespace, pod, reason), timeout,
                          what=f"event {reason} on {pod}")[0]


def fill_template(api_client: Any, namespace: str, karpenter: Karpenter, vram: str = "60Gi") -> str:
    node = karpenter.template()
    pod = create_pod(api_client, namespace, gpu_pod("filler", karpenter.group, vram))
    bound = cpl.wait_for_pod_bound(api_client, namespace, pod["name"], timeout=60)
    assert bound.spec.node_name == node
    return node


# --- tests -----------------------------------------------------------------------------------------


def test_one_more_pod_gets_one_new_nodeclaim_and_lands_on_its_node(api_client, namespace, karpenter,
                                                                    run_extender):
    run_extender(delay=1)
    fill_template(api_client, namespace, karpenter)
    pod = create_pod(api_client, namespace, gpu_pod("one-more", karpenter.group, "60Gi"))

    wait_for_event(api_client, namespace, "one-more", "NodeExpansionCheck")
    claims = cpl.wait_until(karpenter.new_claims, 60, what="a new NodeClaim")
    time.sleep(3)  # and only one
    claims = karpenter.new_claims()
    assert len(claims) == 1
    claim = claims[0]
    name = claim["metadata"]["name"]
    assert name.startswith(f"{karpenter.nodepool}-tf-")
    assert claim["metadata"]["labels"][NODEPOOL_LABEL] == karpenter.nodepool
    assert claim["metadata"]["labels"][GROUP] == karpenter.group  # the NodePool template's labels
    assert claim["metadata"]["labels"][EXPANSION_POD_UID] == pod["uid"]
    assert DO_NOT_DISRUPT not in (claim["metadata"].get("annotations") or {})
    assert claim["metadata"]["annotations"]["team"] == "ml"
    requirements = {r["key"]: r for r in claim["spec"]["requirements"]}
    assert requirements[INSTANCE_TYPE] == {"key": INSTANCE_TYPE, "operator": "In", "values": ["gpu-a100-1"]}
    assert requirements[ZONE]["values"] == ["zone-a", "zone-b"]  # the pod pins no zone
    assert requirements["karpenter.sh/capacity-type"]["values"] == ["on-demand"]
    assert claim["spec"]["nodeClassRef"] == NODE_CLASS
    assert claim["spec"]["taints"] == [
        {"key": "example.com/gpu", "value": "true", "effect": "PreferNoSchedule"}]
    assert claim["spec"]["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"}}
    completed = wait_for_event(api_client, namespace, "one-more", "NodeExpansionCompleted")
    assert name in completed.message

    new_node = karpenter.deliver(claim)
    bound = cpl.wait_for_pod_bound(api_client, namespace, "one-more", timeout=90)
    assert bound.spec.node_name == new_node
    assert len(karpenter.new_claims()) == 1


def test_twenty_pods_never_more_than_three_claims_in_flight(api_client, namespace, karpenter, run_extender):
    run_extender(delay=1, max_in_flight=3)
    fill_template(api_client, namespace, karpenter)
    names = [f"p{i:02d}" for i in range(20)]
    for name in names:
        create_pod(api_client, namespace, gpu_pod(name, karpenter.group, "60Gi"))

    deadline = time.monotonic() + 420
    most_in_flight = 0
    full_since: float | None = None
    while time.monotonic() < deadline:
        claims = karpenter.new_claims()
        waiting = [c for c in claims if c["metadata"]["name"] not in karpenter.delivered]
        most_in_flight = max(most_in_flight, len(waiting))
        assert len(waiting) <= 3, [c["metadata"]["name"] for c in waiting]
        bound = sum(1 for n in names if node_of(api_client, namespace, n))
        if bound == len(names):
            break
        # Hold the nodes back a little once three are waiting, so a fourth claim would show.
        if len(waiting) == 3 and full_since is None:
            full_since = time.monotonic()
        if waiting and (len(waiting) < 3 or time.monotonic() - (full_since or 0) > 3):
            for claim in waiting:
                karpenter.deliver(claim)
            full_since = None
        time.sleep(0.5)
    placed = {n: node_of(api_client, namespace, n) for n in names}
    assert all(placed.values()), {n: node for n, node in placed.items() if not node}
    assert len(set(placed.values())) == 20  # each on a node of its own
    assert len(karpenter.new_claims()) == 20
    assert most_in_flight == 3


def test_small_pods_that_fit_one_new_node_make_one_claim(api_client, namespace, karpenter, run_extender):
    run_extender(delay=1)
    fill_template(api_client, namespace, karpenter)  # 20Gi left on the template's GPU
    names = ["s1", "s2", "s3"]
    for name in names:
        create_pod(api_client, namespace, gpu_pod(name, karpenter.group, "25Gi"))
    claims = cpl.wait_until(karpenter.new_claims, 60, what="a new NodeClaim")
    for name in names:
        wait_for_event(api_client, namespace, name, "NodeExpansionCheck")
    time.sleep(4)
    claims = karpenter.new_claims()
    assert len(claims) == 1
    node = karpenter.deliver(claims[0])
    for name in names:
        assert cpl.wait_for_pod_bound(api_client, namespace, name, timeout=90).spec.node_name == node


def test_pod_whose_node_selector_matches_no_node_makes_no_claim(api_client, namespace, karpenter,
                                                                run_extender):
    run_extender(delay=1)
    fill_template(api_client, namespace, karpenter)
    pod = create_pod(api_client, namespace,
                     gpu_pod("nowhere", karpenter.group, "10Gi", node_selector={ZONE: "zone-nowhere"}))
    cpl.wait_until(lambda: cpl.scheduling_failure(api_client, namespace, "nowhere"), 60,
                   what="PodScheduled=False")
    time.sleep(4)
    assert karpenter.claims_for(pod["uid"]) == [] and karpenter.new_claims() == []
    assert cpl.pod_events(api_client, namespace, "nowhere", "NodeExpansionCheck") == []


def test_gpu_nodes_not_owned_by_karpenter_fail_without_a_claim(api_client, namespace, karpenter,
                                                               run_extender):
    # Karpenter only: with the default (auto) such a pod gets a Cluster Autoscaler placeholder instead
    # (tests/e2e/test_autoscaler_pods.py).
    run_extender(delay=1, node_provisioner="karpenter")
    karpenter.gpu_node(f"plain-{karpenter.group}", {INSTANCE_TYPE: "gpu-a100-1"})
    filler = create_pod(api_client, namespace, gpu_pod("filler", karpenter.group, "60Gi"))
    cpl.wait_for_pod_bound(api_client, namespace, filler["name"], timeout=60)
    pod = create_pod(api_client, namespace, gpu_pod("orphan", karpenter.group, "60Gi"))
    failed = wait_for_event(api_client, namespace, "orphan", "NodeExpansionFailed")
    assert "not owned by a Karpenter NodePool" in failed.message
    assert karpenter.claims_for(pod["uid"]) == []
    assert node_of(api_client, namespace, "orphan") is None


def test_pod_deleted_while_queued_makes_no_claim(api_client, namespace, karpenter, run_extender):
    run_extender(delay=5)
    fill_template(api_client, namespace, karpenter)
    pod = create_pod(api_client, namespace, gpu_pod("gone", karpenter.group, "60Gi"))
    wait_for_event(api_client, namespace, "gone", "NodeExpansionCheck")
    client.CoreV1Api(api_client).delete_namespaced_pod("gone", namespace, grace_period_seconds=0)
    cpl.wait_for_pod_gone(api_client, namespace, "gone", timeout=30)
    time.sleep(8)
    assert karpenter.claims_for(pod["uid"]) == [] and karpenter.new_claims() == []

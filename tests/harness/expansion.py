"""Shared pieces of the expansion e2e modules: the extender's flags, a test's own NodePool (``Group``), GPU
pods and their events. The fixtures are registered under their short names (``run_extender``,
``make_group``, ``group``) by importing the ``*_fixture`` functions into a test module."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from .karpenter import Karpenter
from .objects import (
    GPU_SCHEDULER_NAME,
    TF_GROUP,
    TF_VERSION,
    create_cluster_object,
    pod_events,
    wait_for_pod_bound,
    wait_for_webhook_pool,
)
from .processes import wait_until

EXPANSION_LABEL = "tensor-fusion.ai/expansion"
EXPANSION_POD_UID = "tensor-fusion.ai/expansion-pod-uid"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
GROUP = "e2e-expansion"
POOL = "pool-e2e-expansion"
TAINT = {"key": "example.com/gpu", "value": "true", "effect": "PreferNoSchedule"}


# --- the extender --------------------------------------------------------------------------------


def extender_flags(lease_namespace: str, *, delay: float = 1.0, max_in_flight: int = 15,
                   **extra: Any) -> dict[str, Any]:
    """``tf-extender serve`` flags for these tests: short expansion delays, a lease of their own."""
    return {
        "expansion_delay": delay, "max_inflight_nodes": max_in_flight, "expansion_claim_timeout": 600,
        "expansion_lease_namespace": lease_namespace, **extra,
    }


def ensure_pool(api_client: Any, pool: str = POOL) -> None:
    """The pods below are opted in, so they pass the webhook, which admits only pods of known pools."""
    custom = client.CustomObjectsApi(api_client)
    try:
        custom.get_cluster_custom_object(TF_GROUP, TF_VERSION, "gpupools", pool)
    except ApiException as exc:
        if exc.status != 404:
            raise
        create_cluster_object(api_client, "gpupools", {
            "apiVersion": f"{TF_GROUP}/{TF_VERSION}", "kind": "GPUPool",
            "metadata": {"name": pool}, "spec": {}})
    wait_for_webhook_pool(api_client, pool)


@pytest.fixture(name="run_extender")
def run_extender_fixture(cluster, webhook, api_client, extender_runner,
                         namespace) -> Iterator[Callable[..., None]]:
    """run_extender(delay=..., max_in_flight=...): the session's one extender with these flags (restarted
    only when they differ from its current ones; the next test wanting the defaults restarts it again)."""
    ensure_pool(api_client)

    def run(**kw: Any) -> None:
        extender_runner.ensure(**extender_flags(namespace, **kw))

    yield run


class Group:
    """One test's NodePool (its nodes labelled with a group of their own, which the test's pods select)."""

    def __init__(self, karpenter: Karpenter) -> None:
        self.karpenter = karpenter
        self.name = uuid.uuid4().hex[:8]
        self.nodepool = ""

    def create(self, **kw: Any) -> Group:
        """The NodePool; its template's annotations (by default a node-level do-not-disrupt, which the
        expander's claims must not copy) can be replaced with ``annotations=``."""
        kw.setdefault("annotations", {DO_NOT_DISRUPT: "true", "team": "ml"})
        self.nodepool = self.karpenter.nodepool(
            POOL, name=f"gpu-{self.name}", labels={GROUP: self.name}, taints=[TAINT], **kw)
        return self

    def expansion_claims(self) -> list[dict]:
        return self.karpenter.claims(self.nodepool, EXPANSION_LABEL)

    def claims_for(self, uid: str) -> list[dict]:
        return self.karpenter.claims(label_selector=f"{EXPANSION_POD_UID}={uid}")

    def registered_claims_for(self, uid: str, timeout: float = 60) -> list[dict]:
        """The pod's claims once Karpenter has written each one's status.nodeName (it may do so after the
        pod is already bound to the new node)."""
        def registered() -> list[dict]:
            claims = self.claims_for(uid)
            return claims if claims and all((c.get("status") or {}).get("nodeName") for c in claims) else []
        return wait_until(registered, timeout, what=f"the claims of pod {uid} to name their node")

    def in_flight(self) -> list[dict]:
        """The expander's claims of the group whose Node does not exist yet."""
        nodes = {n.spec.provider_id for n in self.karpenter.nodes(self.nodepool)}
        return [c for c in self.expansion_claims() if (c.get("status") or {}).get("providerID") not in nodes]


@pytest.fixture(name="make_group")
def make_group_fixture(karpenter: Karpenter, namespace: str,
                       api_client: Any) -> Iterator[Callable[..., Group]]:
    """make_group(**nodepool kwargs) -> a Group with its NodePool; at teardown the namespace's pods go
    first (Karpenter drains a node before it lets it go), then the NodePools and their nodes."""
    yield lambda **kw: Group(karpenter).create(**kw)
    client.CoreV1Api(api_client).delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    karpenter.reset()


@pytest.fixture(name="group")
def group_fixture(make_group: Callable[..., Group]) -> Group:
    return make_group()


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
            "schedulerName": GPU_SCHEDULER_NAME,
            "nodeSelector": {GROUP: group, **(node_selector or {})},
            "tolerations": [{"key": "example.com/gpu", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
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
    return wait_until(lambda: pod_events(api_client, namespace, pod, reason), timeout,
                          what=f"event {reason} on {pod}")[0]


def fill_first_node(api_client: Any, namespace: str, group: Group, vram: str = "60Gi") -> str:
    """The group's first GPU node, grown from zero for a filler pod that then holds ``vram`` of its GPU."""
    create_pod(api_client, namespace, gpu_pod("filler", group.name, vram))
    completed = wait_for_event(api_client, namespace, "filler", "NodeExpansionCompleted", timeout=90)
    assert "from the NodePool's template" in completed.message
    return str(wait_for_pod_bound(api_client, namespace, "filler", timeout=120).spec.node_name)

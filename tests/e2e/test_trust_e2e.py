"""No tenant can forge or inflate a GPU allocation: every attack tried on the real control plane.

The tenant is an ordinary user with create/patch rights on pods in one namespace (a Role, as a namespace
admin would have), talking to the real kube-apiserver, which runs the real webhook and the shipped
ValidatingAdmissionPolicies (manifests/admission-policy.yaml). Each attack fails:

- a pod arriving with an allocation (gpu-ids, index, allocated, spec.nodeName) is refused, by the webhook for
  GPU pods and by the policy for pods that skip the webhook;
- a change of any tensor-fusion.ai/* annotation or label of a pod after admission is refused;
- and should a forged record get past admission anyway (played here by writing as the extender's own
  identity, as in a cluster without the policy), the extender's ledger does not believe it: a GPU is never
  counted over capacity for a pod it did not bind, a GPU of another node is not counted, and a record
  changed after the bind is not believed. It says so in a metric and in an event on the pod.

GPUs have 100 TFLOPS and 40Gi; the tests read the extender's view from its
``tf_extender_node_allocated_ratio`` gauges.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests import harness as cpl

pytestmark = pytest.mark.e2e

P = "tensor-fusion.ai/"


@pytest.fixture
def tenant(control_plane, api_client, namespace):
    """An API client of a user who may create, read, patch and delete pods in ``namespace`` only."""
    rbac = client.RbacAuthorizationV1Api(api_client)
    user = f"tenant-{namespace}"
    rbac.create_namespaced_role(namespace, {
        "metadata": {"name": "tenant"},
        "rules": [{"apiGroups": [""], "resources": ["pods"],
                   "verbs": ["create", "get", "list", "watch", "patch", "update", "delete"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "tenant"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
    api = control_plane.api_client(control_plane.kubeconfig_for(user))
    core = client.CoreV1Api(api)
    cpl.wait_until(lambda: core.list_namespaced_pod(namespace) is not None, 10, what="tenant RBAC in force")
    yield core
    api.close()


@pytest.fixture
def gpu_node(make_node, make_gpu, make_pool):
    """make() -> (pool, node, gpu): a node with one 100 TFLOPS / 40Gi GPU in a pool of its own."""
    pool = make_pool()

    def make(short: str = "n") -> tuple[str, str, str]:
        node = f"trust-{uuid.uuid4().hex[:6]}-{short}"
        make_gpu(f"{node}-gpu", node, pool=pool, tflops="100", vram="40Gi")
        make_node(node)
        return pool, node, f"{node}-gpu"

    return make


def _refusal(call, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ApiException) as err:
        call(*args, **kwargs)
    assert err.value.status in (400, 403, 422), err.value.body
    return json.loads(err.value.body)["message"]


def _tflops_percent(extender: cpl.ExtenderRunner, node: str) -> float | None:
    ratio = extender.metric("tf_extender_node_allocated_ratio", node=node, resource="tflops")
    return None if ratio is None else round(100 * ratio, 6)


def _wait_percent(extender: cpl.ExtenderRunner, node: str, percent: float) -> None:
    cpl.wait_until(lambda: _tflops_percent(extender, node) == percent, 30,
                   what=f"the extender to count {percent}% of {node}'s TFLOPS")


def _stays_pending(api_client, namespace: str, name: str) -> str:
    """The pod is refused by the scheduler (and not bound meanwhile); returns the scheduler's message."""
    message = cpl.wait_until(lambda: cpl.scheduling_failure(api_client, namespace, name), 60,
                             what=f"pod {namespace}/{name} to be refused by the scheduler")
    assert not cpl.read_pod(api_client, namespace, name).spec.node_name
    return message


# --- admission ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("annotations", "spec", "key"), [
    ({P + "gpu-ids": "someone-elses-gpu"}, {}, P + "gpu-ids"),
    ({P + "index": "1"}, {}, P + "index"),
    ({P + "allocated": "tflops=0,vram=0"}, {}, P + "allocated"),
    ({}, {"nodeName": "any-node"}, "spec.nodeName"),
])
def test_a_gpu_pod_may_not_arrive_with_an_allocation(gpu_cluster, tenant, namespace, gpu_node, annotations,
                                                     spec, key):
    pool, _, _ = gpu_node()
    body = cpl.gpu_pod_body("forger", pool=pool, tflops="10", vram="1Gi", annotations=annotations)
    body["spec"].update(spec)
    message = _refusal(tenant.create_namespaced_pod, namespace, body)
    assert key in message and "denied the request" in message  # the webhook's denial, naming the key


@pytest.mark.parametrize(("annotations", "spec", "key"), [
    ({P + "gpu-ids": "g"}, {}, P + "gpu-ids"),
    ({P + "allocated": "whole"}, {}, P + "allocated"),
    ({}, {"nodeName": "any-node", "schedulerName": cpl.GPU_SCHEDULER_NAME}, "spec.nodeName"),
])
def test_a_pod_that_skips_the_webhook_may_not_arrive_with_an_allocation(gpu_cluster, tenant, namespace,
                                                                         annotations, spec, key):
    # not opted in (no tensor-fusion.ai/enabled label): the webhook never sees it; the policy does
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "sneaky", "labels": {P + "component": "worker"}, "annotations": annotations},
            "spec": {"containers": [{"name": "main", "image": "busybox"}], **spec}}
    message = _refusal(tenant.create_namespaced_pod, namespace, body)
    assert key in message and "ValidatingAdmissionPolicy" in message


def test_a_tenant_cannot_change_an_allocation_after_admission(gpu_cluster, extender, tenant, api_client,
                                                              namespace, gpu_node):
    pool, node, gpu = gpu_node()
    tenant.create_namespaced_pod(namespace, cpl.gpu_pod_body("a", pool=pool, tflops="80", vram="8Gi"))
    assert cpl.placement(api_client, namespace, "a") == (node, [gpu])
    _wait_percent(extender, node, 80.0)
    for patch, key in [
        ({"metadata": {"annotations": {P + "tflops-request": "0", P + "tflops-limit": "0"}}}, P + "tflops"),
        ({"metadata": {"annotations": {P + "gpu-ids": None}}}, P + "gpu-ids"),
        ({"metadata": {"annotations": {P + "allocated": "tflops=0,vram=0"}}}, P + "allocated"),
        ({"metadata": {"labels": {P + "component": None}}}, P + "component"),
    ]:
        message = _refusal(tenant.patch_namespaced_pod, "a", namespace, patch)
        assert key in message and "may not change" in message
    # the policy guards the domain, nothing else: the tenant's own annotations stay theirs
    tenant.patch_namespaced_pod("a", namespace, {"metadata": {"annotations": {"team/owner": "me"}}})
    # a plain pod cannot be turned into a GPU pod holding GPUs either
    tenant.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
                                             "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    message = _refusal(tenant.patch_namespaced_pod, "plain", namespace, {"metadata": {
        "labels": {P + "component": "worker"}, "annotations": {P + "gpu-ids": gpu}}})
    assert P + "gpu-ids" in message
    # and a second pod of 80 does not fit: A's 80 TFLOPS still count
    tenant.create_namespaced_pod(namespace, cpl.gpu_pod_body("b", pool=pool, tflops="80", vram="8Gi"))
    _stays_pending(api_client, namespace, "b")
    assert _tflops_percent(extender, node) == 80.0


# --- the ledger, past admission -------------------------------------------------------------------------

def _forge(api_client, namespace: str, name: str, pool: str, node: str, gpu: str, tflops: str) -> None:
    """A pod holding ``tflops`` of ``gpu`` that no scheduler placed, written with the extender's identity
    (the only one the policy lets through): what a cluster without the policy would let a tenant do."""
    cpl.place_by_hand(api_client, namespace, name, pool, node, [gpu], tflops=tflops, vram="8Gi")


def _not_believed(api_client, extender, namespace: str, name: str, reason: str, before: float) -> str:
    cpl.wait_until(lambda: (extender.metric("tf_extender_distrusted_allocations_total", reason=reason) or 0)
                   > before, 30, what=f"the extender to report {reason}")
    events = cpl.wait_until(lambda: cpl.pod_events(api_client, namespace, name, "GPUAllocationNotBelieved"),
                            30, what=f"a GPUAllocationNotBelieved event on {name}")
    return events[0].message


def _eighty_of_a_gpu(api_client, extender, namespace: str, gpu_node) -> tuple[str, str, str]:
    """Pod ``a`` placed by the GPU scheduler with 80 of its GPU's 100 TFLOPS; returns (pool, node, gpu)."""
    pool, node, gpu = gpu_node()
    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("a", pool=pool, tflops="80", vram="8Gi"))
    assert cpl.placement(api_client, namespace, "a") == (node, [gpu])
    _wait_percent(extender, node, 80.0)
    return pool, node, gpu


def test_a_forged_allocation_never_takes_a_gpu_over_capacity(gpu_cluster, extender, api_client, namespace,
                                                             gpu_node):
    pool, node, gpu = _eighty_of_a_gpu(api_client, extender, namespace, gpu_node)
    before = extender.metric("tf_extender_distrusted_allocations_total", reason="over_capacity") or 0
    _forge(api_client, namespace, "forged", pool, node, gpu, tflops="80")  # would be 160 %
    message = _not_believed(api_client, extender, namespace, "forged", "over_capacity", before)
    assert f"{namespace}/forged" in message and gpu in message
    assert _tflops_percent(extender, node) == 80.0
    # the 20 TFLOPS really left are still handed out, no more
    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("fits", pool=pool, tflops="20", vram="8Gi"))
    assert cpl.placement(api_client, namespace, "fits") == (node, [gpu])
    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("too-big", pool=pool, tflops="10", vram="8Gi"))
    _stays_pending(api_client, namespace, "too-big")
    _wait_percent(extender, node, 100.0)


def test_a_gpu_of_another_node_is_not_counted(gpu_cluster, extender, api_client, namespace, gpu_node):
    pool, n1, _ = gpu_node("one")
    _, n2, gpu2 = gpu_node("two")
    before = extender.metric("tf_extender_distrusted_allocations_total", reason="node_mismatch") or 0
    _forge(api_client, namespace, "elsewhere", pool, n1, gpu2, tflops="100")  # on n1, holding n2's GPU
    message = _not_believed(api_client, extender, namespace, "elsewhere", "node_mismatch", before)
    assert gpu2 in message and n2 in message
    assert (_tflops_percent(extender, n2) or 0.0) == 0.0
    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("whole", pool=pool, tflops="100", vram="40Gi",
                                                            node_selector={"kubernetes.io/hostname": n2}))
    assert cpl.placement(api_client, namespace, "whole") == (n2, [gpu2])


def test_a_record_changed_after_the_bind_is_not_believed(gpu_cluster, extender, api_client, namespace,
                                                         gpu_node):
    pool, node, _ = _eighty_of_a_gpu(api_client, extender, namespace, gpu_node)
    before = extender.metric("tf_extender_distrusted_allocations_total", reason="record_changed") or 0
    # past the policy: the request and the record itself rewritten to nothing
    zero = {P + "tflops-request": "0", P + "tflops-limit": "0", P + "allocated": "tflops=0,vram=0"}
    client.CoreV1Api(cpl.as_extender(api_client)).patch_namespaced_pod(
        "a", namespace, {"metadata": {"annotations": zero}})
    _not_believed(api_client, extender, namespace, "a", "record_changed", before)
    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("b", pool=pool, tflops="80", vram="8Gi"))
    _stays_pending(api_client, namespace, "b")
    assert _tflops_percent(extender, node) == 80.0

"""Kubernetes' own gang API (1.36, ``scheduling.k8s.io/v1alpha2`` PodGroup, feature gates GenericWorkload and
GangScheduling on kube-apiserver and kube-scheduler): pods joining a PodGroup through
``spec.schedulingGroup`` are placed all together by kube-scheduler's gang wait and the extender's
reservation, which agree. A control plane of this module's own, since the gates change the API server."""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

import pytest
from kubernetes import client

from tests import harness as cpl

pytestmark = pytest.mark.e2e

GATES = "--feature-gates=GenericWorkload=true,GangScheduling=true"
CAP = {"tflops": "100", "vram": "100Gi"}


@pytest.fixture(scope="module")
def gated(e2e_binaries, tmp_path_factory):
    cp = cpl.ControlPlane(tmp_path_factory.mktemp("gated"), e2e_binaries,
                          apiserver_args=[GATES, "--runtime-config=scheduling.k8s.io/v1alpha2=true"])
    started: list[Any] = []
    try:
        cp.start()
        api = cp.api_client()
        cpl.apply_crds(api, cpl.project_crd_files())
        started.append(cpl.start_kwok(cp, e2e_binaries["kwok"], e2e_binaries["kwok-stages"]))
        port = cpl.free_port()
        started.append(cpl.start_scheduler(cp, e2e_binaries["kube-scheduler"],
                                           f"http://127.0.0.1:{port}/scheduler", flags=(GATES,)))
        webhook = cpl.start_webhook(cp, api)
        extender = cpl.ExtenderRunner(cp, port)
        extender.ensure()
        yield cp, api, extender
        extender.stop()
        cpl.stop_webhook(cp, api, webhook)
    finally:
        for proc in reversed(started):
            with contextlib.suppress(Exception):
                proc.stop()
        with contextlib.suppress(Exception):
            cp.stop()


def test_pods_of_a_pod_group_are_placed_together_once_min_count_are_there(gated):
    _, api, extender = gated
    core = client.CoreV1Api(api)
    namespace = f"pg-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    cpl.create_cluster_object(api, "gpupools", {"apiVersion": f"{cpl.TF_GROUP}/{cpl.TF_VERSION}",
                                                "kind": "GPUPool", "metadata": {"name": pool}, "spec": {}})
    cpl.wait_for_webhook_pool(api, pool)
    nodes = []
    for n in range(2):
        node = f"{pool}-n{n}"
        for i in range(2):
            cpl.create_gpu(api, f"{node}-gpu-{i}", node, pool=pool, index=i, **CAP)
        cpl.create_node(api, node)
        nodes.append(node)
    for node in nodes:
        extender.wait_node_allocated(node, 0.0)
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "scheduling.k8s.io", "v1alpha2", namespace, "podgroups", {
            "apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup", "metadata": {"name": "trainer"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 3}}}})

    def member(name: str) -> None:
        body = cpl.gpu_pod_body(name, pool=pool, tflops="10", vram="100Gi")
        body["spec"]["schedulingGroup"] = {"podGroupName": "trainer"}
        cpl.create_pod(api, namespace, body)

    member("m0")
    member("m1")
    time.sleep(8)  # two of three: neither kube-scheduler's gang wait nor the extender lets one through
    assert [core.read_namespaced_pod(n, namespace).spec.node_name for n in ("m0", "m1")] == [None, None]
    member("m2")
    names = ("m0", "m1", "m2")
    placed = {n: cpl.wait_for_pod_bound(api, namespace, n, timeout=90).spec.node_name for n in names}
    assert set(placed.values()) <= set(nodes)
    assert all(cpl.pod_events(api, namespace, n, "GangPlaced") for n in placed)

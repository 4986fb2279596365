"""``kubectl get gpupool`` shows a PHASE, as under TensorFusion: the extender's status writer
(``--write-gpu-status``) sets ``status.phase`` and the ``Ready`` condition from the pool's nodes, and says
which node holds it back."""

from __future__ import annotations

import uuid

import pytest

from tests import harness as cpl

pytestmark = pytest.mark.e2e


def _pool_status(api_client, pool: str) -> dict:
    from kubernetes import client

    obj = client.CustomObjectsApi(api_client).get_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION,
                                                                        "gpupools", pool)
    return obj.get("status") or {}


def _ready(status: dict) -> dict:
    return next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})


def test_gpupool_phase_follows_its_nodes_and_names_the_one_not_ready(
        api_client, cluster, webhook, extender_runner, make_pool, make_gpu, make_node):
    from kubernetes import client

    extender_runner.ensure(write_gpu_status=True, gpu_status_interval="200ms")
    pool = make_pool("CompactFirst")
    node = f"ps-{uuid.uuid4().hex[:6]}"
    make_gpu(f"{node}-gpu-0", node, pool=pool, index=0, tflops="100", vram="40Gi")
    make_node(node, kwok=False)  # its status is the test's: Ready, then not
    cpl.wait_until(lambda: _pool_status(api_client, pool).get("phase") == "Running", 60,
                   what="the pool's phase Running")
    status = _pool_status(api_client, pool)
    assert (status["readyNodes"], status["notReadyNodes"]) == (1, 0)
    assert (_ready(status)["status"], _ready(status)["message"]) == ("True", "all 1 nodes Ready")

    client.CoreV1Api(api_client).patch_node_status(node, {"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "test"}]}})
    cpl.wait_until(lambda: _pool_status(api_client, pool).get("phase") == "Updating", 60,
                   what="the pool's phase Updating")
    ready = _ready(_pool_status(api_client, pool))
    assert (ready["status"], ready["reason"]) == ("False", "NodesNotReady")
    assert ready["message"] == f"1 of 1 nodes not Ready: {node}"

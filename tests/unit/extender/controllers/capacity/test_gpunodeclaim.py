"""The claims a Karpenter-mode launch creates: the GPUNodeClaim and its NodeClaim as TensorFusion and
Karpenter read them, and GPU models as label values."""

from __future__ import annotations

from extender.controllers.capacity.gpunodeclaim import gpunodeclaim_body, nodeclaim_body
from extender.planning.catalog import parse_catalog
from extender.planning.offerings import offerings
from extender.planning.pool import pool_config
from tests.unit.fixtures.capacity import CATALOG, REF, karpenter_pool


def test_claim_bodies() -> None:
    config = pool_config(karpenter_pool())
    (offer,) = [
        o for o in offerings(parse_catalog(CATALOG), config.requirements) if o.capacity_type == "spot"
    ]
    gnc = gpunodeclaim_body(config, offer, "kp-abc")
    # TensorFusion's key and ours, so claims are read by either
    assert gnc["metadata"]["labels"] == {"tensor-fusion.ai/managed-by": "kp",
                                         "tensor-fusion.ai/gpupool": "kp"}
    assert gnc["metadata"]["annotations"] == {"tensor-fusion.ai/hourly-pricing": "0.5"}
    assert gnc["metadata"]["ownerReferences"][0]["uid"] == "pool-uid"
    assert gnc["spec"] == {
        "instanceType": "small.x1",
        "capacityType": "spot",
        "gpuDeviceOffered": 1,
        "tflopsOffered": "100",
        "vramOffered": "24Gi",
        "zone": "z1",
        "nodeClassRef": REF,
    }
    nc = nodeclaim_body(config, offer, "kp-abc", "gnc-uid")
    assert nc["metadata"]["annotations"] == {"karpenter.sh/do-not-disrupt": "true"}
    assert nc["metadata"]["ownerReferences"][0] == {
        "apiVersion": "tensor-fusion.ai/v1",
        "kind": "GPUNodeClaim",
        "name": "kp-abc",
        "uid": "gnc-uid",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert (
        nc["metadata"]["labels"]["team"] == "ml" and nc["metadata"]["labels"]["nvidia.com/gpu.count"] == "1"
    )
    assert nc["spec"]["nodeClassRef"] == {k: REF[k] for k in ("group", "kind", "name")}
    assert nc["spec"]["requirements"] == [
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["small.x1"]},
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]},
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]},
    ]
    assert nc["spec"]["taints"] == [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]
    assert nc["spec"]["resources"] == {"requests": {"nvidia.com/gpu": "1"}}


def test_gpu_model_becomes_a_valid_label_value() -> None:
    from extender.controllers.capacity.gpunodeclaim import label_value
    from extender.scheduling.gpu_models import lookup

    assert label_value("A100 80GB") == "A100-80GB" and lookup("A100-80GB").model == "A100 80GB"
    assert label_value("RTX 6000 Ada") == "RTX-6000-Ada" and label_value(" x ") == "x"


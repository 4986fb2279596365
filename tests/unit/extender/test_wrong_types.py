"""Every field of every CRD the project reads, set in turn to each of the sweep's eighteen wrong values (None,
0, -1, 10^30, NaN, the infinities, booleans, "", text, 5,000 digits, lists, maps, dates): each parser answers
with a problem naming the field, or reads the value as absent where that is the documented rule, and never
raises. (GPUPool: tests/unit/extender/planning/test_pool.py; its defrag section: controllers/defrag;
computingVendor: controllers/capacity/test_vendors.py; plan and simulate end to end: test_plan_isolation.py.)

``metadata`` and the top-level ``spec``/``status`` are typed by the API server's schema; the offline tools
name objects whose sections are not objects before any parser sees them (``simulate_cmd.screen``). Those
paths need only not raise."""

from __future__ import annotations

from typing import Any

import pytest

from extender.autoscaling.config import parse_config as parse_autoscaling
from extender.cloud.nodeclass import parse_node_class
from extender.controllers.tfcluster import derive
from extender.scheduling.state import ClusterState, Kind
from tests.unit.fixtures.sweep import Path, field_name, sweep
from tests.unit.fixtures.webhook import POOL_A, SCHEDULER, pod, tf, view
from webhook.mutation import mutate


def _typed_by_the_api(path: Path) -> str | None:
    return None if path[0] == "metadata" or len(path) == 1 else field_name(path)


NODE_CLASS = {"kind": "GPUNodeClass", "metadata": {"name": "gpu"}, "spec": {
    "osImageSelectorTerms": [{"id": "ami-1"}], "subnetSelectorTerms": [{"tags": {"a": "b"}}],
    "securityGroupSelectorTerms": [{"id": "sg"}],
    "blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": {"volumeSize": "100Gi", "encrypted": True}}],
    "userData": "x", "tags": {"a": "b"}, "instanceProfile": "p",
    "metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 2}}}

CLUSTER = {"kind": "TensorFusionCluster", "metadata": {"name": "c", "uid": "u"}, "spec": {
    "gpuPools": [{"name": "p", "isDefault": True, "specTemplate": {
        "capacityConfig": {"minResources": {"tflops": "1"}},
        "nodeManagerConfig": {"provisioningMode": "Karpenter"}}}],
    "computingVendor": {"type": "aws", "params": {"defaultRegion": "r"}}}}

AUTOSCALING = {
    "autoSetResources": {"enable": True, "targetResource": "all", "targetComputePercentile": 0.9,
                         "historyDataPeriod": "2h", "upperBoundComputePercentile": 0.99},
    "cronScalingRules": [{"enable": True, "name": "n", "start": "0 9 * * *", "end": "0 17 * * *",
                          "desiredResources": {"requests": {"tflops": "1", "vram": "1Gi"},
                                               "limits": {"tflops": "2", "vram": "2Gi"}}}],
    "externalScaler": {"url": "https://x", "enable": True, "initialDelayPeriod": "1m"}}

GPU = {"kind": "GPU", "metadata": {"name": "g", "labels": {"tensor-fusion.ai/gpupool": "p"}}, "status": {
    "nodeSelector": {"kubernetes.io/hostname": "n"}, "capacity": {"tflops": "100", "vram": "40Gi"},
    "gpuModel": "A100", "vendor": "NVIDIA", "index": 0, "phase": "Running", "usedBy": "tensor-fusion",
    "isolationMode": "soft"}}

TEMPLATE = {"kind": "SchedulingConfigTemplate", "metadata": {"name": "tmpl"}, "spec": {
    "placement": {"mode": "CompactFirst"},
    "verticalScalingRules": [{"name": "r", "selector": {
        "matchLabels": {"a": "b"}, "matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]},
        "autoScaling": {"autoSetResources": {"enable": True, "targetResource": "vram"}}}]}}

PROFILE = {"kind": "WorkloadProfile", "metadata": {"name": "prof", "namespace": "team"}, "spec": {
    "resources": {"requests": {"tflops": "1", "vram": "1Gi"}, "limits": {"tflops": "2", "vram": "2Gi"}},
    "gpuCount": 1, "qos": "low", "poolName": "pool-a", "isolation": "soft",
    "autoScalingConfig": {"autoSetResources": {"enable": True, "targetResource": "all"}}}}

POOL = {**POOL_A, "spec": {"schedulingConfigTemplate": "tmpl", "qosConfig": {"defaultQoS": "low"}}}


def test_a_gpu_node_class() -> None:
    failures = sweep(NODE_CLASS, lambda obj: list(parse_node_class(obj).problems), named=_typed_by_the_api)
    assert not failures, "\n".join(failures)


def test_a_tensor_fusion_clusters_pools() -> None:
    # gpuPools is what the TensorFusionCluster controller reads (its specTemplate becomes a GPUPool, read by
    # pool_config); computingVendor is parse_vendor's
    failures = sweep(CLUSTER, lambda obj: derive.plan(obj, []).problems,
                     named=lambda path: None if path[:2] != ("spec", "gpuPools") or "specTemplate" in path[3:]
                     or path[3:4] == ("isDefault",) else field_name(path))
    assert not failures, "\n".join(failures)


def test_an_autoscaling_config() -> None:
    failures = sweep(AUTOSCALING, lambda obj: list(parse_autoscaling(obj).problems))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(("obj", "kind"), [(GPU, Kind.GPU), (TEMPLATE, Kind.TEMPLATE), (POOL, Kind.POOL)],
                         ids=["GPU", "SchedulingConfigTemplate", "GPUPool"])
def test_the_scheduling_inventory_reads_a_wrong_field_as_absent(obj: dict[str, Any], kind: Kind) -> None:
    """The inventory's rule: a GPU whose capacity, node or name cannot be read is no GPU; a template
    without a readable mode has the default mode. None of it may raise (one bad object would stop the
    informer's others)."""
    def load(o: Any) -> list[str]:
        ClusterState().apply(kind, "ADDED", o)
        return []
    assert not sweep(obj, load, named=lambda path: None)


def test_a_workload_profile_is_a_denial_naming_its_field() -> None:
    def admit(profile: Any) -> list[str]:
        result = mutate(pod(tf(workload_profile="prof")), view(POOL_A, profile), scheduler_name=SCHEDULER,
                        index=1, namespace="team")
        if result.denial is None:
            return []
        assert result.denial.reason.startswith("tensor-fusion.ai/"), result.denial  # a key, never "internal"
        return [result.denial.message]

    failures = sweep(PROFILE, admit, named=_typed_by_the_api, skip=lambda path: path[0] == "metadata")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("obj", [TEMPLATE, POOL], ids=["SchedulingConfigTemplate", "GPUPool"])
def test_the_webhook_reads_templates_and_pools_without_an_internal_error(obj: dict[str, Any]) -> None:
    def admit(changed: Any) -> list[str]:
        others = [o for o in (POOL, TEMPLATE) if o["kind"] != changed.get("kind")]
        result = mutate(pod(tf(tflops_request="1"), labels={"a": "b"}), view(*others, changed),
                        scheduler_name=SCHEDULER, index=1)
        return [result.denial.message] if result.denial is not None else []
    failures = sweep(obj, admit, named=lambda path: None, skip=lambda path: path[0] == "metadata")
    assert not failures, "\n".join(failures)

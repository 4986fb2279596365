"""Inventory: TensorFusion GPU objects and GFD node labels (the model table: test_gpu_models.py)."""

from __future__ import annotations

from typing import Any

import pytest

from extender.scheduling.inventory import (
    NANO,
    gpu_from_object,
    gpus_from_node_labels,
    pool_is_default,
    pool_template,
    template_mode,
)
from tests.unit.fixtures.fakes import gpu

GIB = 1 << 30


def gpu_object(**status: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "nodeSelector": {"kubernetes.io/hostname": "node-a"},
        "capacity": {"tflops": "989", "vram": "80Gi"},
        "available": {"tflops": "989", "vram": "80Gi"},
        "gpuModel": "H100",
        "vendor": "NVIDIA",
        "index": 3,
        "phase": "Running",
        "usedBy": "tensor-fusion",
        "isolationMode": "soft",
        "uuid": "GPU-1",
        "message": "",
    }
    base.update(status)
    return {
        "apiVersion": "tensor-fusion.ai/v1",
        "kind": "GPU",
        "metadata": {"name": "gpu-1", "labels": {"tensor-fusion.ai/gpupool": "pool-a"}},
        "status": base,
    }


def test_gpu_object_fields_are_read_from_the_upstream_schema() -> None:
    device = gpu_from_object(gpu_object())
    assert device is not None
    assert (device.name, device.node, device.pool, device.model, device.vendor, device.index) == (
        "gpu-1",
        "node-a",
        "pool-a",
        "H100",
        "NVIDIA",
        3,
    )
    assert device.capacity_tflops == 989 * NANO
    assert device.capacity_vram == 80 * GIB
    assert device.schedulable


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"capacity": {"tflops": 312, "vram": 42949672960}}, (312 * NANO, 40 * GIB)),
        ({"capacity": {"tflops": "1500m", "vram": "16Gi"}}, (1500 * NANO // 1000, 16 * GIB)),
    ],
)
def test_capacity_accepts_integers_and_quantities(status: dict[str, Any], expected: tuple[int, int]) -> None:
    device = gpu_from_object(gpu_object(**status))
    assert device is not None
    assert (device.capacity_tflops, device.capacity_vram) == expected


@pytest.mark.parametrize(
    "status",
    [
        {"capacity": {}},
        {"capacity": {"tflops": "lots", "vram": "80Gi"}},
        {"nodeSelector": {}},
    ],
)
def test_gpu_object_without_node_or_capacity_is_ignored(status: dict[str, Any]) -> None:
    assert gpu_from_object(gpu_object(**status)) is None


@pytest.mark.parametrize(
    ("phase", "used_by", "schedulable"),
    [
        ("Running", "tensor-fusion", True),
        ("Running", "", True),
        ("Running", "nvidia-device-plugin", False),
        ("Pending", "tensor-fusion", False),
        ("Destroying", "tensor-fusion", False),
    ],
)
def test_only_running_gpus_free_for_tensor_fusion_schedule(
    phase: str, used_by: str, schedulable: bool
) -> None:
    device = gpu_from_object(gpu_object(phase=phase, usedBy=used_by))
    assert device is not None
    assert device.schedulable is schedulable


def test_vendor_defaults_to_nvidia_and_index_may_be_absent() -> None:
    obj = gpu_object()
    del obj["status"]["vendor"], obj["status"]["index"]
    device = gpu_from_object(obj)
    assert device is not None
    assert (device.vendor, device.index) == ("NVIDIA", None)


def test_gfd_labels_give_one_synthetic_gpu_per_device() -> None:
    labels = {
        "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559",
        "tensor-fusion.ai/gpupool": "pool-b",
    }
    devices = gpus_from_node_labels("node-a", labels, default_pool="default")
    assert [d.name for d in devices] == ["node-a-gpu-0", "node-a-gpu-1"]
    assert [d.index for d in devices] == [0, 1]
    assert {(d.model, d.vendor, d.pool, d.phase) for d in devices} == {
        ("H100", "NVIDIA", "pool-b", "Running")
    }
    assert {(d.capacity_tflops, d.capacity_vram) for d in devices} == {(989 * NANO, 81559 << 20)}


@pytest.mark.parametrize(
    ("labels", "default_pool", "expected_pool", "expected_vram"),
    [
        (
            {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.product": "NVIDIA-L4"},
            "default",
            "default",
            24 * GIB,
        ),
        ({"nvidia.com/gpu.count": "1", "nvidia.com/gpu.product": "NVIDIA-L4"}, None, None, 24 * GIB),
    ],
)
def test_gfd_vram_falls_back_to_the_table_and_pool_to_the_default(
    labels: dict[str, str], default_pool: str | None, expected_pool: str | None, expected_vram: int
) -> None:
    [device] = gpus_from_node_labels("n", labels, default_pool)
    assert (device.pool, device.capacity_vram) == (expected_pool, expected_vram)


def test_gfd_node_with_unknown_product_has_no_gpus() -> None:
    labels = {"nvidia.com/gpu.count": "4", "nvidia.com/gpu.product": "Mystery-GPU"}
    assert gpus_from_node_labels("n", labels, None) == []


def test_pool_and_template_fields() -> None:
    pool = {
        "metadata": {"name": "p", "annotations": {"tensor-fusion.ai/is-default-pool": "true"}},
        "spec": {"schedulingConfigTemplate": "tmpl"},
    }
    template = {"metadata": {"name": "tmpl"}, "spec": {"placement": {"mode": "CompactFirst"}}}
    assert (pool_is_default(pool), pool_template(pool), template_mode(template)) == (
        True,
        "tmpl",
        "CompactFirst",
    )
    assert (pool_is_default({"metadata": {}}), pool_template({}), template_mode({})) == (False, None, None)


def test_the_dcgm_uuid_of_a_gpu_named_as_tensorfusion_names_it() -> None:
    from extender.scheduling.inventory import gpu_from_object

    obj = gpu("gpu-7d8429d5-531d-d6a6-6510-3b662081a75a", "n1")
    device = gpu_from_object(obj)
    assert device is not None and device.dcgm_uuid == "GPU-7d8429d5-531d-d6a6-6510-3b662081a75a"
    obj["status"]["uuid"] = "GPU-ABC"
    device = gpu_from_object(obj)
    assert device is not None and device.dcgm_uuid == "GPU-ABC"


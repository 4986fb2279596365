"""The built-in GPU model table: the model and TFLOPS GPU Feature Discovery's product labels name."""

from __future__ import annotations

import pytest

from extender.scheduling import gpu_models


@pytest.mark.parametrize(
    ("product", "model", "tflops"),
    [
        ("NVIDIA-H100-80GB-HBM3", "H100", 989),
        ("NVIDIA-H100-PCIe", "H100 PCIe", 756),
        ("NVIDIA-H100-NVL", "H100 NVL", 835),
        ("NVIDIA-H200", "H200", 989),
        ("NVIDIA-B200", "B200", 2250),
        ("NVIDIA-A100-SXM4-80GB", "A100 80GB", 312),
        ("NVIDIA-A100-PCIE-40GB", "A100", 312),
        ("NVIDIA-A10", "A10", 125),
        ("NVIDIA-A10G", "A10G", 70),
        ("NVIDIA-L40S", "L40S", 362),
        ("NVIDIA-L40", "L40", 181),
        ("NVIDIA-L4", "L4", 121),
        ("Tesla-T4", "T4", 65),
        ("Tesla-V100-SXM2-32GB", "V100 32GB", 125),
        ("NVIDIA-RTX-6000-Ada-Generation", "RTX 6000 Ada", 364),
        ("AMD Instinct MI300X", "MI300X", 1307),
    ],
)
def test_gpu_model_table_matches_product_labels(product: str, model: str, tflops: int) -> None:
    spec = gpu_models.lookup(product)
    assert spec is not None
    assert (spec.model, spec.tflops) == (model, tflops)


@pytest.mark.parametrize("product", ["NVIDIA-GeForce-GTX-1080", "NVIDIA-A1000", ""])
def test_unknown_products_have_no_table_entry(product: str) -> None:
    assert gpu_models.lookup(product) is None


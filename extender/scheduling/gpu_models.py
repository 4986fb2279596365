"""Built-in table of common data-centre GPU models, for nodes known only by their GFD labels.

TFLOPS are FP16 dense tensor-core figures from the vendors' data sheets (no sparsity); VRAM is the
marketed size. A node's ``nvidia.com/gpu.memory`` label, when present, wins over the table's VRAM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

_GIB = 1 << 30


@dataclass(frozen=True)
class GPUModelSpec:
    model: str
    vendor: str
    tflops: Fraction
    vram: int  # bytes
    tokens: tuple[str, ...]  # all must appear in the normalised product name


def _spec(model: str, tflops: float, vram_gib: int, *tokens: str, vendor: str = "NVIDIA") -> GPUModelSpec:
    return GPUModelSpec(model, vendor, Fraction(str(tflops)), vram_gib * _GIB, tokens or (model.upper(),))


MODELS: tuple[GPUModelSpec, ...] = (
    _spec("GB200", 2500, 186),
    _spec("B200", 2250, 180),
    _spec("B100", 1750, 180),
    _spec("H200", 989, 141),
    _spec("GH200", 989, 96),
    _spec("H100", 989, 80),
    _spec("H100 PCIe", 756, 80, "H100", "PCIE"),
    _spec("H100 NVL", 835, 94, "H100", "NVL"),
    _spec("H800", 989, 80),
    _spec("H20", 148, 96),
    _spec("A100", 312, 40),
    _spec("A100 80GB", 312, 80, "A100", "80GB"),
    _spec("A800", 312, 80),
    _spec("A40", 150, 48),
    _spec("A30", 165, 24),
    _spec("A10", 125, 24),
    _spec("A10G", 70, 24),
    _spec("L40S", 362, 48),
    _spec("L40", 181, 48),
    _spec("L20", 119.5, 48),
    _spec("L4", 121, 24),
    _spec("T4", 65, 16),
    _spec("V100", 125, 16),
    _spec("V100 32GB", 125, 32, "V100", "32GB"),
    _spec("RTX 6000 Ada", 364, 48, "RTX", "6000", "ADA"),
    _spec("RTX A6000", 155, 48, "A6000"),
    _spec("MI300X", 1307, 192, vendor="AMD"),
    _spec("MI325X", 1307, 256, vendor="AMD"),
    _spec("MI250X", 383, 128, vendor="AMD"),
    _spec("MI210", 181, 64, vendor="AMD"),
)


def product_tokens(product: str) -> frozenset[str]:
    """``NVIDIA-H100-80GB-HBM3`` -> {NVIDIA, H100, 80GB, HBM3}; whole tokens keep A10 from matching A100."""
    return frozenset(t for t in re.split(r"[^0-9A-Z]+", product.upper()) if t)


def lookup(product: str) -> GPUModelSpec | None:
    """The most specific table entry whose tokens all occur in the product label, if any."""
    tokens = product_tokens(product)
    best: GPUModelSpec | None = None
    for spec in MODELS:
        if all(t in tokens for t in spec.tokens) and (best is None or len(spec.tokens) > len(best.tokens)):
            best = spec
    return best

"""The instance catalog: which GPU instance types can be launched, what they hold and what they cost.

A built-in default lists common AWS GPU instance types (GPU model and count, per-GPU VRAM, vCPUs,
memory, architecture and the published us-east-1 on-demand Linux price). A user's catalog (a YAML file
or a ConfigMap's ``catalog.yaml``) extends it, replaces entries of the same name, or replaces it all
with ``replaceDefaults: true``::

    instanceTypes:
    - name: g5.xlarge
      arch: amd64
      gpuModel: A10G
      gpuCount: 1
      tflopsPerGPU: "125"     # optional; from the GPU model table when absent
      vramPerGPU: 24Gi
      prices: {on-demand: 1.006, spot: 0.42}   # USD per hour; spot and reserved optional
      zones: [us-east-1a]     # optional; any zone the pool allows when absent
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import yaml

from extender.common.numbers import NumberError, parse_int
from extender.planning.amounts import Amount, CapacityError, parse_quantity_field
from extender.scheduling import gpu_models

CAPACITY_TYPES = ("on-demand", "spot", "reserved")
CONFIGMAP_KEY = "catalog.yaml"


@dataclass(frozen=True)
class InstanceType:
    name: str
    arch: str
    gpu_model: str
    vendor: str
    gpu_count: int
    tflops_per_gpu: Fraction
    vram_per_gpu: int
    prices: Mapping[str, Fraction]  # capacity type -> USD per hour
    vcpu: int = 0
    memory: int = 0  # bytes
    zones: tuple[str, ...] = ()
    region: str = ""

    @property
    def capacity(self) -> Amount:
        return Amount(self.tflops_per_gpu * self.gpu_count, self.vram_per_gpu * self.gpu_count)

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def size(self) -> str:
        return self.name.split(".", 1)[1] if "." in self.name else ""


@dataclass(frozen=True)
class Catalog:
    types: tuple[InstanceType, ...] = field(default_factory=tuple)

    def get(self, name: str) -> InstanceType | None:
        return next((t for t in self.types if t.name == name), None)


_GI = 1 << 30


def _aws(name: str, model: str, count: int, vram_gib: int, vcpu: int, memory_gib: int, price: str,
         arch: str = "amd64", tflops: str | None = None) -> InstanceType:
    spec = gpu_models.lookup(model)
    per_gpu = Fraction(tflops) if tflops is not None else spec.tflops if spec else Fraction(0)
    return InstanceType(name=name, arch=arch, gpu_model=model, vendor="NVIDIA", gpu_count=count,
                        tflops_per_gpu=per_gpu, vram_per_gpu=vram_gib * _GI,
                        prices={"on-demand": Fraction(price)}, vcpu=vcpu, memory=memory_gib * _GI)


DEFAULT_TYPES: tuple[InstanceType, ...] = (
    _aws("g4dn.xlarge", "T4", 1, 16, 4, 16, "0.526"),
    _aws("g4dn.2xlarge", "T4", 1, 16, 8, 32, "0.752"),
    _aws("g4dn.12xlarge", "T4", 4, 16, 48, 192, "3.912"),
    _aws("g5g.xlarge", "T4G", 1, 16, 4, 8, "0.42", arch="arm64", tflops="65"),
    _aws("g5.xlarge", "A10G", 1, 24, 4, 16, "1.006"),
    _aws("g5.2xlarge", "A10G", 1, 24, 8, 32, "1.212"),
    _aws("g5.12xlarge", "A10G", 4, 24, 48, 192, "5.672"),
    _aws("g5.48xlarge", "A10G", 8, 24, 192, 768, "16.288"),
    _aws("g6.xlarge", "L4", 1, 24, 4, 16, "0.8048"),
    _aws("g6.12xlarge", "L4", 4, 24, 48, 192, "4.6016"),
    _aws("g6e.xlarge", "L40S", 1, 48, 4, 32, "1.861"),
    _aws("g6e.12xlarge", "L40S", 4, 48, 48, 384, "10.493"),
    _aws("p3.2xlarge", "V100", 1, 16, 8, 61, "3.06"),
    _aws("p4d.24xlarge", "A100", 8, 40, 96, 1152, "32.7726"),
    _aws("p5.48xlarge", "H100", 8, 80, 192, 2048, "98.32"),
)

DEFAULT_CATALOG = Catalog(DEFAULT_TYPES)


def _price(raw: object, where: str) -> Fraction:
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise CapacityError(f"{where}={raw!r}: expected a price in USD per hour")
    try:
        value = Fraction(str(raw).strip())
    except (ValueError, ZeroDivisionError) as exc:
        raise CapacityError(f"{where}={raw!r}: expected a price in USD per hour") from exc
    if value < 0:
        raise CapacityError(f"{where}={raw!r}: must not be negative")
    return value


def parse_instance_type(raw: Mapping[str, Any], where: str) -> InstanceType:
    name = str(raw.get("name") or "")
    if not name:
        raise CapacityError(f"{where}: needs a name")
    where = f"{where} ({name})"
    model = str(raw.get("gpuModel") or "")
    count = raw.get("gpuCount", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise CapacityError(f"{where}.gpuCount={count!r}: expected a positive integer")
    spec = gpu_models.lookup(model) if model else None
    if raw.get("tflopsPerGPU") is not None:
        tflops = parse_quantity_field(raw["tflopsPerGPU"], f"{where}.tflopsPerGPU")
    elif spec is not None:
        tflops = spec.tflops
    else:
        raise CapacityError(f"{where}: gpuModel {model!r} is not in the GPU model table; give tflopsPerGPU")
    if raw.get("vramPerGPU") is not None:
        vram = math.floor(parse_quantity_field(raw["vramPerGPU"], f"{where}.vramPerGPU"))
    elif spec is not None:
        vram = spec.vram
    else:
        raise CapacityError(f"{where}: give vramPerGPU")
    if tflops <= 0 or vram <= 0:
        raise CapacityError(f"{where}: tflopsPerGPU and vramPerGPU must be positive")
    prices_raw = raw.get("prices")
    if not isinstance(prices_raw, Mapping) or not prices_raw:
        raise CapacityError(f"{where}.prices: expected a map such as {{on-demand: 1.006, spot: 0.42}}")
    prices: dict[str, Fraction] = {}
    for key, value in prices_raw.items():
        capacity_type = normalise_capacity_type(str(key))
        if capacity_type is None:
            raise CapacityError(f"{where}.prices: unknown capacity type {key!r}; "
                                f"expected {', '.join(CAPACITY_TYPES)}")
        prices[capacity_type] = _price(value, f"{where}.prices.{key}")
    memory = raw.get("memory")
    return InstanceType(
        name=name, arch=str(raw.get("arch") or "amd64"), gpu_model=model or (spec.model if spec else ""),
        vendor=str(raw.get("vendor") or (spec.vendor if spec else "NVIDIA")), gpu_count=count,
        tflops_per_gpu=tflops, vram_per_gpu=vram, prices=prices,
        vcpu=_vcpu(raw.get("vcpu"), f"{where}.vcpu"),
        memory=math.floor(parse_quantity_field(memory, f"{where}.memory")) if memory is not None else 0,
        zones=tuple(str(z) for z in raw.get("zones") or ()), region=str(raw.get("region") or ""),
    )


def normalise_capacity_type(value: str) -> str | None:
    """``OnDemand``/``on-demand`` -> ``on-demand``, ``Spot`` -> ``spot``, ``Reserved`` -> ``reserved``."""
    key = value.strip().lower().replace("-", "").replace("_", "")
    return {"ondemand": "on-demand", "spot": "spot", "reserved": "reserved"}.get(key)


def merge(base: Catalog, extra: Iterable[InstanceType], replace: bool = False) -> Catalog:
    merged: dict[str, InstanceType] = {} if replace else {t.name: t for t in base.types}
    for item in extra:
        merged[item.name] = item
    return Catalog(tuple(sorted(merged.values(), key=lambda t: t.name)))


def parse_catalog(text: str, base: Catalog = DEFAULT_CATALOG) -> Catalog:
    """A user catalog (YAML) merged over ``base``; CapacityError names the first bad entry."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CapacityError(f"catalog: not YAML: {exc}") from exc
    except (ValueError, RecursionError) as exc:  # an integer of over 4,300 digits; nesting too deep
        raise CapacityError(f"catalog: not readable YAML: {' '.join(str(exc).split())[:120]}") from None
    if isinstance(document, Mapping) and document.get("kind") == "ConfigMap":
        data = document.get("data") or {}
        if CONFIGMAP_KEY not in data:
            raise CapacityError(f"catalog ConfigMap: needs the key {CONFIGMAP_KEY}")
        return parse_catalog(str(data[CONFIGMAP_KEY]), base)
    if document is None:
        return base
    if not isinstance(document, Mapping) or not isinstance(document.get("instanceTypes", []), list):
        raise CapacityError("catalog: expected a map with an instanceTypes list")
    items = [parse_instance_type(raw, f"instanceTypes[{i}]") if isinstance(raw, Mapping) else
             _not_a_map(i) for i, raw in enumerate(document.get("instanceTypes") or [])]
    return merge(base, items, replace=bool(document.get("replaceDefaults")))


def _vcpu(raw: object, where: str) -> int:
    if raw is None or raw == "":
        return 0
    try:
        return parse_int(raw, minimum=0)
    except NumberError as exc:
        raise CapacityError(f"{where}: {exc}") from None


def _not_a_map(index: int) -> InstanceType:
    raise CapacityError(f"instanceTypes[{index}]: expected a map")

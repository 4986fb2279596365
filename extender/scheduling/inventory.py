"""GPU inventory read from API objects (DESIGN §4): TensorFusion GPU objects, GFD node labels, pools.

TFLOPS are kept as integer nano-TFLOPS so that capacity arithmetic is exact and fast; requests round
up and capacities round down, so rounding can never hand out more than a GPU has.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from extender.common.contract import DEFAULT_POOL_ANNOTATION, POOL_LABEL_ON_GPU, USED_BY_TAINT_VALUE
from extender.common.labels import GFD_COUNT, GFD_MEMORY, GFD_PRODUCT, HOSTNAME, INSTANCE_TYPE
from extender.common.numbers import MAX_DIGITS, parse_int
from extender.common.quantity import QuantityError, parse_quantity
from extender.scheduling import gpu_models
from extender.scheduling.instance_topology import Shape
from extender.scheduling.topology import Link

NANO = 10**9
GFD_LABELS = (GFD_COUNT, GFD_PRODUCT, GFD_MEMORY)
RUNNING = "Running"
MAX_SYNTHETIC_GPUS = 64


@dataclass(frozen=True)
class GPUDevice:
    name: str
    node: str
    pool: str | None
    model: str
    vendor: str
    index: int | None
    phase: str
    used_by: str
    isolation_mode: str
    capacity_tflops: int  # nano-TFLOPS
    capacity_vram: int  # bytes
    synthetic: bool = False
    uuid: str = ""  # status.uuid: the device UUID as NVML (and so dcgm-exporter) writes it
    numa_node: int | None = None  # status.numaNode (-1 there: none)
    links: tuple[Link, ...] = ()  # status.topology.peers, else status.nvLink.peers as NVLink (tier 0)

    @property
    def dcgm_uuid(self) -> str:
        """The ``UUID`` label dcgm-exporter gives this GPU: status.uuid, else the name TensorFusion derives
        from it (the UUID lower-cased, so ``gpu-<hex>`` is ``GPU-<hex>``)."""
        if self.uuid and not self.synthetic:
            return self.uuid
        return "GPU-" + self.name[4:] if self.name.startswith("gpu-") else self.name

    @property
    def schedulable(self) -> bool:
        return self.phase == RUNNING and self.used_by in ("", USED_BY_TAINT_VALUE)


def nano_tflops_floor(value: Fraction) -> int:
    return math.floor(value * NANO)


def nano_tflops_ceil(value: Fraction) -> int:
    return math.ceil(value * NANO)


def tflops_of(nano: int) -> Fraction:
    return Fraction(nano, NANO)


def _quantity(raw: object) -> Fraction | None:
    if isinstance(raw, bool) or raw is None:
        return None
    if isinstance(raw, int | float):
        if not math.isfinite(raw) or raw < 0 or abs(raw) > 1e30:  # NaN, the infinities: no capacity
            return None
        return Fraction(raw)
    try:
        value = parse_quantity(str(raw)).value
    except QuantityError:
        return None
    return value if value >= 0 else None


def _map(raw: object) -> Mapping[str, Any]:
    """``raw`` when it is an object, else an empty one: a field of the wrong type reads as absent (the
    offline tools name such objects before they get here; the API server's schema types these)."""
    return raw if isinstance(raw, Mapping) else {}


def _list(raw: object) -> list[Any]:
    """``raw`` when it is a list, else an empty one (as ``_map``)."""
    return raw if isinstance(raw, list) else []


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _map(_map(obj.get("metadata")).get("labels"))


def _int(raw: object) -> int | None:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else None


MBPS = 1_000_000  # nvLink bandwidths are in MB/s, topology bandwidths in bytes per second


def topology_of(status: Mapping[str, Any]) -> tuple[int | None, tuple[Link, ...]]:
    """A GPU object's NUMA node and peer links. TensorFusion's scheduler reads ``status.topology.peers``
    (tiers the hypervisor worked out); where a GPU has none, its ``status.nvLink.peers`` count as tier 0."""
    numa = _int(status.get("numaNode"))
    links: list[Link] = []
    for peer in _list(_map(status.get("topology")).get("peers")):
        if isinstance(peer, Mapping) and peer.get("peerGPUUUID") and _int(peer.get("tier")) is not None:
            links.append(Link(str(peer["peerGPUUUID"]), int(peer["tier"]), _int(peer.get("bandwidth")) or 0))
    if not links:
        for peer in _list(_map(status.get("nvLink")).get("peers")):
            if isinstance(peer, Mapping) and peer.get("peerUUID"):
                links.append(Link(str(peer["peerUUID"]), 0, (_int(peer.get("bandwidthMBps")) or 0) * MBPS))
    return (numa if numa is None or numa >= 0 else None), tuple(links)


def gpu_from_object(obj: Mapping[str, Any]) -> GPUDevice | None:
    """A TensorFusion GPU object as a device, or None when it lacks a name, node or capacity."""
    name = _map(obj.get("metadata")).get("name")
    status = _map(obj.get("status"))
    node = _map(status.get("nodeSelector")).get(HOSTNAME)
    capacity = _map(status.get("capacity"))
    tflops = _quantity(capacity.get("tflops"))
    vram = _quantity(capacity.get("vram"))
    if not name or not node or tflops is None or vram is None:
        return None
    index = status.get("index")
    pool = _labels(obj).get(POOL_LABEL_ON_GPU)
    numa, links = topology_of(status)
    return GPUDevice(
        name=str(name),
        node=str(node),
        pool=str(pool) if pool else None,
        model=str(status.get("gpuModel") or ""),
        vendor=str(status.get("vendor") or "NVIDIA"),
        index=index if isinstance(index, int) and not isinstance(index, bool) else None,
        phase=str(status.get("phase") or "Pending"),
        used_by=str(status.get("usedBy") or ""),
        isolation_mode=str(status.get("isolationMode") or "soft"),
        capacity_tflops=nano_tflops_floor(tflops),
        capacity_vram=math.floor(vram),
        uuid=str(status.get("uuid") or ""),
        numa_node=numa,
        links=links,
    )


def has_gfd_labels(labels: Mapping[str, Any]) -> bool:
    return GFD_COUNT in labels and GFD_PRODUCT in labels


def gpus_from_node_labels(node: str, labels: Mapping[str, Any], default_pool: str | None,
                          shapes: Mapping[str, Shape] | None = None) -> list[GPUDevice]:
    """One synthetic device per GPU that GPU Feature Discovery reports; none for unknown products. Where
    ``shapes`` (the instance-type table) knows the node's instance type and GPU count, the devices carry its
    NUMA nodes and NVLink peers."""
    raw_count = str(labels.get(GFD_COUNT, ""))
    spec = gpu_models.lookup(str(labels.get(GFD_PRODUCT, "")))
    if spec is None or not raw_count.isdigit() or len(raw_count) > MAX_DIGITS:
        return []
    count = min(parse_int(raw_count), MAX_SYNTHETIC_GPUS)
    memory = str(labels.get(GFD_MEMORY, ""))
    mib = parse_int(memory) if memory.isdigit() and len(memory) <= MAX_DIGITS else 0
    vram = mib << 20 if mib > 0 else spec.vram
    pool = labels.get(POOL_LABEL_ON_GPU) or default_pool
    shape = (shapes or {}).get(str(labels.get(INSTANCE_TYPE, "")))
    if shape is not None and shape.gpus != count:
        shape = None  # a partial or odd node: its links would name GPUs that are not there

    def uuid_of(i: int) -> str:
        return f"{node}-gpu-{i}"

    return [
        GPUDevice(
            name=uuid_of(i),
            node=node,
            pool=str(pool) if pool else None,
            model=spec.model,
            vendor=spec.vendor,
            index=i,
            phase=RUNNING,
            used_by="",
            isolation_mode="soft",
            capacity_tflops=nano_tflops_floor(spec.tflops),
            capacity_vram=vram,
            synthetic=True,
            uuid=uuid_of(i) if shape is not None else "",
            numa_node=shape.topology(i)[0] if shape is not None else None,
            links=shape.links(i, uuid_of) if shape is not None else (),
        )
        for i in range(count)
    ]


def object_name(obj: Mapping[str, Any]) -> str:
    name = _map(obj.get("metadata")).get("name")
    return name if isinstance(name, str) else ""


def node_labels(obj: Mapping[str, Any]) -> dict[str, str]:
    """The labels of a Node that matter to the inventory."""
    labels = _labels(obj)
    return {k: str(v) for k, v in labels.items()
            if k in GFD_LABELS or k in (POOL_LABEL_ON_GPU, INSTANCE_TYPE)}


def pool_template(obj: Mapping[str, Any]) -> str | None:
    template = _map(obj.get("spec")).get("schedulingConfigTemplate")
    return template if isinstance(template, str) and template else None


def pool_is_default(obj: Mapping[str, Any]) -> bool:
    annotations = _map(_map(obj.get("metadata")).get("annotations"))
    return str(annotations.get(DEFAULT_POOL_ANNOTATION, "")).lower() == "true"


def template_topology(obj: Mapping[str, Any]) -> object:
    """A SchedulingConfigTemplate's ``spec.placement.gpuTopology`` (TensorFusion's plugin args), raw."""
    return _map(_map(obj.get("spec")).get("placement")).get("gpuTopology")


def template_mode(obj: Mapping[str, Any]) -> str | None:
    mode = _map(_map(obj.get("spec")).get("placement")).get("mode")
    return mode if isinstance(mode, str) and mode else None

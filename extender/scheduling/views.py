"""Read-only views of the picture: per-GPU figures, occupancy and utilisation (for the status writer,
the planners, ``tf-extender status`` and the simulator)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from extender.scheduling.cluster import Cluster
from extender.scheduling.inventory import GPUDevice, tflops_of
from extender.scheduling.placement import Slot, mean_load


@dataclass(frozen=True)
class GPUView:
    name: str
    node: str
    pool: str | None
    model: str
    vendor: str
    index: int | None
    phase: str
    capacity_tflops: Fraction
    capacity_vram: int
    used_tflops: Fraction
    used_vram: int
    used_percent: float  # 0.7*VRAM% + 0.3*TFLOPS%
    device: GPUDevice  # the inventory record behind the view


@dataclass(frozen=True)
class UsageFigures:
    tflops_percent: float
    vram_percent: float
    gpus: int
    used_gpus: int
    partially_used_gpus: int
    capacity_tflops: float = 0.0  # TFLOPS
    capacity_vram_bytes: int = 0


@dataclass(frozen=True)
class Utilisation:
    nodes: dict[str, UsageFigures]
    pools: dict[str, UsageFigures]
    partially_used_gpus: int


def node_gpus(cluster: Cluster, node: str) -> list[GPUView]:
    return [
        GPUView(
            name=s.device.name, node=node, pool=s.device.pool, model=s.device.model,
            vendor=s.device.vendor, index=s.device.index, phase=s.device.phase,
            capacity_tflops=tflops_of(s.device.capacity_tflops), capacity_vram=s.device.capacity_vram,
            used_tflops=tflops_of(s.used_tflops), used_vram=s.used_vram, used_percent=s.used,
            device=s.device,
        )
        for s in cluster.slots(node)
    ]


def pool_occupancy(cluster: Cluster, pool: str) -> dict[str, tuple[int, int, float]]:
    """Per node with GPUs of ``pool``: how many it has, how many hold an allocation, their mean load."""
    out = {}
    for node in cluster.devices:
        slots = [s for s in cluster.slots(node) if s.device.pool == pool]
        if slots:
            out[node] = (len(slots), sum(1 for s in slots if not s.idle), mean_load(slots))
    return out


def held_gpus(cluster: Cluster) -> dict[str, str]:
    """GPU name -> node, for every GPU that a bound pod (not a bind in flight) holds a share of."""
    ledger = cluster.ledger
    return {gpu: a.node for a in ledger.allocations() if ledger.bound(a.uid) is a for gpu in a.gpu_ids}


def gpu_usage(cluster: Cluster) -> dict[str, tuple[Fraction, int]]:
    """Allocated TFLOPS and VRAM per known GPU."""
    return {
        s.device.name: (tflops_of(s.used_tflops), s.used_vram)
        for node in cluster.devices for s in cluster.slots(node)
    }


def utilisation(cluster: Cluster) -> Utilisation:
    nodes: dict[str, list[Slot]] = {}
    pools: dict[str, list[Slot]] = {}
    for node in sorted(cluster.devices):
        for slot in cluster.slots(node):
            nodes.setdefault(node, []).append(slot)
            if slot.device.pool:
                pools.setdefault(slot.device.pool, []).append(slot)
    node_figures = {name: figures(slots) for name, slots in nodes.items()}
    return Utilisation(
        nodes=node_figures,
        pools={name: figures(slots) for name, slots in sorted(pools.items())},
        partially_used_gpus=sum(f.partially_used_gpus for f in node_figures.values()),
    )


def figures(slots: Sequence[Slot]) -> UsageFigures:
    cap_t = sum(s.device.capacity_tflops for s in slots)
    cap_v = sum(s.device.capacity_vram for s in slots)
    used_t = sum(s.used_tflops for s in slots)
    used_v = sum(s.used_vram for s in slots)
    return UsageFigures(
        tflops_percent=100.0 * used_t / cap_t if cap_t else 0.0,
        vram_percent=100.0 * used_v / cap_v if cap_v else 0.0,
        gpus=len(slots),
        used_gpus=sum(1 for s in slots if not s.idle),
        partially_used_gpus=sum(1 for s in slots if not s.idle and 0.0 < s.used < 100.0),
        capacity_tflops=float(tflops_of(cap_t)), capacity_vram_bytes=cap_v,
    )

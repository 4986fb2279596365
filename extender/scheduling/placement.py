"""Placement math of DESIGN §5: GPU load, fit checks with user-facing reasons, node and GPU order.

Everything here is a pure function over ``Slot`` values (a device plus what is allocated on it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction

from extender.common.contract import GPURequest, format_bytes, format_tflops
from extender.scheduling.inventory import GPUDevice, nano_tflops_ceil, tflops_of
from extender.scheduling.topology import (
    DEFAULT_SETTINGS,
    Plan,
    Settings,
    Source,
    Tier,
    TopologyGPU,
    TopologyMode,
    choose,
    set_tier,
)
from extender.scheduling.topology import hard_verdict as topology_hard_verdict

MAX_SCORE = 10
MIN_FIT_SCORE = 1  # a fitting node never scores like a node that does not fit (0)


class Mode(StrEnum):
    COMPACT_FIRST = "CompactFirst"
    LOW_LOAD_FIRST = "LowLoadFirst"
    NODE_COMPACT_GPU_LOW_LOAD = "NodeCompactGPULowLoad"


DEFAULT_MODE = Mode.NODE_COMPACT_GPU_LOW_LOAD


def parse_mode(value: str | None) -> Mode | None:
    try:
        return Mode(value) if value else None
    except ValueError:
        return None


class Fit(StrEnum):
    FITS = "fits"
    FAILED = "failed"  # releasing allocations could help
    UNRESOLVABLE = "unresolvable"  # nothing on this node can help


@dataclass(frozen=True, slots=True)
class Slot:
    device: GPUDevice
    used_tflops: int = 0  # nano-TFLOPS
    used_vram: int = 0
    whole_holders: int = 0  # shared pods holding the GPU whole
    holders: int = 0  # pods on the GPU, of any size: a shared pod takes only a GPU that none holds
    # ``load`` of this use, worked out once: the modes sort and average by it many times per pod
    used: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        device = self.device
        object.__setattr__(self, "used", load(device.capacity_tflops, device.capacity_vram, self.used_tflops,
                                              self.used_vram))

    @property
    def name(self) -> str:
        return self.device.name

    @property
    def free_tflops(self) -> int:
        return self.device.capacity_tflops - self.used_tflops

    @property
    def free_vram(self) -> int:
        return self.device.capacity_vram - self.used_vram

    @property
    def idle(self) -> bool:
        return self.used_tflops == 0 and self.used_vram == 0 and self.whole_holders == 0 and self.holders == 0


@dataclass(frozen=True)
class Verdict:
    fit: Fit
    message: str = ""
    fitting: tuple[Slot, ...] = field(default=(), repr=False)


def percent_used(capacity: int, used: int) -> float:
    """``100*(1 - free/capacity)``; a dimension with no capacity counts as full."""
    return 100.0 * used / capacity if capacity > 0 else 100.0


def load(cap_tflops: int, cap_vram: int, used_tflops: int, used_vram: int) -> float:
    """``used = 0.7*used_v + 0.3*used_t`` in percent, rounded so equal loads compare equal."""
    return round(0.7 * percent_used(cap_vram, used_vram) + 0.3 * percent_used(cap_tflops, used_tflops), 9)


@dataclass(frozen=True, slots=True)
class Demand:
    """A request's per-GPU amounts in integer units, so the hot fit checks avoid ``Fraction``."""

    whole: bool
    tflops: int  # nano-TFLOPS, when not a percent
    percent_num: int  # percent as numerator / denominator, when a percent
    percent_den: int
    vram: int

    @classmethod
    def of(cls, request: GPURequest) -> Demand:
        """The demand of ``request``, remembered per request object: the ledger and the fit checks ask for
        the same requests (parsed once per pod) many times, and the arithmetic goes through ``Fraction``."""
        known = _DEMANDS.get(id(request))
        if known is not None and known[0] is request:
            return known[1]
        demand = cls._of(request)
        if len(_DEMANDS) >= _DEMANDS_KEPT:
            _DEMANDS.clear()
        _DEMANDS[id(request)] = (request, demand)  # the request is kept alive, so its id is not reused
        return demand

    @classmethod
    def _of(cls, request: GPURequest) -> Demand:
        percent = request.percent_request
        tflops = nano_tflops_ceil(request.tflops_request or Fraction(0))
        if percent is None:
            return cls(request.takes_whole_gpu, tflops, 0, 0, request.vram_request)
        return cls(request.takes_whole_gpu, 0, percent.numerator, percent.denominator * 100,
                   request.vram_request)

    def need(self, cap_tflops: int, cap_vram: int) -> tuple[int, int]:
        """Nano-TFLOPS and bytes taken from a GPU of this capacity; percent rounds up."""
        if self.whole:
            return cap_tflops, cap_vram
        if self.percent_den:
            return -(-self.percent_num * cap_tflops // self.percent_den), self.vram
        return self.tflops, self.vram


_DEMANDS_KEPT = 4096
_DEMANDS: dict[int, tuple[GPURequest, Demand]] = {}


def share_on(request: GPURequest, cap_tflops: int, cap_vram: int) -> tuple[int, int]:
    """Nano-TFLOPS and bytes the request takes from a GPU of the given capacity (rounded up)."""
    return Demand.of(request).need(cap_tflops, cap_vram)


def gpu_order_key(mode: Mode, slot: Slot) -> tuple[float, str]:
    """Sort key for GPUs inside a node: CompactFirst fills the busiest GPU, the others the idlest."""
    return (-slot.used if mode is Mode.COMPACT_FIRST else slot.used, slot.name)


def node_order_value(mode: Mode, mean_used: float) -> float:
    """Ascending sort value of a node: LowLoadFirst prefers the lowest mean load, the others the highest."""
    return mean_used if mode is Mode.LOW_LOAD_FIRST else -mean_used


def mean_load(slots: Iterable[Slot]) -> float:
    loads = [s.used for s in slots]
    return round(sum(loads) / len(loads), 9) if loads else 0.0


def topology_settings(request: GPURequest, pool: Settings | None = None) -> Settings:
    """The topology settings for this pod: its pool's (TensorFusion's defaults when None), then its
    annotations' overrides."""
    return (pool or DEFAULT_SETTINGS).for_pod(request.topology_required, request.topology_max_tier,
                                              request.topology_source)


def topology_plan(fitting: Iterable[Slot], request: GPURequest, mode: Mode,
                  topology: Settings | None = None) -> Plan:
    """The GPUs a pod gets among ``fitting`` (one node's), with their tier: the best topology tier first,
    then the placement mode's GPU order (TensorFusion since its #759)."""
    settings = topology_settings(request, topology)
    by_name = {s.name: s for s in fitting}
    compact = mode is Mode.COMPACT_FIRST

    def score(gpu: TopologyGPU) -> float:
        used = by_name[gpu.name].used
        return used if compact else -used

    devices = sorted((s.device for s in by_name.values()), key=lambda d: d.name)
    return choose(devices, request.gpu_count, settings.source, settings.prefer_least_damage, score)


def choose_gpus(fitting: Iterable[Slot], request: GPURequest, mode: Mode,
                topology: Settings | None = None) -> tuple[str, ...]:
    """The GPUs a pod gets on a node (see ``topology_plan``); ``topology`` is the pool's setting."""
    fitting = list(fitting)
    if len(fitting) < request.gpu_count:
        return ()
    return topology_plan(fitting, request, mode, topology).gpus


def tier_of(slots: Iterable[Slot], gpu_ids: Iterable[str], source: str | None = None) -> Tier:
    """The tier of a pod's GPUs (``gpu_ids``) on the node of ``slots``."""
    wanted = set(gpu_ids)
    return set_tier([s.device for s in slots if s.name in wanted], Source(source or "auto"))


def _tf(nano: int) -> str:
    return format_tflops(tflops_of(nano))


def _mismatch(device: GPUDevice, request: GPURequest) -> int:
    """0 when the device matches; else the position of the first failing check (for the message)."""
    if request.gpu_model is not None and device.model != request.gpu_model:
        return 1
    if request.vendor is not None and device.vendor != request.vendor:
        return 2
    if request.gpu_indices and device.index not in request.gpu_indices:
        return 3
    if not device.schedulable:
        return 4
    return 0


def _mismatch_message(reason: int, request: GPURequest) -> str:
    pool = request.pool
    if reason == 1:
        return f"no GPU of model {request.gpu_model} in pool {pool} on this node"
    if reason == 2:
        return f"no GPU of vendor {request.vendor} in pool {pool} on this node"
    if reason == 3:
        indices = ",".join(str(i) for i in request.gpu_indices)
        return f"no GPU with index {indices} in pool {pool} on this node"
    return f"no Running GPU free for tensor-fusion in pool {pool} on this node"


def _fits_now(slot: Slot, need_t: int, need_v: int, whole: bool) -> bool:
    if whole:
        return slot.idle
    return slot.whole_holders == 0 and slot.free_tflops >= need_t and slot.free_vram >= need_v


def fitting_slots(slots: Iterable[Slot], request: GPURequest, demand: Demand | None = None) -> list[Slot]:
    """Slots that match the request and have room for it right now (``_mismatch`` and ``_fits_now``,
    inlined: this runs for every GPU of every node judged)."""
    out = []
    demand = demand or Demand.of(request)
    pool, whole, need = request.pool, demand.whole, demand.need
    narrowed = request.gpu_model is not None or request.vendor is not None or bool(request.gpu_indices)
    for slot in slots:
        device = slot.device
        if device.pool != pool or not device.schedulable or (narrowed and _mismatch(device, request)):
            continue
        if whole:
            if slot.idle:
                out.append(slot)
            continue
        need_t, need_v = need(device.capacity_tflops, device.capacity_vram)
        if (slot.whole_holders == 0 and device.capacity_tflops - slot.used_tflops >= need_t
                and device.capacity_vram - slot.used_vram >= need_v):
            out.append(slot)
    return out


def node_fits(slots: Sequence[Slot], request: GPURequest, pods_on_node: int, max_pods: int,
              topology: Settings | None = None) -> bool:
    if is_hard(request, topology):
        return evaluate(slots, request, pods_on_node, max_pods, topology=topology).fit is Fit.FITS
    return pods_on_node < max_pods and len(fitting_slots(slots, request)) >= request.gpu_count


def evaluate(slots: Sequence[Slot], request: GPURequest, pods_on_node: int, max_pods: int,
             demand: Demand | None = None, topology: Settings | None = None) -> Verdict:
    """Whether the node fits, and if not whether evicting pods could help, with the numbers why.
    ``topology`` is the pool's topology setting: in hard mode a node whose best free GPU set is worse
    than the allowed tier does not fit."""
    count = request.gpu_count
    if not slots:
        return Verdict(Fit.UNRESOLVABLE, "node has no GPUs known to the extender")
    demand = demand or Demand.of(request)
    if pods_on_node < max_pods:  # fast path: most nodes fit, and then no reason needs wording
        fitting = tuple(fitting_slots(slots, request, demand))
        if len(fitting) >= count:
            settings = topology_settings(request, topology)
            if settings.mode is TopologyMode.HARD:
                return _hard_topology(slots, request, fitting, settings)
            return Verdict(Fit.FITS, fitting=fitting)
    in_pool = [s for s in slots if s.device.pool == request.pool]
    if not in_pool:
        return Verdict(Fit.UNRESOLVABLE, f"no GPU in pool {request.pool} on this node")
    reasons = [_mismatch(s.device, request) for s in in_pool]
    matching = [s for s, r in zip(in_pool, reasons, strict=True) if r == 0]
    if not matching:
        return Verdict(Fit.UNRESOLVABLE, _mismatch_message(min(reasons), request))
    if len(matching) < count:
        return Verdict(
            Fit.UNRESOLVABLE,
            f"need {count} matching GPUs in pool {request.pool} on one node; this node has {len(matching)}",
        )
    whole = demand.whole
    needs = {s.name: demand.need(s.device.capacity_tflops, s.device.capacity_vram) for s in matching}
    big_enough = [
        s for s in matching
        if s.device.capacity_tflops >= needs[s.name][0] and s.device.capacity_vram >= needs[s.name][1]
    ]
    if not big_enough:
        return Verdict(Fit.UNRESOLVABLE, _too_large(matching, needs))
    if len(big_enough) < count:
        return Verdict(
            Fit.UNRESOLVABLE,
            f"need {count} GPUs large enough for {_amount(request)}; this node has {len(big_enough)}",
        )
    fitting = tuple(s for s in big_enough if _fits_now(s, *needs[s.name], whole))
    if pods_on_node >= max_pods:
        return Verdict(Fit.FAILED, f"node already runs {pods_on_node} GPU pods (limit {max_pods})")
    return Verdict(Fit.FAILED, _busy(request, big_enough, fitting))


def is_hard(request: GPURequest, topology: Settings | None) -> bool:
    return topology_settings(request, topology).mode is TopologyMode.HARD


def _hard_topology(slots: Sequence[Slot], request: GPURequest, fitting: tuple[Slot, ...],
                   settings: Settings) -> Verdict:
    """Hard mode: the node fits only if its best free set is within the allowed tier. When even its whole
    matching GPUs (were they all free) could not be, nothing on this node can help."""
    plan = choose([s.device for s in sorted(fitting, key=lambda s: s.name)], request.gpu_count,
                  settings.source, settings.prefer_least_damage)
    why = topology_hard_verdict(plan, settings)
    if why is None:
        return Verdict(Fit.FITS, fitting=fitting)
    matching = sorted((s.device for s in slots if s.device.pool == request.pool
                       and not _mismatch(s.device, request)), key=lambda d: d.name)
    best = choose(matching, request.gpu_count, settings.source, settings.prefer_least_damage)
    if topology_hard_verdict(best, settings) is None:
        return Verdict(Fit.FAILED, f"{why} (a tier-{int(best.tier)} set is held by other pods)")
    return Verdict(Fit.UNRESOLVABLE, why)


def _amount(request: GPURequest) -> str:
    if request.takes_whole_gpu:
        return "a whole GPU"
    if request.percent_request is not None:
        compute = f"{format_tflops(request.percent_request)}% compute"
    else:
        compute = f"{format_tflops(request.tflops_request or Fraction(0))} TFLOPS"
    return f"{compute} and {format_bytes(request.vram_request)} VRAM"


def _too_large(matching: Sequence[Slot], needs: dict[str, tuple[int, int]]) -> str:
    largest_t = max(matching, key=lambda s: (s.device.capacity_tflops, s.name))
    if needs[largest_t.name][0] > largest_t.device.capacity_tflops:
        return (f"request {_tf(needs[largest_t.name][0])} TFLOPS exceeds the largest GPU here "
                f"({_tf(largest_t.device.capacity_tflops)} TFLOPS)")
    largest_v = max(matching, key=lambda s: (s.device.capacity_vram, s.name))
    return (f"request {format_bytes(needs[largest_v.name][1])} VRAM exceeds the largest GPU here "
            f"({format_bytes(largest_v.device.capacity_vram)})")


def _busy(request: GPURequest, candidates: Sequence[Slot], fitting: Sequence[Slot]) -> str:
    fitting_names = {s.name for s in fitting}
    others = [s for s in candidates if s.name not in fitting_names]
    best = min(others, key=lambda s: (s.used, s.name))
    plural = "GPU" if request.gpu_count == 1 else "GPUs"
    if request.takes_whole_gpu:
        head = f"need {request.gpu_count} idle {plural} in pool {request.pool}; {len(fitting)} idle"
    else:
        head = (f"need {request.gpu_count} {plural} with {_amount(request)} free in pool {request.pool}; "
                f"{len(fitting)} {'fits' if len(fitting) == 1 else 'fit'}")
    if best.whole_holders:
        return f"{head}, best other GPU is held whole by a shared pod"
    return (f"{head}, best other GPU has {_tf(max(best.free_tflops, 0))} TFLOPS and "
            f"{format_bytes(max(best.free_vram, 0))} free")


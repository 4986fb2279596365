"""The quota checks: a pod (or several pods of one namespace at once) against its namespace's quotas.

Single caps (per GPU requests and limits, GPU count) are unresolvable: no preemption, no new node makes the
pod fit. Totals are unschedulable: they clear when the namespace's pods go (or are preempted). A dimension
the demand adds nothing to is not checked, so a pod that takes no VRAM is never refused because a lowered
VRAM total is already exceeded, and a resize that shrinks passes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction

from extender.common.contract import format_bytes, format_tflops
from extender.quota.model import Amounts, Quota
from extender.quota.usage import NO_USAGE, Demand, Usage


class Dimension(StrEnum):
    """What a refusal is about (TensorFusion's resource names in its quota errors)."""

    SINGLE_TFLOPS_REQUEST = "single.max.tflops.request"
    SINGLE_VRAM_REQUEST = "single.max.vram.request"
    SINGLE_TFLOPS_LIMIT = "single.max.tflops.limit"
    SINGLE_VRAM_LIMIT = "single.max.vram.limit"
    SINGLE_GPU_COUNT = "single.max.gpuCount.limit"
    TOTAL_TFLOPS_REQUEST = "total.max.tflops.request"
    TOTAL_VRAM_REQUEST = "total.max.vram.request"
    TOTAL_TFLOPS_LIMIT = "total.max.tflops.limit"
    TOTAL_VRAM_LIMIT = "total.max.vram.limit"
    TOTAL_WORKERS = "total.max.workers.limit"


@dataclass(frozen=True)
class Refusal:
    namespace: str
    quota: str  # the GPUResourceQuota's name
    dimension: Dimension
    used: str  # rendered figures, as the message shows them
    requested: str
    cap: str
    unresolvable: bool  # a single cap: no preemption or expansion helps

    @property
    def message(self) -> str:
        used = f"used {self.used}, " if not self.unresolvable else ""
        return (f"GPU quota exceeded in namespace {self.namespace} (GPUResourceQuota {self.quota}) for "
                f"{self.dimension.value}: {used}requested {self.requested}, cap {self.cap}")


def _tflops(value: Fraction) -> str:
    return f"{format_tflops(value)} TFLOPS"


def _vram(value: int) -> str:
    return format_bytes(value)


def _single(quota: Quota, demand: Demand) -> Refusal | None:
    def refuse(dimension: Dimension, requested: str, cap: str) -> Refusal:
        return Refusal(quota.namespace, quota.name, dimension, "", requested, cap, True)

    caps = ((quota.max_requests, demand.per_gpu_requests, Dimension.SINGLE_TFLOPS_REQUEST,
             Dimension.SINGLE_VRAM_REQUEST),
            (quota.max_limits, demand.per_gpu_limits, Dimension.SINGLE_TFLOPS_LIMIT,
             Dimension.SINGLE_VRAM_LIMIT))
    for cap, asked, tflops_dim, vram_dim in caps:
        if cap.tflops and asked.tflops > cap.tflops:
            return refuse(tflops_dim, _tflops(asked.tflops) + " per GPU", _tflops(cap.tflops))
        if cap.vram and asked.vram > cap.vram:
            return refuse(vram_dim, _vram(asked.vram) + " per GPU", _vram(cap.vram))
    if quota.max_gpu_count and demand.gpu_count > quota.max_gpu_count:
        return refuse(Dimension.SINGLE_GPU_COUNT, f"{demand.gpu_count} GPUs", f"{quota.max_gpu_count} GPUs")
    return None


def _over_total(quota: Quota, cap: Amounts | None, used: Amounts, asked: Amounts, tflops_dim: Dimension,
                vram_dim: Dimension) -> Refusal | None:
    if cap is None:
        return None
    if asked.tflops > 0 and used.tflops + asked.tflops > cap.tflops:
        return Refusal(quota.namespace, quota.name, tflops_dim, _tflops(used.tflops), _tflops(asked.tflops),
                       _tflops(cap.tflops), False)
    if asked.vram > 0 and used.vram + asked.vram > cap.vram:
        return Refusal(quota.namespace, quota.name, vram_dim, _vram(used.vram), _vram(asked.vram),
                       _vram(cap.vram), False)
    return None


def check(quotas: Iterable[Quota], usage: Usage | None, namespace: str,
          requests: Sequence[Demand]) -> Refusal | None:
    """Whether ``requests`` (the demands of pods of ``namespace``, admitted together: one pod, a gang, a
    resize's delta) may be added to the namespace's ``usage`` (which must not already count them): the
    first refusal of the namespace's quotas, single caps before totals, or None. Every quota of the
    namespace applies (several in one namespace all hold, as Kubernetes' ResourceQuotas do)."""
    mine = [q for q in quotas if q.namespace == namespace]
    if not mine or not requests:
        return None
    for quota in mine:
        for demand in requests:
            if (refusal := _single(quota, demand)) is not None:
                return refusal
    used = usage or NO_USAGE
    asked = requests[0]
    for demand in requests[1:]:
        asked = Demand(asked.requests + demand.requests, asked.limits + demand.limits,
                       workers=asked.workers + demand.workers)
    for quota in mine:
        refusal = (_over_total(quota, quota.total_requests, used.requests, asked.requests,
                               Dimension.TOTAL_TFLOPS_REQUEST, Dimension.TOTAL_VRAM_REQUEST)
                   or _over_total(quota, quota.total_limits, used.limits, asked.limits,
                                  Dimension.TOTAL_TFLOPS_LIMIT, Dimension.TOTAL_VRAM_LIMIT))
        if refusal is not None:
            return refusal
        if asked.workers > 0 and used.workers + asked.workers > quota.max_workers:
            return Refusal(namespace, quota.name, Dimension.TOTAL_WORKERS, f"{used.workers} workers",
                           f"{asked.workers} workers", f"{quota.max_workers} workers", False)
    return None


def room(quotas: Iterable[Quota], usage: Usage | None,
         namespace: str) -> tuple[Amounts | None, Amounts | None]:
    """What the namespace's totals leave for more requests and limits (None: no cap), never below 0: the
    bound a resize's growth is clamped to."""
    used = usage or NO_USAGE
    requests: Amounts | None = None
    limits: Amounts | None = None
    for quota in quotas:
        if quota.namespace != namespace:
            continue
        for cap, spent, kind in ((quota.total_requests, used.requests, "requests"),
                                 (quota.total_limits, used.limits, "limits")):
            if cap is None:
                continue
            left = Amounts(max(cap.tflops - spent.tflops, Fraction(0)), max(cap.vram - spent.vram, 0))
            if kind == "requests":
                requests = left if requests is None else Amounts(min(requests.tflops, left.tflops),
                                                                 min(requests.vram, left.vram))
            else:
                limits = left if limits is None else Amounts(min(limits.tflops, left.tflops),
                                                             min(limits.vram, left.vram))
    return requests, limits

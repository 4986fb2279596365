"""What pods take from their namespace's quota, and a namespace's usage, from the ledger's allocations.

TensorFusion counts request x GPU count per dimension and one worker per allocation. A request given as a
percent of a GPU (or a GPU held whole) counts the TFLOPS and VRAM of the GPUs it lands on, so its demand is
known only once its GPUs are (TensorFusion counts such requests as nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

from extender.common.contract import GPURequest
from extender.quota.model import ZERO, Amounts

Capacity = tuple[Fraction, int]  # one GPU's TFLOPS and VRAM bytes


@dataclass(frozen=True)
class Demand:
    """One pod's (or one resize's) claim on its namespace's quota."""

    requests: Amounts  # over all its GPUs
    limits: Amounts
    per_gpu_requests: Amounts = ZERO  # the most on any one of its GPUs (what single caps compare)
    per_gpu_limits: Amounts = ZERO
    gpu_count: int = 1
    workers: int = 1

    def minus(self, other: Demand) -> Demand:
        """The delta from ``other`` to this one (a resize): amounts and workers subtracted, the per-GPU
        figures and GPU count this one's."""
        return Demand(self.requests - other.requests, self.limits - other.limits, self.per_gpu_requests,
                      self.per_gpu_limits, self.gpu_count, self.workers - other.workers)


@dataclass(frozen=True)
class Usage:
    """A namespace's usage: requests and limits over its pods' GPUs, and its workers (pods)."""

    requests: Amounts = ZERO
    limits: Amounts = ZERO
    workers: int = 0

    def plus(self, demand: Demand) -> Usage:
        return Usage(self.requests + demand.requests, self.limits + demand.limits,
                     self.workers + demand.workers)

    def minus(self, demand: Demand) -> Usage:
        return Usage(self.requests - demand.requests, self.limits - demand.limits,
                     self.workers - demand.workers)


NO_USAGE = Usage()


def needs_gpus(request: GPURequest) -> bool:
    """Whether the request's amounts depend on the GPUs it lands on (a percent, or GPUs held whole)."""
    return request.takes_whole_gpu or request.uses_percent


def demand_of(request: GPURequest, capacities: Sequence[Capacity] | None = None) -> Demand | None:
    """The demand of ``request`` on GPUs of ``capacities`` (one per GPU); None when the amounts depend on
    the GPUs (``needs_gpus``) and they are not given."""
    if needs_gpus(request) and capacities is None:
        return None
    count = request.gpu_count
    per_gpu: Sequence[Capacity] = capacities if capacities is not None else [(Fraction(0), 0)] * count
    requests = limits = most_request = most_limit = ZERO
    for cap_tflops, cap_vram in per_gpu:
        if request.takes_whole_gpu:
            req = lim = Amounts(cap_tflops, cap_vram)
        else:
            if request.percent_request is not None:
                tflops = request.percent_request / 100 * cap_tflops
                tflops_limit = (request.percent_limit or request.percent_request) / 100 * cap_tflops
            else:
                tflops = request.tflops_request or Fraction(0)
                tflops_limit = request.tflops_limit if request.tflops_limit is not None else tflops
            req = Amounts(tflops, request.vram_request)
            lim = Amounts(max(tflops_limit, tflops), max(request.vram_limit, request.vram_request))
        requests, limits = requests + req, limits + lim
        most_request, most_limit = most_request.most(req), most_limit.most(lim)
    return Demand(requests, limits, most_request, most_limit, count)


def namespace_of(pod_key: str) -> str:
    return pod_key.partition("/")[0]


class AllocationLike(Protocol):
    """What ``demands`` reads of an allocation (``extender.scheduling.ledger.Allocation``)."""

    @property
    def uid(self) -> str: ...
    @property
    def pod_key(self) -> str: ...
    @property
    def gpu_ids(self) -> tuple[str, ...]: ...
    @property
    def request(self) -> GPURequest: ...


def demands(allocations: Iterable[AllocationLike], capacity_of: Callable[[str], Capacity | None],
            request_of: Callable[[AllocationLike], GPURequest] | None = None,
            ) -> dict[str, tuple[str, Demand]]:
    """Per pod uid: its namespace and demand, from the allocations the ledger counts (bound pods, binds in
    flight, filters' holds). ``request_of`` may give an allocation's full request where the ledger's lacks
    the limits (a pod read back after a restart: its bind record holds the requests only). A GPU whose
    capacity is unknown counts as 0."""
    out: dict[str, tuple[str, Demand]] = {}
    for allocation in allocations:
        request = request_of(allocation) if request_of is not None else allocation.request
        capacities = [capacity_of(gpu) or (Fraction(0), 0) for gpu in allocation.gpu_ids]
        demand = demand_of(request.model_copy(update={"gpu_count": len(allocation.gpu_ids)}), capacities)
        if demand is not None:
            out[allocation.uid] = (namespace_of(allocation.pod_key), demand)
    return out


def usage_by_namespace(per_pod: Mapping[str, tuple[str, Demand]],
                       leave_out: Iterable[str] = ()) -> dict[str, Usage]:
    """Each namespace's usage: the sum of its pods' demands, without the pods of ``leave_out`` (uids)."""
    skip = set(leave_out)
    out: dict[str, Usage] = {}
    for uid, (namespace, demand) in per_pod.items():
        if uid not in skip:
            out[namespace] = out.get(namespace, NO_USAGE).plus(demand)
    return out

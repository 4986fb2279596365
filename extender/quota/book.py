"""``QuotaBook``: the quotas and each namespace's usage over a cluster state's ledger, for the questions
the verbs, the planners and the status writer ask. No I/O: it reads a state and a list of quota objects.

Usage is recomputed only when the state's version moves (every reservation, release, bind and deletion
moves it), so a burst of filter calls costs one pass over the allocations per change, and the answer is
exactly the ledger's at the moment of the question.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any, Protocol

from extender.common.contract import GPURequest
from extender.common.pods import pod_uid
from extender.quota.check import Refusal, check, room
from extender.quota.model import ZERO, Quota, by_namespace
from extender.quota.usage import (
    NO_USAGE,
    AllocationLike,
    Capacity,
    Demand,
    Usage,
    demand_of,
    demands,
    namespace_of,
    needs_gpus,
    usage_by_namespace,
)


class StateLike(Protocol):
    """What the book reads of ``extender.scheduling.state.ClusterState``."""

    @property
    def version(self) -> int: ...
    def allocations(self) -> Sequence[Any]: ...
    def gpu_capacity(self, gpu: str) -> Capacity | None: ...
    def request_of(self, pod: Mapping[str, Any]) -> GPURequest: ...


def pod_namespace(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("namespace") or "")


class QuotaBook:
    def __init__(self, state: StateLike, quotas: Callable[[], Iterable[Any]],
                 pod_of: Callable[[str], Mapping[str, Any] | None] | None = None) -> None:
        """``quotas``: the GPUResourceQuota objects now (or parsed ``Quota``s); ``pod_of(pod_key)``: a
        watched pod, to read the limits of an allocation whose record holds its requests alone."""
        self.state = state
        self._quotas = quotas
        self._pod_of = pod_of
        self._parsed: dict[str, list[Quota]] | None = None
        self._version = -1
        self._per_pod: dict[str, tuple[str, Demand]] = {}
        self._usage: dict[str, Usage] = {}

    def quotas_changed(self, *_: Any) -> None:
        """The quota objects changed (a watch listener as it is)."""
        self._parsed = None

    def by_namespace(self) -> dict[str, list[Quota]]:
        if self._parsed is None:
            self._parsed = by_namespace(self._quotas())
        return self._parsed

    def quotas(self, namespace: str) -> list[Quota]:
        return self.by_namespace().get(namespace, [])

    # --- usage ------------------------------------------------------------------------------------

    def _refresh(self) -> None:
        version = self.state.version
        if version != self._version:
            self._per_pod = demands(self.state.allocations(), self.state.gpu_capacity, self._full_request)
            self._usage = usage_by_namespace(self._per_pod)
            self._version = version

    def usage(self, namespace: str, leave_out: Iterable[str] = ()) -> Usage:
        """The namespace's usage now, without the pods of ``leave_out`` (uids)."""
        self._refresh()
        used = self._usage.get(namespace, NO_USAGE)
        for uid in leave_out:
            held = self._per_pod.get(uid)
            if held is not None and held[0] == namespace:
                used = used.minus(held[1])
        return used

    def usages(self) -> dict[str, Usage]:
        self._refresh()
        return dict(self._usage)

    def demand_held(self, uid: str) -> Demand | None:
        """What a pod the ledger counts takes (on the GPUs it holds)."""
        self._refresh()
        held = self._per_pod.get(uid)
        return held[1] if held is not None else None

    def _full_request(self, allocation: AllocationLike) -> GPURequest:
        request = allocation.request
        if (request.tflops_limit is not None or request.percent_limit is not None or request.vram_limit
                or request.takes_whole_gpu or self._pod_of is None):
            return request
        pod = self._pod_of(allocation.pod_key)
        if pod is None or pod_uid(pod) != allocation.uid:
            return request
        try:
            full = self.state.request_of(pod)
        except Exception:  # a pod whose annotations no longer parse: its requests stand for its limits
            return request
        update: dict[str, Any] = {"vram_limit": max(full.vram_limit, request.vram_request)}
        if request.tflops_request is not None and full.tflops_limit is not None:
            update["tflops_limit"] = max(full.tflops_limit, request.tflops_request)
        if request.percent_request is not None and full.percent_limit is not None:
            update["percent_limit"] = max(full.percent_limit, request.percent_request)
        return request.model_copy(update=update)

    # --- questions --------------------------------------------------------------------------------

    def refusal(self, pod: Mapping[str, Any], request: GPURequest,
                capacities: Sequence[Capacity] | None = None) -> Refusal | None:
        """Whether the pod may take ``request`` (on GPUs of ``capacities`` when known) in its namespace,
        against the usage of every other pod. A request whose amounts depend on its GPUs, not yet known,
        is checked for its GPU count and worker alone."""
        namespace = pod_namespace(pod)
        quotas = self.quotas(namespace)
        if not quotas:
            return None
        demand = demand_of(request, capacities) or Demand(ZERO, ZERO, gpu_count=request.gpu_count)
        return check(quotas, self.usage(namespace, (pod_uid(pod),)), namespace, [demand])

    def refusal_together(self, pods: Sequence[tuple[Mapping[str, Any], GPURequest]]) -> Refusal | None:
        """For pods placed at once (a gang): whether their namespaces' quotas admit all of them together,
        against the usage of every pod but these. The first refusal, or None."""
        by_namespace: dict[str, list[tuple[Mapping[str, Any], GPURequest]]] = {}
        for pod, request in pods:
            by_namespace.setdefault(pod_namespace(pod), []).append((pod, request))
        for namespace, members in by_namespace.items():
            quotas = self.quotas(namespace)
            if not quotas:
                continue
            asked = [demand_of(r) or Demand(ZERO, ZERO, gpu_count=r.gpu_count) for _, r in members]
            used = self.usage(namespace, [pod_uid(p) for p, _ in members])
            if (refusal := check(quotas, used, namespace, asked)) is not None:
                return refusal
        return None

    def blocks(self, pod: Mapping[str, Any], smallest: Capacity | None = None) -> Refusal | None:
        """The refusal for a pod as it asks (its request parsed by the state), None when it may go or its
        request does not parse (the filter says why). A request whose amounts depend on its GPUs (a
        percent, whole GPUs) is judged on GPUs of ``smallest`` capacity when given (the least TFLOPS and
        VRAM of the GPUs it may land on: whatever GPUs it gets, it takes at least that), else on its GPU
        count and worker alone."""
        if not self.quotas(pod_namespace(pod)):
            return None
        try:
            request = self.state.request_of(pod)
        except Exception:
            return None
        floor = [smallest] * request.gpu_count if smallest is not None and needs_gpus(request) else None
        return self.refusal(pod, request, floor)

    def fits_without(self, pod: Mapping[str, Any],
                     request: GPURequest) -> Callable[[Sequence[Any]], bool] | None:
        """For preemption: a test of whether the pod's quota admits it once the given allocations are
        released (only those of its namespace count); None when the namespace has no quota."""
        namespace = pod_namespace(pod)
        quotas = self.quotas(namespace)
        if not quotas:
            return None
        uid = pod_uid(pod)
        demand = demand_of(request) or Demand(ZERO, ZERO, gpu_count=request.gpu_count)

        def fits(released: Sequence[Any]) -> bool:
            gone = [a.uid for a in released if namespace_of(a.pod_key) == namespace]
            return check(quotas, self.usage(namespace, [uid, *gone]), namespace, [demand]) is None

        return fits


    def resize_room(self, pod: Mapping[str, Any], allocation: AllocationLike, tflops: Fraction | None,
                    vram: int | None) -> tuple[Fraction | None, int | None, str]:
        """A resize of a bound pod to ``tflops`` / ``vram`` per GPU (None: unchanged), clamped so that its
        growth (the delta, times its GPUs) stays within what its namespace's totals leave and each figure
        within the single caps; with a note saying so when it clamps ("" when not)."""
        namespace = pod_namespace(pod)
        quotas = self.quotas(namespace)
        request = allocation.request
        if not quotas or request.takes_whole_gpu or request.uses_percent:
            return tflops, vram, ""
        gpus = max(len(allocation.gpu_ids), 1)
        old_t, old_v = request.tflops_request or Fraction(0), request.vram_request
        left, _ = room(quotas, self.usage(namespace), namespace)
        most_t = old_t + left.tflops / gpus if left is not None else None
        most_v = old_v + left.vram // gpus if left is not None else None
        for quota in quotas:
            cap = quota.max_requests
            if cap.tflops:
                most_t = cap.tflops if most_t is None else min(most_t, cap.tflops)
            if cap.vram:
                most_v = cap.vram if most_v is None else min(most_v, cap.vram)
        cut = []
        if tflops is not None and most_t is not None and tflops > max(most_t, old_t):
            tflops = max(most_t, old_t)
            cut.append("TFLOPS")
        if vram is not None and most_v is not None and vram > max(most_v, old_v):
            vram = max(most_v, old_v)
            cut.append("VRAM")
        if not cut:
            return tflops, vram, ""
        spare = f"{left.describe()} left in its totals" if left is not None else "its single caps"
        return tflops, vram, (f"{' and '.join(cut)} clamped by the GPU quota of namespace {namespace} "
                              f"({spare})")

"""The allocation ledger: who holds how much of which GPU (DESIGN §4).

Two sources feed it: bound pods (their ``gpu-ids`` plus request) and in-memory reservations of binds in
flight. A pod counts once: its bound allocation, else its reservation. Per-GPU usage is kept
incrementally; a GPU's usage is recomputed from its holders whenever its capacity becomes known or
changes, so pods and GPU objects may arrive in any order.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from extender.contract import GPURequest
from extender.placement import share_on


@dataclass(frozen=True)
class Allocation:
    uid: str
    pod_key: str  # "namespace/name"
    node: str
    gpu_ids: tuple[str, ...]
    request: GPURequest
    priority: int = 0


@dataclass(frozen=True)
class Usage:
    tflops: int = 0  # nano-TFLOPS
    vram: int = 0
    whole: int = 0  # allocations holding the GPU whole (isolation shared)


_ZERO = Usage()


@dataclass(frozen=True)
class _GPU:
    node: str
    capacity_tflops: int
    capacity_vram: int


class Ledger:
    def __init__(self) -> None:
        self._bound: dict[str, Allocation] = {}
        self._reserved: dict[str, Allocation] = {}
        self._effective: dict[str, Allocation] = {}
        self._holders: dict[str, set[str]] = {}
        self._gpus: dict[str, _GPU] = {}
        self._usage: dict[str, Usage] = {}
        self._pods_per_node: Counter[str] = Counter()
        self._by_node: dict[str, set[str]] = {}

    # --- GPUs -------------------------------------------------------------------------------------

    def set_gpu(self, name: str, node: str, capacity_tflops: int, capacity_vram: int) -> set[str]:
        """Record a GPU's node and capacity; returns the nodes whose usage changed."""
        old = self._gpus.get(name)
        new = _GPU(node, capacity_tflops, capacity_vram)
        if old == new:
            return set()
        self._gpus[name] = new
        self._recompute(name)
        return {node} | ({old.node} if old else set())

    def remove_gpu(self, name: str) -> set[str]:
        old = self._gpus.pop(name, None)
        self._usage.pop(name, None)
        return {old.node} if old else set()

    # --- allocations ------------------------------------------------------------------------------

    def bind(self, allocation: Allocation) -> set[str]:
        """A watched pod shows this allocation; it replaces any reservation of the same pod."""
        self._bound[allocation.uid] = allocation
        self._reserved.pop(allocation.uid, None)
        return self._settle(allocation.uid)

    def forget(self, uid: str) -> set[str]:
        """The pod is gone or finished: neither its allocation nor its reservation holds anything."""
        self._bound.pop(uid, None)
        self._reserved.pop(uid, None)
        return self._settle(uid)

    def unbind(self, uid: str) -> set[str]:
        """The pod no longer shows an allocation; a reservation of it (bind in flight) still counts."""
        self._bound.pop(uid, None)
        return self._settle(uid)

    def reserve(self, allocation: Allocation) -> set[str]:
        self._reserved[allocation.uid] = allocation
        return self._settle(allocation.uid)

    def release(self, allocation: Allocation) -> set[str]:
        """Drop the reservation if it is still this one (idempotent)."""
        if self._reserved.get(allocation.uid) != allocation:
            return set()
        del self._reserved[allocation.uid]
        return self._settle(allocation.uid)

    # --- queries ----------------------------------------------------------------------------------

    def usage(self, gpu: str) -> Usage:
        return self._usage.get(gpu, _ZERO)

    def pods_on(self, node: str) -> int:
        return self._pods_per_node[node]

    def allocation(self, uid: str) -> Allocation | None:
        return self._effective.get(uid)

    def reservation(self, uid: str) -> Allocation | None:
        return self._reserved.get(uid)

    def bound(self, uid: str) -> Allocation | None:
        return self._bound.get(uid)

    def allocations_on(self, node: str) -> list[Allocation]:
        return [self._effective[uid] for uid in sorted(self._by_node.get(node, ()))]

    def holders(self, gpu: str) -> list[Allocation]:
        return [self._effective[uid] for uid in sorted(self._holders.get(gpu, ()))]

    def allocations(self) -> list[Allocation]:
        return [self._effective[uid] for uid in sorted(self._effective)]

    def share(self, allocation: Allocation, gpu: str) -> Usage:
        """What the allocation takes from one GPU (zero while the GPU's capacity is unknown)."""
        info = self._gpus.get(gpu)
        if info is None or gpu not in allocation.gpu_ids:
            return _ZERO
        tflops, vram = share_on(allocation.request, info.capacity_tflops, info.capacity_vram)
        return Usage(tflops, vram, 1 if allocation.request.takes_whole_gpu else 0)

    # --- internals --------------------------------------------------------------------------------

    def _settle(self, uid: str) -> set[str]:
        old = self._effective.get(uid)
        new = self._bound.get(uid) or self._reserved.get(uid)
        if old == new:
            if new is not None:
                # Same figures, but the record that holds them now (e.g. the watched pod's allocation
                # replacing this extender's own reservation): ``bound(uid) is allocation`` must hold.
                self._effective[uid] = new
            return set()
        touched: set[str] = set()
        if old is not None:
            del self._effective[uid]
            touched |= self._apply(old, -1)
        if new is not None:
            self._effective[uid] = new
            touched |= self._apply(new, +1)
        return touched

    def _apply(self, allocation: Allocation, sign: int) -> set[str]:
        uid, node = allocation.uid, allocation.node
        self._pods_per_node[node] += sign
        if self._pods_per_node[node] <= 0:
            del self._pods_per_node[node]
        members = self._by_node.setdefault(node, set())
        if sign > 0:
            members.add(uid)
        else:
            members.discard(uid)
            if not members:
                del self._by_node[node]
        touched = {node}
        for gpu in allocation.gpu_ids:
            holders = self._holders.setdefault(gpu, set())
            if sign > 0:
                holders.add(uid)
            else:
                holders.discard(uid)
                if not holders:
                    del self._holders[gpu]
            info = self._gpus.get(gpu)
            if info is None:
                continue
            delta = self.share(allocation, gpu)
            current = self._usage.get(gpu, _ZERO)
            self._usage[gpu] = Usage(
                current.tflops + sign * delta.tflops,
                current.vram + sign * delta.vram,
                current.whole + sign * delta.whole,
            )
            touched.add(info.node)
        return touched

    def _recompute(self, gpu: str) -> None:
        tflops = vram = whole = 0
        for uid in self._holders.get(gpu, ()):
            delta = self.share(self._effective[uid], gpu)
            tflops += delta.tflops
            vram += delta.vram
            whole += delta.whole
        self._usage[gpu] = Usage(tflops, vram, whole)

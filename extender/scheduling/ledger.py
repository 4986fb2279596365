"""The allocation ledger: who holds how much of which GPU (DESIGN §4).

Two sources feed it: bound pods (their ``gpu-ids`` plus the amounts recorded at bind) and in-memory
reservations of binds in flight. A pod counts once: its bound allocation, else its reservation. Per-GPU
usage is kept incrementally; a GPU's usage is recomputed from its holders whenever its capacity becomes
known or changes, so pods and GPU objects may arrive in any order.

The ledger distrusts what it reads (tenants can write their pods' annotations):

- A bound allocation that matches this ledger's own reservation (same node and GPUs) is *trusted* and
  counted with the amounts this ledger granted, whatever the pod says.
- Any other bound allocation (read after a restart, or written by someone else) is counted only when every
  one of its known GPUs is on the pod's node and has room for it; otherwise it is *refused*: not counted,
  reported through ``on_refused``, and tried again whenever capacity is freed. When a GPU's capacity
  becomes known or shrinks, untrusted holders that no longer fit are refused, the latest admitted first.
- Once a pod's allocation is counted, later changes of its record are not believed (the figures recorded
  at bind time stand) and are reported once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from fractions import Fraction

from extender.common.contract import GPURequest, format_allocated, format_bytes, format_tflops
from extender.scheduling.inventory import nano_tflops_floor, tflops_of
from extender.scheduling.placement import share_on


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


class Distrust(StrEnum):
    """Why the ledger did not believe what a pod says it holds (a metric label)."""

    NODE_MISMATCH = "node_mismatch"  # a GPU of another node
    OVER_CAPACITY = "over_capacity"  # more than the GPU has left
    RECORD_CHANGED = "record_changed"  # the allocation record changed after it was counted


RefusalSink = Callable[[Allocation, Distrust, str], None]


class Resized(StrEnum):
    """What a resize did (a metric label)."""

    RESIZED = "resized"  # as asked
    CLAMPED = "clamped"  # a scale-up cut to the room its GPUs had left
    REFUSED = "refused"  # nothing moved


@dataclass(frozen=True)
class ResizeOutcome:
    outcome: Resized
    before: Allocation | None
    after: Allocation | None  # the allocation counted now (== before when refused)
    room_tflops: Fraction  # per GPU, the least any of its GPUs had for it (its own share included)
    room_vram: int
    message: str
    touched: frozenset[str] = frozenset()  # nodes whose usage changed


@dataclass(frozen=True)
class _GPU:
    node: str
    capacity_tflops: int
    capacity_vram: int


class Ledger:
    def __init__(self, on_refused: RefusalSink | None = None) -> None:
        self.on_refused = on_refused
        self._trusted: set[str] = set()  # bound allocations that match this ledger's own reservation
        self._refused: dict[str, tuple[Allocation, Distrust]] = {}
        self._reported: dict[str, set[tuple[Distrust, str]]] = {}
        self._admitted: dict[str, int] = {}  # untrusted bound allocations: admission order
        self._admissions = 0
        self._bound: dict[str, Allocation] = {}
        self._reserved: dict[str, Allocation] = {}
        self._effective: dict[str, Allocation] = {}
        self._holders: dict[str, set[str]] = {}
        self._gpus: dict[str, _GPU] = {}
        self._usage: dict[str, Usage] = {}
        self._pods_per_node: Counter[str] = Counter()
        self._by_node: dict[str, set[str]] = {}
        # what resized pods held before: their record may still show it until the patch is watched
        self._resized_from: dict[str, set[tuple[str, tuple[str, ...], str]]] = {}

    def copy(self) -> Ledger:
        """An independent copy that reports no refusal (for what-if planning)."""
        other = Ledger()
        other._trusted = set(self._trusted)
        other._refused = dict(self._refused)
        other._reported = {uid: set(seen) for uid, seen in self._reported.items()}
        other._admitted = dict(self._admitted)
        other._admissions = self._admissions
        other._bound = dict(self._bound)
        other._reserved = dict(self._reserved)
        other._effective = dict(self._effective)
        other._holders = {gpu: set(uids) for gpu, uids in self._holders.items()}
        other._gpus = dict(self._gpus)
        other._usage = dict(self._usage)
        other._pods_per_node = Counter(self._pods_per_node)
        other._by_node = {node: set(uids) for node, uids in self._by_node.items()}
        other._resized_from = {uid: set(seen) for uid, seen in self._resized_from.items()}
        return other

    # --- GPUs -------------------------------------------------------------------------------------

    def set_gpu(self, name: str, node: str, capacity_tflops: int, capacity_vram: int) -> set[str]:
        """Record a GPU's node and capacity; returns the nodes whose usage changed."""
        old = self._gpus.get(name)
        new = _GPU(node, capacity_tflops, capacity_vram)
        if old == new:
            return set()
        self._gpus[name] = new
        self._recompute(name)
        touched = {node} | ({old.node} if old else set())
        touched |= self._enforce(name)
        return touched | self._retry_refused()

    def remove_gpu(self, name: str) -> set[str]:
        old = self._gpus.pop(name, None)
        self._usage.pop(name, None)
        return {old.node} if old else set()

    # --- allocations ------------------------------------------------------------------------------

    def bind(self, allocation: Allocation) -> set[str]:
        """A watched pod shows this allocation; it replaces any reservation of the same pod when it is the
        one reserved (then with the amounts reserved), else it counts only if it fits (see the module)."""
        uid = allocation.uid
        current = self._bound.get(uid)
        if current is not None:
            if _holding(current) != _holding(allocation):
                if _holding(allocation) in self._resized_from.get(uid, ()):
                    return set()  # a record from before this ledger's resize, the patch not yet seen
                self._report(allocation, Distrust.RECORD_CHANGED,
                             f"pod {allocation.pod_key} changed its allocation record after the bind; "
                             f"still counting {_describe(current)}")
            return set()
        reserved = self._reserved.get(uid)
        if reserved is not None and (reserved.node, reserved.gpu_ids) == (
                allocation.node, allocation.gpu_ids):
            self._trusted.add(uid)
            self._refused.pop(uid, None)
            # the amounts this ledger granted, whatever the record says
            if allocation.request != reserved.request:
                allocation = replace(allocation, request=reserved.request)
            self._bound[uid] = allocation
            del self._reserved[uid]
            return self._settle(uid)
        problem = self._problem(allocation)
        if problem is not None:
            self._refuse(allocation, *problem)
            return set()
        self._refused.pop(uid, None)
        self._admissions += 1
        self._admitted[uid] = self._admissions
        self._bound[uid] = allocation
        self._reserved.pop(uid, None)
        return self._settle(uid)

    def record_lost(self, allocation: Allocation) -> None:
        """The pod of this counted allocation no longer shows a readable record; it keeps counting."""
        self._report(allocation, Distrust.RECORD_CHANGED,
                     f"pod {allocation.pod_key} removed or broke its allocation record after the bind; "
                     f"still counting {_describe(allocation)}")

    def forget(self, uid: str) -> set[str]:
        """The pod is gone or finished: neither its allocation nor its reservation holds anything."""
        self._bound.pop(uid, None)
        self._reserved.pop(uid, None)
        self._refused.pop(uid, None)
        self._reported.pop(uid, None)
        self._trusted.discard(uid)
        self._admitted.pop(uid, None)
        self._resized_from.pop(uid, None)
        return self._settle(uid) | self._retry_refused()

    def unbind(self, uid: str) -> set[str]:
        """The pod no longer shows an allocation; a reservation of it (bind in flight) still counts."""
        self._bound.pop(uid, None)
        self._refused.pop(uid, None)
        self._trusted.discard(uid)
        self._admitted.pop(uid, None)
        return self._settle(uid) | self._retry_refused()

    def reserve(self, allocation: Allocation) -> set[str]:
        self._reserved[allocation.uid] = allocation
        return self._settle(allocation.uid)

    def release(self, allocation: Allocation) -> set[str]:
        """Drop the reservation if it is still this one (idempotent)."""
        if self._reserved.get(allocation.uid) != allocation:
            return set()
        del self._reserved[allocation.uid]
        return self._settle(allocation.uid) | self._retry_refused()

    def resize(self, uid: str, tflops: Fraction | None, vram: int | None) -> ResizeOutcome:
        """Change what a bound pod takes from each of its GPUs, in place: ``tflops`` (TFLOPS per GPU) and
        ``vram`` (bytes per GPU), None for a resource that does not move. A scale-up takes at most the room
        each of its GPUs has left (its own share counted as room); a scale-down always fits. Nothing else
        moves and nothing is evicted. The watched pod's record, once patched to the same figures, is
        believed as this ledger's own (it matches what is counted)."""
        current = self._bound.get(uid)
        if current is None:
            return ResizeOutcome(Resized.REFUSED, None, None, Fraction(0), 0,
                                 "the pod holds no counted GPU allocation")
        request = current.request
        if request.takes_whole_gpu or request.uses_percent:
            return ResizeOutcome(Resized.REFUSED, current, current, Fraction(0), 0,
                                 "the pod holds its GPUs whole or by percent; only TFLOPS and VRAM shares "
                                 "are resized")
        room_nano, room_vram = self._room(current)
        old_tflops = request.tflops_request or Fraction(0)
        new_tflops = old_tflops if tflops is None else max(tflops, Fraction(0))
        new_vram = request.vram_request if vram is None else max(vram, 0)
        clamped = []
        if new_tflops > old_tflops and nano_tflops_floor(new_tflops) > room_nano:
            new_tflops = max(old_tflops, tflops_of(room_nano))
            clamped.append("TFLOPS")
        if new_vram > request.vram_request and new_vram > room_vram:
            new_vram = max(request.vram_request, room_vram)
            clamped.append("VRAM")
        room = f"{format_tflops(tflops_of(room_nano))} TFLOPS and {format_bytes(room_vram)} VRAM per GPU"
        if new_tflops == old_tflops and new_vram == request.vram_request:
            why = "its GPUs have no room for more" if clamped else "nothing to change"
            return ResizeOutcome(Resized.REFUSED, current, current, tflops_of(room_nano), room_vram,
                                 f"{why} ({room} for it)")
        resized = replace(current, request=request.model_copy(update={"tflops_request": new_tflops,
                                                                       "vram_request": new_vram}))
        self._bound[uid] = resized
        self._resized_from.setdefault(uid, set()).add(_holding(current))
        touched = self._settle(uid) | self._retry_refused()
        outcome = Resized.CLAMPED if clamped else Resized.RESIZED
        message = (f"{format_tflops(old_tflops)} -> {format_tflops(new_tflops)} TFLOPS, "
                   f"{format_bytes(request.vram_request)} -> {format_bytes(new_vram)} VRAM per GPU")
        if clamped:
            message += f"; {' and '.join(clamped)} clamped to the room left ({room} for it)"
        return ResizeOutcome(outcome, current, resized, tflops_of(room_nano), room_vram, message,
                             frozenset(touched))

    def _room(self, allocation: Allocation) -> tuple[int, int]:
        """The least room (nano-TFLOPS, bytes) any of the allocation's known GPUs has for it, its own
        share included."""
        room_nano: int | None = None
        room_vram: int | None = None
        for gpu in allocation.gpu_ids:
            info = self._gpus.get(gpu)
            if info is None:
                continue
            used = self._usage.get(gpu, _ZERO)
            mine = self.share(allocation, gpu) if self._effective.get(allocation.uid) == allocation else _ZERO
            t = info.capacity_tflops - used.tflops + mine.tflops
            v = info.capacity_vram - used.vram + mine.vram
            room_nano = t if room_nano is None else min(room_nano, t)
            room_vram = v if room_vram is None else min(room_vram, v)
        return max(room_nano or 0, 0), max(room_vram or 0, 0)

    # --- queries ----------------------------------------------------------------------------------

    def usage(self, gpu: str) -> Usage:
        return self._usage.get(gpu, _ZERO)

    def capacity(self, gpu: str) -> tuple[int, int] | None:
        """A known GPU's capacity: nano-TFLOPS and VRAM bytes."""
        info = self._gpus.get(gpu)
        return (info.capacity_tflops, info.capacity_vram) if info is not None else None

    def pods_on(self, node: str) -> int:
        return self._pods_per_node[node]

    def allocation(self, uid: str) -> Allocation | None:
        return self._effective.get(uid)

    def reservation(self, uid: str) -> Allocation | None:
        return self._reserved.get(uid)

    def bound(self, uid: str) -> Allocation | None:
        return self._bound.get(uid)

    def refused(self) -> list[tuple[Allocation, Distrust]]:
        """Allocations pods claim that the ledger does not count, by pod uid."""
        return [self._refused[uid] for uid in sorted(self._refused)]

    def trusted(self, uid: str) -> bool:
        """Whether the pod's counted allocation is one this ledger reserved itself."""
        return uid in self._trusted

    def allocations_on(self, node: str) -> list[Allocation]:
        return [self._effective[uid] for uid in sorted(self._by_node.get(node, ()))]

    def holder_count(self, gpu: str) -> int:
        """How many allocations hold the GPU, of any size (a request of nothing holds it too)."""
        return len(self._holders.get(gpu, ()))

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

    # --- distrust ---------------------------------------------------------------------------------

    def _problem(self, allocation: Allocation) -> tuple[Distrust, str] | None:
        """Why an allocation this ledger did not grant cannot be counted now (None: it can)."""
        own = self._effective.get(allocation.uid)
        for gpu in allocation.gpu_ids:
            info = self._gpus.get(gpu)
            if info is None:
                continue  # checked when the GPU becomes known
            if info.node != allocation.node:
                return Distrust.NODE_MISMATCH, (
                    f"pod {allocation.pod_key} on node {allocation.node} names GPU {gpu}, which is on node "
                    f"{info.node}; not counted")
            used = self._usage.get(gpu, _ZERO)
            if own is not None and gpu in own.gpu_ids:  # its own reservation is replaced, not added to
                mine = self.share(own, gpu)
                used = Usage(used.tflops - mine.tflops, used.vram - mine.vram, used.whole - mine.whole)
            share = self.share(allocation, gpu)
            others = len(self._holders.get(gpu, set()) - {allocation.uid})
            if (used.tflops + share.tflops > info.capacity_tflops
                    or used.vram + share.vram > info.capacity_vram or (share.whole and others) or used.whole):
                return Distrust.OVER_CAPACITY, (
                    f"pod {allocation.pod_key} claims {_amount(share)} of GPU {gpu}, which has "
                    f"{_amount(Usage(info.capacity_tflops - used.tflops, info.capacity_vram - used.vram))} "
                    f"left{' and is held whole' if used.whole else ''}; not counted")
        return None

    def _refuse(self, allocation: Allocation, reason: Distrust, message: str) -> None:
        self._refused[allocation.uid] = (allocation, reason)
        self._report(allocation, reason, message)

    def _report(self, allocation: Allocation, reason: Distrust, message: str) -> None:
        seen = self._reported.setdefault(allocation.uid, set())
        if (reason, message) in seen:
            return  # once per pod and finding, not on every watch event
        seen.add((reason, message))
        if self.on_refused is not None:
            self.on_refused(allocation, reason, message)

    def _retry_refused(self) -> set[str]:
        """Capacity was freed: count the refused allocations that fit now (in the order they were read)."""
        touched: set[str] = set()
        for uid in list(self._refused):
            allocation, _ = self._refused[uid]
            if self._problem(allocation) is None:
                del self._refused[uid]
                touched |= self.bind(allocation)
        return touched

    def _enforce(self, gpu: str) -> set[str]:
        """After a GPU's node or capacity changed: refuse its untrusted holders that do not fit, the latest
        admitted first, until the rest fits."""
        info = self._gpus[gpu]
        touched: set[str] = set()
        suspects = sorted((uid for uid in self._holders.get(gpu, ()) if uid in self._admitted),
                          key=self._admitted.__getitem__, reverse=True)
        for uid in suspects:
            used = self._usage.get(gpu, _ZERO)
            allocation = self._bound[uid]
            over = (used.tflops > info.capacity_tflops or used.vram > info.capacity_vram
                    or (used.whole and len(self._holders.get(gpu, ())) > 1))
            if allocation.node == info.node and not over:
                continue
            del self._bound[uid]
            del self._admitted[uid]
            touched |= self._settle(uid)
            problem = self._problem(allocation) or (Distrust.OVER_CAPACITY, f"pod {allocation.pod_key} "
                                                    f"does not fit GPU {gpu}; not counted")
            self._refuse(allocation, *problem)
        return touched

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


def _amount(usage: Usage) -> str:
    tflops = format_tflops(tflops_of(max(usage.tflops, 0)))
    return f"{tflops} TFLOPS and {format_bytes(max(usage.vram, 0))} VRAM"


def _holding(allocation: Allocation) -> tuple[str, tuple[str, ...], str]:
    """What an allocation holds: node, GPUs and the share of each (pool, limits, QoS do not count)."""
    return allocation.node, allocation.gpu_ids, format_allocated(allocation.request)


def _describe(allocation: Allocation) -> str:
    return f"GPUs {','.join(allocation.gpu_ids)} on node {allocation.node}"

"""Free capacity as columns (numpy): the fit check of one request against every GPU at once.

The cluster state judges a node for a request shape once and caches the verdict; a shape never seen
before (the cold path) has to judge every node. Per node in Python that costs ~80 us (its slots, then
the fit check of each GPU): 400 ms at 5,000 nodes. Here every GPU is one row of a few integer arrays,
and "which nodes have enough GPUs that fit right now" is a handful of vector operations and one
``bincount`` over all rows, a few milliseconds for 40,000 GPUs. Only the nodes that do not fit go on
to the per-node check, which words the reason.

Rows are refreshed lazily: the state marks a node dirty on every change (the same changes that
invalidate its cached verdicts) and the columns rewrite that node's rows before the next vector check.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat

import numpy as np
import numpy.typing as npt

from extender.common.contract import GPURequest
from extender.scheduling.placement import Demand, Slot

_INT = np.int64
_LIMIT = 2**62  # products beyond this fall back to the exact per-node check


class GPUColumns:
    def __init__(self, slots_of: Callable[[str], Sequence[Slot]], pods_on: Callable[[str], int]) -> None:
        self._slots_of = slots_of
        self._pods_on = pods_on
        self._node_ids: dict[str, int] = {}
        self._rows: dict[str, list[int]] = {}  # node -> its rows
        self._free: list[int] = []
        self._dirty: set[str] = set()
        self._codes: dict[str, int] = {}  # pool, model and vendor strings -> small integers
        self._size = 0
        empty = np.zeros(0, dtype=_INT)
        self.node = self.cap_t = self.cap_v = self.used_t = self.used_v = self.whole = self.holders = empty
        self.pool = self.model = self.vendor = self.index = self.ok = empty
        self._alloc(1024)
        self._pods = np.zeros(256, dtype=_INT)

    def copy(self, slots_of: Callable[[str], Sequence[Slot]], pods_on: Callable[[str], int]) -> GPUColumns:
        """An independent copy reading another picture (a what-if copy of the one this reads)."""
        other = GPUColumns.__new__(GPUColumns)
        other.__dict__.update(self.__dict__)
        other._slots_of, other._pods_on = slots_of, pods_on
        other._node_ids, other._codes = dict(self._node_ids), dict(self._codes)
        other._rows = {node: list(rows) for node, rows in self._rows.items()}
        other._free, other._dirty = list(self._free), set(self._dirty)
        for name in ("node", "cap_t", "cap_v", "used_t", "used_v", "whole", "holders", "pool", "model",
                     "vendor", "index", "ok", "_pods"):
            setattr(other, name, getattr(self, name).copy())
        return other

    def _alloc(self, size: int) -> None:
        def grow(old: npt.NDArray[np.int64], fill: int) -> npt.NDArray[np.int64]:
            new = np.full(size, fill, dtype=_INT)
            new[: len(old)] = old
            return new

        self.node = grow(self.node, -1)  # -1: a free row
        self.cap_t, self.cap_v = grow(self.cap_t, 0), grow(self.cap_v, 0)
        self.used_t, self.used_v, self.whole = grow(self.used_t, 0), grow(self.used_v, 0), grow(self.whole, 0)
        self.holders = grow(self.holders, 0)
        self.pool, self.model, self.vendor = grow(self.pool, -1), grow(self.model, -1), grow(self.vendor, -1)
        self.index, self.ok = grow(self.index, -1), grow(self.ok, 0)  # ok: schedulable
        self._free.extend(range(size - 1, self._size - 1, -1))
        self._size = size

    def _code(self, value: str | None) -> int:
        if value is None:
            return -1
        code = self._codes.get(value)
        if code is None:
            code = self._codes[value] = len(self._codes)
        return code

    def mark_node(self, node: str) -> None:
        self._dirty.add(node)

    def _node_id(self, node: str) -> int:
        nid = self._node_ids.get(node)
        if nid is None:
            nid = self._node_ids[node] = len(self._node_ids)
            if nid >= len(self._pods):
                pods = np.zeros(2 * len(self._pods), dtype=_INT)
                pods[: len(self._pods)] = self._pods
                self._pods = pods
        return nid

    def _flush(self) -> None:
        for node in self._dirty:
            slots = self._slots_of(node)
            rows = self._rows.pop(node, [])
            for row in rows[len(slots):]:
                self.node[row] = -1
                self._free.append(row)
            rows = rows[: len(slots)]
            while len(rows) < len(slots):
                if not self._free:
                    self._alloc(2 * self._size)
                rows.append(self._free.pop())
            nid = self._node_id(node)
            self._pods[nid] = self._pods_on(node)
            if not rows:
                continue
            self._rows[node] = rows
            devices = [s.device for s in slots]
            self.node[rows] = nid
            self.cap_t[rows] = [d.capacity_tflops for d in devices]
            self.cap_v[rows] = [d.capacity_vram for d in devices]
            self.used_t[rows] = [s.used_tflops for s in slots]
            self.used_v[rows] = [s.used_vram for s in slots]
            self.whole[rows] = [s.whole_holders for s in slots]
            self.holders[rows] = [s.holders for s in slots]
            self.pool[rows] = [self._code(d.pool) for d in devices]
            self.model[rows] = [self._code(d.model) for d in devices]
            self.vendor[rows] = [self._code(d.vendor) for d in devices]
            self.index[rows] = [-1 if d.index is None else d.index for d in devices]
            self.ok[rows] = [1 if d.schedulable else 0 for d in devices]
        self._dirty.clear()

    def fitting_nodes(self, names: Sequence[str], request: GPURequest, demand: Demand,
                      max_pods: int) -> list[bool] | None:
        """For each name: whether the node has ``gpu_count`` GPUs that fit now and room for a pod.
        False can also mean "not known here": the caller judges those nodes itself. None when the
        numbers are too large for exact integer vectors."""
        self._flush()
        n = len(self._node_ids)
        counts = np.zeros(n + 1, dtype=_INT)  # the extra last entry stands for unknown names
        pool = -1 if request.pool is None else self._codes.get(request.pool)  # devices without a pool: -1
        if pool is not None:
            mask = self._matching(request, pool)
            if demand.whole:
                mask &= (self.used_t == 0) & (self.used_v == 0) & (self.whole == 0) & (self.holders == 0)
            else:
                need_t = self._need_t(demand)
                if need_t is None:
                    return None
                mask &= (self.whole == 0) & (self.cap_t - self.used_t >= need_t)
                mask &= self.cap_v - self.used_v >= demand.vram
            counts[:n] = np.bincount(self.node[mask], minlength=n)[:n]
            counts[:n][self._pods[:n] >= max_pods] = 0
        ids = np.fromiter(map(self._node_ids.get, names, repeat(n)), dtype=_INT, count=len(names))
        return (counts[ids] >= request.gpu_count).tolist()  # type: ignore[no-any-return]

    def _matching(self, request: GPURequest, pool: int) -> npt.NDArray[np.bool_]:
        mask: npt.NDArray[np.bool_] = (self.pool == pool) & (self.ok == 1) & (self.node >= 0)
        for value, column in ((request.gpu_model, self.model), (request.vendor, self.vendor)):
            if value is not None:
                code = self._codes.get(value)
                if code is None:
                    return np.zeros_like(mask)
                mask &= column == code
        if request.gpu_indices:
            mask &= np.isin(self.index, np.array(request.gpu_indices, dtype=_INT))
        return mask

    def _need_t(self, demand: Demand) -> npt.NDArray[np.int64] | int | None:
        if not demand.percent_den:
            return demand.tflops
        largest = int(self.cap_t.max(initial=0))
        if demand.percent_num * largest >= _LIMIT:
            return None
        # ceil(num * cap / den), as Demand.need rounds
        return -((-demand.percent_num * self.cap_t) // demand.percent_den)

"""A pool's capacity picture and the gap its targets leave (TensorFusion's rules).

Minimum gap = min - (total + pending), in either dimension. Warm gap, only when there is no minimum
gap, = warm - (available + pending). Pods of the pool that fail only for lack of capacity add a demand
gap = their request - pending (they fit nowhere in the available capacity by definition). Launches
never take total + pending past max.
"""

from __future__ import annotations

from dataclasses import dataclass

from extender.planning.amounts import UNLIMITED, ZERO, Amount
from extender.planning.pool import PoolConfig


@dataclass(frozen=True)
class PoolCapacity:
    total: Amount  # capacity of the pool's registered GPUs
    available: Amount  # total minus what is allocated
    pending: Amount  # what the pool's not-yet-Bound claims will bring


@dataclass(frozen=True)
class Gap:
    amount: Amount
    kind: str  # "min", "warm", "demand", "warm+demand" or "" (no gap)
    reason: str

    @property
    def is_zero(self) -> bool:
        return self.amount.is_zero


def _larger(a: Amount, b: Amount) -> Amount:
    return Amount(max(a.tflops, b.tflops), max(a.vram, b.vram))


def gap(config: PoolConfig, capacity: PoolCapacity, demand: Amount = ZERO) -> Gap:
    figures = (f"total {capacity.total.describe()}, available {capacity.available.describe()}, "
               f"pending {capacity.pending.describe()}")
    if config.min is not None:
        need = (config.min - (capacity.total + capacity.pending)).positive()
        if not need.is_zero:
            return Gap(need, "min", f"below minResources ({config.min.describe()}): {figures}")
    warm = ((config.warm - (capacity.available + capacity.pending)).positive()
            if config.warm is not None else ZERO)
    wanted = (demand - capacity.pending).positive()
    amount = _larger(warm, wanted)
    if amount.is_zero:
        return Gap(amount, "", f"targets hold: {figures}")
    kinds = [k for k, part in (("warm", warm), ("demand", wanted)) if not part.is_zero]
    parts = []
    if "warm" in kinds and config.warm is not None:
        parts.append(f"below warmResources ({config.warm.describe()})")
    if "demand" in kinds:
        parts.append(f"pending pods need {demand.describe()}")
    return Gap(amount, "+".join(kinds), f"{' and '.join(parts)}: {figures}")


def room(config: PoolConfig, capacity: PoolCapacity) -> Amount | None:
    """How much may still be launched under maxResources (None: no cap)."""
    if config.max is None:
        return None
    cap = config.max
    left = (cap - (capacity.total + capacity.pending)).positive()
    return Amount(left.tflops if cap.tflops < UNLIMITED.tflops else UNLIMITED.tflops,
                  left.vram if cap.vram < UNLIMITED.vram else UNLIMITED.vram)

"""GPU capacity as a pair (TFLOPS, VRAM bytes), exact, and its parsing from ``{tflops, vram}`` maps."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from extender.common.numbers import shown
from extender.common.quantity import Format, QuantityError, format_quantity, parse_quantity


class CapacityError(ValueError):
    """A capacity setting is malformed; the message names the field and the value."""


@dataclass(frozen=True)
class Amount:
    tflops: Fraction = Fraction(0)
    vram: int = 0

    def __add__(self, other: Amount) -> Amount:
        return Amount(self.tflops + other.tflops, self.vram + other.vram)

    def __sub__(self, other: Amount) -> Amount:
        return Amount(self.tflops - other.tflops, self.vram - other.vram)

    def times(self, n: int) -> Amount:
        return Amount(self.tflops * n, self.vram * n)

    def covers(self, other: Amount) -> bool:
        """At least ``other`` in both dimensions."""
        return self.tflops >= other.tflops and self.vram >= other.vram

    def positive(self) -> Amount:
        """Negative dimensions clamped to zero (a gap has no negative part)."""
        return Amount(max(self.tflops, Fraction(0)), max(self.vram, 0))

    @property
    def is_zero(self) -> bool:
        return self.tflops <= 0 and self.vram <= 0

    def units_to_cover(self, gap: Amount) -> int:
        """How many of ``self`` cover ``gap``: max(ceil(tflops gap / tflops), ceil(vram gap / vram))."""
        need = 0
        if gap.tflops > 0:
            if self.tflops <= 0:
                raise ValueError("no TFLOPS to cover a TFLOPS gap")
            need = max(need, math.ceil(gap.tflops / self.tflops))
        if gap.vram > 0:
            if self.vram <= 0:
                raise ValueError("no VRAM to cover a VRAM gap")
            need = max(need, -(-gap.vram // self.vram))
        return need

    def units_within(self, room: Amount) -> int:
        """How many of ``self`` fit in ``room`` in both dimensions."""
        counts = []
        if self.tflops > 0:
            counts.append(math.floor(room.tflops / self.tflops))
        if self.vram > 0:
            counts.append(room.vram // self.vram)
        return max(0, min(counts)) if counts else 0

    def describe(self) -> str:
        return (f"{format_quantity(self.tflops, Format.DECIMAL_SI)} TFLOPS, "
                f"{format_quantity(Fraction(self.vram), Format.BINARY_SI)} VRAM")

    def as_json(self) -> dict[str, str]:
        return {"tflops": format_quantity(self.tflops, Format.DECIMAL_SI),
                "vram": format_quantity(Fraction(self.vram), Format.BINARY_SI)}


ZERO = Amount()
UNLIMITED = Amount(Fraction(10**15), 1 << 80)  # stands for a dimension without a cap


def parse_quantity_field(raw: object, field: str) -> Fraction:
    if isinstance(raw, bool) or raw is None:
        raise CapacityError(f"{field}={shown(raw)}: not a quantity")
    if isinstance(raw, int | float):
        raw = str(raw)
    try:
        value = parse_quantity(str(raw)).value
    except QuantityError as exc:
        raise CapacityError(f"{field}={shown(raw)}: not a Kubernetes quantity") from exc
    if value < 0:
        raise CapacityError(f"{field}={shown(raw)}: must not be negative")
    return value


def parse_amount(raw: Any, field: str) -> Amount | None:
    """``{tflops, vram}`` as an Amount; None when the map is absent or names neither; a missing
    dimension counts as zero."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise CapacityError(f"{field}={shown(raw)}: expected a map with tflops and vram")
    if raw.get("tflops") is None and raw.get("vram") is None:
        return None
    tflops = parse_quantity_field(raw["tflops"], f"{field}.tflops") if raw.get("tflops") is not None \
        else Fraction(0)
    vram = parse_quantity_field(raw["vram"], f"{field}.vram") if raw.get("vram") is not None else Fraction(0)
    return Amount(tflops, math.floor(vram))

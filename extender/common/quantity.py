"""Kubernetes resource quantities: parsing and the canonical string form.

Values are kept as exact ``Fraction`` objects so that sums of many small
shares never drift; the canonical form follows the API server's rules
(``16384Mi`` -> ``16Gi``, ``1.5`` -> ``1500m``, ``1000`` -> ``1k``).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity."""


class Format(Enum):
    BINARY_SI = "BinarySI"
    DECIMAL_SI = "DecimalSI"
    DECIMAL_EXPONENT = "DecimalExponent"


_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_BY_EXPONENT = {exp: suffix for suffix, exp in _DECIMAL_SUFFIXES.items()}
_BINARY_BY_SHIFT = {shift: suffix for suffix, shift in _BINARY_SUFFIXES.items()}

_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+|[numkMGTPE]?)$"
)

# The API server keeps nano precision; anything finer is rounded up.
_NANO = Fraction(1, 10**9)


@dataclass(frozen=True)
class Quantity:
    value: Fraction
    format: Format

    def canonical(self) -> str:
        return format_quantity(self.value, self.format)


# Pods repeat the same few quantity strings; Fraction arithmetic is the costly part of admission.
@functools.lru_cache(maxsize=4096)
def parse_quantity(text: str) -> Quantity:
    """Parse ``text`` as a Kubernetes quantity, raising ``QuantityError`` when it is not one."""
    match = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
    if match is None or len(text) > 64:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity")
    number = Fraction(match["number"])
    if match["sign"] == "-":
        number = -number
    suffix = match["suffix"]
    if suffix in _BINARY_SUFFIXES:
        return Quantity(_round_up_to_nano(number * 2 ** _BINARY_SUFFIXES[suffix]), Format.BINARY_SI)
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        exponent = int(suffix[1:])
        if abs(exponent) > 60:
            raise QuantityError(f"{text!r} is out of range")
        return Quantity(_round_up_to_nano(number * Fraction(10) ** exponent), Format.DECIMAL_EXPONENT)
    return Quantity(_round_up_to_nano(number * Fraction(10) ** _DECIMAL_SUFFIXES[suffix]), Format.DECIMAL_SI)


def canonical_quantity(text: str) -> str:
    return parse_quantity(text).canonical()


@functools.lru_cache(maxsize=4096)
def format_quantity(value: Fraction | int, fmt: Format = Format.DECIMAL_SI) -> str:
    """Render ``value`` the way the API server would store it."""
    value = _round_up_to_nano(Fraction(value))
    if value == 0:
        return "0"
    if fmt is Format.BINARY_SI and (abs(value) < 1024 or value.denominator != 1):
        fmt = Format.DECIMAL_SI
    if fmt is Format.BINARY_SI:
        return _format_binary(int(value))
    return _format_decimal(value, exponent_style=fmt is Format.DECIMAL_EXPONENT)


def _round_up_to_nano(value: Fraction) -> Fraction:
    if (value / _NANO).denominator == 1:
        return value
    return Fraction(math.ceil(value / _NANO)) * _NANO


def _format_binary(value: int) -> str:
    sign = "-" if value < 0 else ""
    magnitude = abs(value)
    shift = 0
    while shift < 60 and magnitude % 1024 == 0:
        magnitude //= 1024
        shift += 10
    return f"{sign}{magnitude}{_BINARY_BY_SHIFT.get(shift, '')}"


def _format_decimal(value: Fraction, *, exponent_style: bool) -> str:
    sign = "-" if value < 0 else ""
    scaled = abs(value) * 10**9  # an integer after nano rounding
    mantissa = int(scaled)
    exponent = -9
    while exponent < 18 and mantissa % 1000 == 0:
        mantissa //= 1000
        exponent += 3
    if exponent_style:
        return f"{sign}{mantissa}" + (f"e{exponent}" if exponent else "")
    return f"{sign}{mantissa}{_DECIMAL_BY_EXPONENT[exponent]}"
